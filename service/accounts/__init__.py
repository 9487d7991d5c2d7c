"""Who is calling and what they may do: API keys and tenants (`auth.py`), per-tenant quotas
(`quotas.py`) and request rate limits (`ratelimit.py`), and idempotent creates (`idempotency.py`)."""
