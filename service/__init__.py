"""The service behind the HTTP surface: settings, the job store and its lifecycle, checking and
planning requests, quotas and keys, the scheduler, the Ray Jobs launcher and each attempt's
entrypoint, webhooks, exports and the model servers' engine."""
