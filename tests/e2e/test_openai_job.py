"""Journey: a job made and used through OpenAI's API: the official `openai` package drives a real
fine-tuning job through the service's `/v1` (files.create -> fine_tuning.jobs.create -> retrieve
until succeeded -> list_events -> checkpoints.list -> models -> chat, streamed -> a merged export),
and a DPO job whose end a webhook tells. Both jobs are posted with every other job of the e2e
tier at once (tests/e2e/conftest.py:journey)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from eft.service.settings import BUNDLED_ASSETS
from tests.helpers.budgets import machine_factor
from tests.helpers.service_api import ADMIN_KEY, key_for

PROMPT = [{"role": "user", "content": "What is the first word of: frog fox high king"}]


def test_the_openai_client_runs_a_fine_tuning_job(service, journey, tmp_path):
    from openai import NotFoundError, OpenAI

    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}

    client = OpenAI(base_url=f"{service['url']}/v1", api_key=ADMIN_KEY, max_retries=0, timeout=300)
    # files.create -> fine_tuning.jobs.create, as the journey posted them (payloads.submit_all).
    uploaded, lines, job = journey.openai["upload"], journey.openai["lines"], journey.openai["supervised"]
    assert uploaded.id.startswith("file-") and uploaded.purpose == "fine-tune"
    assert job.status in ("validating_files", "queued") and job.seed == 7
    assert job.user_provided_suffix == "openai-e2e" and job.metadata == {"team": "e2e"}
    assert job.id in [j.id for j in client.fine_tuning.jobs.list(limit=100).data]

    deadline = time.monotonic() + 420 * machine_factor()
    while (job := client.fine_tuning.jobs.retrieve(job.id)).status not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, f"job still {job.status}"
        time.sleep(1)
    assert job.status == "succeeded", job.error
    assert job.finished_at >= job.created_at and job.hyperparameters.batch_size == 4
    # The trained model is named by an id, OpenAI's way; where its files are is a field of ours.
    assert job.fine_tuned_model == f"ft:tiny-llama:openai-e2e:{job.id}"
    ours = httpx.get(f"{service['url']}/jobs/{job.id}", headers=headers).raise_for_status().json()
    assert ours["fine_tuned_model"] == job.fine_tuned_model
    adapter = Path(ours["artifact_path"])
    assert json.loads((adapter / "adapter_config.json").read_text())["peft_type"] == "LORA"
    # ...and its files come out through the API, each checked against the SHA-256 listed.
    from eft import Client

    with Client(base_url=service["url"], api_key=ADMIN_KEY, max_retries=0) as ours_client:
        got = ours_client.jobs.download(job.id, tmp_path / "adapter")
    assert {p.relative_to(tmp_path / "adapter") for p in got} == {
        p.relative_to(adapter) for p in adapter.rglob("*") if p.is_file()}
    assert (tmp_path / "adapter" / "adapter_model.safetensors").read_bytes() == (
        adapter / "adapter_model.safetensors").read_bytes()

    events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
    assert events and events[0].created_at >= events[-1].created_at  # newest first
    assert any("succeeded" in e.message or e.data.get("type") == "succeeded" for e in events)
    page = client.fine_tuning.jobs.list_events(job.id, limit=2)
    older = client.fine_tuning.jobs.list_events(job.id, limit=2, after=page.data[-1].id)
    assert older.data and older.data[0].id not in {e.id for e in page.data}

    checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert checkpoints and checkpoints[0].step_number == 3
    assert checkpoints[0].fine_tuning_job_id == job.id
    assert checkpoints[0].fine_tuned_model_checkpoint == f"{job.fine_tuned_model}:ckpt-3"

    # /v1/models: the base models and this tenant's trained ones; each id retrieves as itself.
    listed = {m.id: m for m in client.models.list().data}
    assert listed["tiny-llama"].owned_by == "system" and "tiny-qwen3" in listed
    assert listed[job.fine_tuned_model].owned_by == "org-default"
    assert client.models.retrieve(job.fine_tuned_model).created == job.finished_at
    assert client.models.retrieve(checkpoints[0].fine_tuned_model_checkpoint).id.endswith(":ckpt-3")
    for unknown in (f"ft:tiny-llama:other-suffix:{job.id}", f"{job.fine_tuned_model}:ckpt-99", "ft:x:y:ftjob-nope"):
        with pytest.raises(NotFoundError) as missing:
            client.models.retrieve(unknown)
        assert missing.value.body["code"] == "model_not_found" and missing.value.body["param"] == "model"
    # Another tenant neither sees nor reaches it.
    other_key = key_for(service["home"], "other-tenant")
    other = OpenAI(base_url=f"{service['url']}/v1", api_key=other_key, max_retries=0, timeout=60)
    assert job.fine_tuned_model not in {m.id for m in other.models.list().data}
    with pytest.raises(NotFoundError):
        other.models.retrieve(job.fine_tuned_model)

    # Chat with it at once, through the model servers (Ray Serve): the fine-tuned model answers
    # as plain PEFT does from its downloaded adapter, streamed or not; another tenant gets 404.
    from tests.helpers.reference import reference_reply

    prompt = json.loads(lines[0])["messages"][:1]
    started = time.monotonic()
    stream = client.chat.completions.create(model=job.fine_tuned_model, messages=prompt, max_tokens=16,
                                            temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = []
    for chunk in stream:
        chunks.append((time.monotonic() - started, chunk))
    streamed = "".join(c.choices[0].delta.content or "" for _, c in chunks if c.choices)
    first_token_s = next(t for t, c in chunks if c.choices and c.choices[0].delta.content)
    print(f"job succeeded -> first chat token: {first_token_s:.1f} s (model server started from zero)")
    whole = client.chat.completions.create(model=job.fine_tuned_model, messages=prompt, max_tokens=16, temperature=0)
    assert whole.choices[0].message.content == streamed == reference_reply(
        BUNDLED_ASSETS / "models" / "tiny-llama", tmp_path / "adapter", prompt)
    assert chunks[-1][1].usage.total_tokens == whole.usage.total_tokens
    with pytest.raises(NotFoundError) as missing:
        other.chat.completions.create(model=job.fine_tuned_model, messages=prompt)
    assert missing.value.body["code"] == "model_not_found"

    # A merged export, written by its own Ray Job: plain transformers loads it, with the logits
    # of base + adapter (fp32, atol 1e-4).
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    with Client(base_url=service["url"], api_key=ADMIN_KEY, max_retries=0) as ours_client:
        export = ours_client.jobs.wait_export(job.id, timeout_s=300)
        assert export.status == "succeeded", export.error
        ours_client.jobs.download(job.id, tmp_path / "merged", merged=True)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    base_dir = BUNDLED_ASSETS / "models" / "tiny-llama"
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), str(tmp_path / "adapter"))
    ids = torch.tensor([[1, 15, 27, 99, 4, 250, 31]])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, tuned(ids).logits, atol=1e-4, rtol=0)

    with pytest.raises(NotFoundError):
        client.fine_tuning.jobs.retrieve("ftjob-doesnotexist")


def test_the_openai_client_runs_a_dpo_job(service, journey, tmp_path):
    """Preference tuning as OpenAI's clients ask for it: `method={"type": "dpo", ...}` on a file of
    preference pairs; the job succeeds and reports the DPO metrics as `metrics` events; the
    service's own webhook sender tells a receiver on loopback, signed as OpenAI signs."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{service['url']}/v1", api_key=ADMIN_KEY, max_retries=0, timeout=300)
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    # The endpoint was registered before the job was created (payloads.submit_all).
    receiver, endpoint, job = journey.receiver, journey.webhook, journey.openai["dpo"]
    assert job.method.type == "dpo" and job.method.dpo.hyperparameters.beta == 0.2
    deadline = time.monotonic() + 420 * machine_factor()
    while (job := client.fine_tuning.jobs.retrieve(job.id)).status not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, f"job still {job.status}"
        time.sleep(1)
    assert job.status == "succeeded", job.error
    assert job.fine_tuned_model == f"ft:tiny-llama:dpo-e2e:{job.id}"
    metrics = [e.data for e in client.fine_tuning.jobs.list_events(job.id, limit=100).data if e.type == "metrics"]
    assert metrics and all({"reward_margin", "reward_accuracy", "rewards_chosen", "rewards_rejected"} <= set(m)
                           for m in metrics if "loss" in m)
    first = min((m for m in metrics if "loss" in m), key=lambda m: m["step"])
    assert first["loss"] == pytest.approx(0.6931, abs=1e-3)  # step 1: the policy is the reference

    # The replica's sender delivers the succeeded event; the test waits on its record of it.
    deadline = time.monotonic() + 60 * machine_factor()
    while not (deliveries := httpx.get(f"{service['url']}/jobs/{job.id}/webhooks", headers=headers).json()["data"]) \
            or deliveries[0]["status"] == "pending":
        assert time.monotonic() < deadline, deliveries
        time.sleep(0.2)
    httpx.delete(f"{service['url']}/webhooks/{endpoint['id']}", headers=headers).raise_for_status()
    assert [d["status"] for d in deliveries] == ["delivered"]
    # Verified by OpenAI's SDK when it arrived (payloads.submit_all), with its 5-minute tolerance.
    # (Every job of the tenant that succeeded while the endpoint existed was told too.)
    assert receiver.checked and not [e for e in receiver.checked if isinstance(e, Exception)], receiver.checked
    (got,) = [e for e in receiver.checked if e.data.id == job.id]
    assert got.type == "fine_tuning.job.succeeded"

    # Two adapters of one base at once (the supervised job's and this one's, with the base model),
    # requests interleaved: the model server batches them together, and each model answers as
    # plain PEFT does from its own adapter, streamed or not.
    from concurrent.futures import ThreadPoolExecutor

    from eft import Client
    from tests.helpers.reference import reference_reply

    supervised = journey.openai["supervised"]
    while (supervised := client.fine_tuning.jobs.retrieve(supervised.id)).status not in ("succeeded", "failed"):
        assert time.monotonic() < deadline + 300 * machine_factor(), supervised.status
        time.sleep(1)
    assert supervised.status == "succeeded", supervised.error
    base_dir = BUNDLED_ASSETS / "models" / "tiny-llama"
    expected = {"tiny-llama": reference_reply(base_dir, None, PROMPT)}
    with Client(base_url=service["url"], api_key=ADMIN_KEY, max_retries=0) as ours:
        for tuned in (supervised, job):
            ours.jobs.download(tuned.id, tmp_path / tuned.id)
            expected[tuned.fine_tuned_model] = reference_reply(base_dir, tmp_path / tuned.id, PROMPT)

    def ask(turn: int) -> tuple[str, str]:
        model = list(expected)[turn % 3]
        if turn % 2:
            chunks = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=16, temperature=0,
                                                    stream=True)
            return model, "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return model, client.chat.completions.create(model=model, messages=PROMPT, max_tokens=16,
                                                     temperature=0).choices[0].message.content

    with ThreadPoolExecutor(4) as pool:  # four at once: the admin tenant's share of generations
        answers = list(pool.map(ask, range(12)))
    assert {model for model, _ in answers} == set(expected)
    assert [text for _, text in answers] == [expected[model] for model, _ in answers]
