"""Fine-tuned model ids: OpenAI's `ft:` form, and back to the job (and checkpoint) they name."""

from __future__ import annotations

import pytest

from eft.service.serving.model_ids import ModelRef, checkpoint_model_id, fine_tuned_model_id, parse_model_id


def test_an_id_names_base_suffix_and_job_and_parses_back():
    model = fine_tuned_model_id("tiny-qwen3", "ftjob-abc123", "support-bot", "acme")
    assert model == "ft:tiny-qwen3:support-bot:ftjob-abc123"
    assert parse_model_id(model) == ModelRef("ftjob-abc123")
    ckpt = checkpoint_model_id(model, 40)
    assert ckpt == "ft:tiny-qwen3:support-bot:ftjob-abc123:ckpt-40"
    assert parse_model_id(ckpt) == ModelRef("ftjob-abc123", 40)


def test_without_a_suffix_the_tenant_names_it_and_colons_never_split_a_part():
    assert fine_tuned_model_id("Qwen/Qwen2.5-0.5B", "ftjob-1", None, "team a") == "ft:Qwen/Qwen2.5-0.5B:team-a:ftjob-1"
    model = fine_tuned_model_id("hub:model", "ftjob-2", "v1: final", "acme")
    assert model == "ft:hub-model:v1-final:ftjob-2"
    assert parse_model_id(model) == ModelRef("ftjob-2")


@pytest.mark.parametrize("value", [
    "tiny-llama", "ft:tiny-llama", "ft:base:suffix", "ftx:base:suffix:ftjob-1", "ft:base:suffix:",
    "ft:base:suffix:ftjob-1:ckpt-", "ft:base:suffix:ftjob-1:ckpt-x", "ft:base:ftjob-1:ckpt-3", "ft::ckpt-3",
])
def test_anything_else_is_not_a_fine_tuned_id(value):
    assert parse_model_id(value) is None
