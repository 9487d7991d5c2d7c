"""The service: settings, job store, lifecycle, scheduler, Ray Jobs launcher, Serve deployment."""
