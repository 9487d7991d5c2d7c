"""The HTTP surface. `api.models` is light (pydantic only) and shared with the client;
`api.app` builds the FastAPI application."""
