"""The HTTP surface: `api.app` builds the FastAPI application from the routes in `api/routes/`,
`api.deployment` runs it on Ray Serve, `api.inference` serves the models through `/v1`, and
`api.local` and `api.cli` start a local stack (`eft up`)."""
