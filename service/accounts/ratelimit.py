"""Per-tenant request rate limits: one token bucket per tenant in each replica.

Each authenticated request takes a token from its tenant's bucket, which refills at
`EFT_REQUESTS_PER_S_PER_TENANT` and holds at most `EFT_REQUEST_BURST_PER_TENANT`; an empty
bucket answers 429 with `Retry-After`, so a tenant that floods the API slows only itself. The
buckets live in the replica (no shared state, nothing on the request path but a lock and
arithmetic); with N replicas behind Serve's proxy a tenant gets up to N times the rate.
"""

from __future__ import annotations

import math
import threading
import time

from eft.service.errors import ServiceError


class RateLimited(ServiceError):
    status_code = 429
    type = "rate_limit_error"
    code = "rate_limited"

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message, param=None)
        self.headers = {"Retry-After": str(max(1, math.ceil(retry_after_s)))}


class TenantRateLimiter:
    def __init__(self, rate_per_s: float, burst: int):
        self.rate, self.burst = rate_per_s, burst
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, last refill)
        self._lock = threading.Lock()

    def take(self, tenant: str) -> None:
        """Spend one request of `tenant`'s budget; raises RateLimited when there is none."""
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(tenant, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - last) * self.rate)
            if tokens < 1.0:
                self._buckets[tenant] = (tokens, now)
                wait = (1.0 - tokens) / self.rate
                raise RateLimited(f"tenant {tenant!r} is over {self.rate:g} requests/s (burst {self.burst}): "
                                  f"retry after {wait:.1f}s, or ask the operator to raise "
                                  "EFT_REQUESTS_PER_S_PER_TENANT", wait)
            self._buckets[tenant] = (tokens - 1.0, now)


class TenantSlots:
    """At most `per_tenant` pieces of work in flight per tenant in this replica, one more a 429
    before the work starts: `take` one, `give_back` it however the work ends."""

    def __init__(self, per_tenant: int, retry_after_s: float = 2.0):
        self.per_tenant, self.retry_after_s = per_tenant, retry_after_s
        self.open: dict[str, int] = {}

    def take(self, tenant: str, refusal: str) -> None:
        """Counts one more against `tenant`, or raises RateLimited saying `refusal` when it holds
        its share."""
        if self.open.get(tenant, 0) >= self.per_tenant:
            raise RateLimited(refusal, self.retry_after_s)
        self.open[tenant] = self.open.get(tenant, 0) + 1

    def give_back(self, tenant: str) -> None:
        self.open[tenant] -= 1
        if not self.open[tenant]:
            del self.open[tenant]


class TenantTokenBudget:
    """Completion tokens per tenant per minute in this replica: a request is charged the most it
    may generate (`max_tokens` x `n`) before it starts, and refunded what it did not generate
    when it ends, so that one tenant's long completions cannot take the model servers from the
    others. A bucket holds at most a minute's tokens; a request larger than that waits for a full
    bucket. An empty bucket answers 429 with `Retry-After`."""

    def __init__(self, per_minute: int):
        self.rate, self.capacity = per_minute / 60.0, float(per_minute)
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, last refill)
        self._lock = threading.Lock()

    def _level(self, tenant: str, now: float) -> float:
        tokens, last = self._buckets.get(tenant, (self.capacity, now))
        return min(self.capacity, tokens + (now - last) * self.rate)

    def charge(self, tenant: str, tokens: int) -> int:
        """Take `tokens` (at most a minute's) from `tenant`'s bucket; returns what was taken.
        Raises RateLimited when the bucket holds less."""
        if self.capacity <= 0:
            return 0
        amount = float(min(tokens, self.capacity))
        now = time.monotonic()
        with self._lock:
            level = self._level(tenant, now)
            if level < amount:
                self._buckets[tenant] = (level, now)
                wait = (amount - level) / self.rate
                raise RateLimited(f"tenant {tenant!r} is over its {self.capacity:.0f} completion tokens per minute "
                                  f"(this request may generate {tokens}): retry after {wait:.1f}s, ask for fewer "
                                  "max_tokens, or ask the operator to raise EFT_GENERATION_TOKENS_PER_MINUTE", wait)
            self._buckets[tenant] = (level - amount, now)
        return int(amount)

    def refund(self, tenant: str, tokens: int) -> None:
        """Give back `tokens` of a charge the request did not generate."""
        if tokens <= 0 or self.capacity <= 0:
            return
        now = time.monotonic()
        with self._lock:
            self._buckets[tenant] = (min(self.capacity, self._level(tenant, now) + tokens), now)
