"""What bounds one tenant's completions: its completion tokens per minute (charged up front,
refunded when the usage is known) and the model server's KV cache (admission by the tokens a
request may reach, not by a count of requests)."""

from __future__ import annotations

import pytest

from eft.service.accounts.ratelimit import RateLimited, TenantTokenBudget


def test_a_tenant_over_its_tokens_per_minute_gets_a_429_with_retry_after_and_others_do_not():
    budget = TenantTokenBudget(per_minute=600)  # 10 tokens/s
    assert budget.charge("flood", 500) == 500
    with pytest.raises(RateLimited) as over:
        budget.charge("flood", 200)
    assert over.value.status_code == 429 and int(over.value.headers["Retry-After"]) >= 10
    assert "EFT_GENERATION_TOKENS_PER_MINUTE" in str(over.value)
    assert budget.charge("quiet", 200) == 200  # another tenant's bucket is its own


def test_what_a_completion_did_not_generate_is_refunded():
    budget = TenantTokenBudget(per_minute=600)
    budget.charge("a", 600)
    budget.refund("a", 590)  # it stopped after 10 of its 600 tokens
    assert budget.charge("a", 500) == 500


def test_a_request_larger_than_a_minute_waits_for_a_full_bucket_instead_of_never_passing():
    budget = TenantTokenBudget(per_minute=100)
    assert budget.charge("a", 5000) == 100
    with pytest.raises(RateLimited):
        budget.charge("a", 5000)


def test_no_limit_when_the_setting_is_zero():
    budget = TenantTokenBudget(per_minute=0)
    assert budget.charge("a", 10**9) == 0
    budget.refund("a", 10)


def test_kv_cache_admission():
    pytest.importorskip("torch")
    from eft.service.serving.vllm_engine import admission

    assert admission(None, 10**9, 10**9) is None  # capacity unknown: vLLM queues
    assert admission(1000, 600, 400) is None
    busy = admission(1000, 700, 400)
    assert busy["status"] == 429 and busy["code"] == "model_server_busy" and busy["retry_after_s"] >= 1
    never = admission(1000, 0, 1001)
    assert never["status"] == 400 and never["param"] == "max_tokens"
