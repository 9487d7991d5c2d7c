"""`/v1/chat/completions` and `/v1/completions` over the real app, store and engine (the model
servers' code run in-process; through Ray Serve with a trained job in tests/e2e/test_openai_job.py),
with the official `openai` package. Adapters are real PEFT adapters of a bundled model and of a
real family (Qwen 3 with its own chat template); every answer is checked against plain
transformers + PEFT generating from the same files."""

from __future__ import annotations

import json
import shutil

import pytest
from fastapi.testclient import TestClient

from eft.service.serving.engines import LocalModels
from eft.service.settings import BUNDLED_ASSETS, get_settings
from eft.service.store.store import Store
from eft.types.jobs import JobStatus
from tests.helpers.reference import reference_reply
from tests.helpers.app import bearer, new_key, service_app

MODELS = BUNDLED_ASSETS / "models"
QUESTION = [{"role": "user", "content": "Which colour is the sky?"}]


def _adapter(base: str, where, seed: int):
    """A real LoRA adapter of `base` whose weights are not the identity (B is random too), as
    published by a job, and the same adapter as a checkpoint in the training loop's layout
    (trainable weights by parameter name, the adapter's config beside them), scaled."""
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from eft.training.model import trainable_state

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(MODELS / base)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=32, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))
    peft.save_pretrained(where / "published")
    state = {k: v * 0.5 for k, v in trainable_state(peft).items()}
    (where / "ckpt").mkdir()
    save_file(state, str(where / "ckpt" / "trainable.safetensors"))
    peft.peft_config["default"].save_pretrained(str(where / "ckpt" / "adapter"))
    return where / "published", where / "ckpt", state


def _succeed(store, job_id, base, artifact, checkpoint):
    store.transition(job_id, JobStatus.queued, "validated",
                     config={"model_path": str(MODELS / base), "method": "lora", "system_message": "keep"})
    store.transition(job_id, JobStatus.running, "dispatched", attempt=1)
    store.record_checkpoint(job_id, 1, 3, str(checkpoint), {"loss": 1.5}, reason="interval")
    store.transition(job_id, JobStatus.succeeded, "done", artifact_path=str(artifact))


@pytest.fixture
def env(eft_home, tmp_path):
    settings = get_settings()
    store = Store(settings.resolved_database_url)
    models = LocalModels(tmp_path / "cache", max_adapters=1)
    app = service_app(store, settings, models=models)
    keys_of = {t: new_key(store, t) for t in ("acme", "globex")}
    clients = {t: TestClient(app, headers=bearer(k)) for t, k in keys_of.items()}
    turns = [*QUESTION, {"role": "assistant", "content": "Blue."}]
    (eft_home / "data" / "chat.jsonl").write_text(json.dumps({"messages": turns}) + "\n")
    with clients["acme"], clients["globex"]:
        yield clients, store, models, tmp_path
    store.close()


def _openai(client):
    from openai import OpenAI

    key = client.headers["Authorization"].removeprefix("Bearer ")
    return OpenAI(base_url="http://testserver/v1", api_key=key, http_client=client, max_retries=0)


def _job(client, store, base, where, seed, name):
    job = client.post("/jobs", json={"model": base, "training_file": "chat.jsonl", "name": name}).json()
    where.mkdir()
    artifact, checkpoint, state = _adapter(base, where, seed)
    _succeed(store, job["id"], base, artifact, checkpoint)
    return client.get(f"/jobs/{job['id']}").json(), artifact, state


def test_chat_with_base_fine_tuned_and_checkpoint_models_as_plain_peft_answers(env):
    from openai import NotFoundError

    clients, store, models, tmp = env
    acme = _openai(clients["acme"])
    job, artifact, state = _job(clients["acme"], store, "tiny-qwen3", tmp / "q", 1, "bot")
    model = job["fine_tuned_model"]
    assert model in {m.id for m in acme.models.list()}
    checkpoint_model = clients["acme"].get(f"/jobs/{job['id']}/checkpoints").json()["data"][0]["model"]

    tuned = acme.chat.completions.create(model=model, messages=QUESTION, max_tokens=16, temperature=0)
    base = acme.chat.completions.create(model="tiny-qwen3", messages=QUESTION, max_tokens=16, temperature=0)
    ckpt = acme.chat.completions.create(model=checkpoint_model, messages=QUESTION, max_tokens=16, temperature=0)
    assert tuned.object == "chat.completion" and tuned.model == model
    assert tuned.choices[0].message.role == "assistant"
    # Each is exactly what plain transformers + PEFT say from the same files (the random
    # tiny model never emits its end-of-turn token within 16 tokens, so all run to the limit).
    assert tuned.choices[0].message.content == reference_reply(MODELS / "tiny-qwen3", artifact, QUESTION)
    assert base.choices[0].message.content == reference_reply(MODELS / "tiny-qwen3", None, QUESTION)
    assert ckpt.choices[0].message.content == reference_reply(MODELS / "tiny-qwen3", artifact, QUESTION, state=state)
    assert len({tuned.choices[0].message.content, base.choices[0].message.content,
                ckpt.choices[0].message.content}) == 3
    assert tuned.choices[0].finish_reason == "length"
    assert tuned.usage.completion_tokens == 16 and tuned.usage.total_tokens == tuned.usage.prompt_tokens + 16
    # One adapter per base model at a time here (max_adapters=1): the checkpoint replaced the
    # published adapter, which is loaded again on its next use.
    engine = models.engines[str(MODELS / "tiny-qwen3")]
    assert engine.loaded() == [checkpoint_model]
    again = acme.chat.completions.create(model=model, messages=QUESTION, max_tokens=16, temperature=0)
    assert again.choices[0].message.content == tuned.choices[0].message.content
    assert engine.loaded() == [model]

    # A checkpoint whose files are gone (pruned since): 404.
    shutil.rmtree(tmp / "q" / "ckpt")
    with pytest.raises(NotFoundError) as gone:
        acme.chat.completions.create(model=checkpoint_model, messages=QUESTION, max_tokens=4)
    assert gone.value.body["code"] == "model_not_found"

    # Streamed: the same text in pieces, a finish reason, then the usage chunk.
    chunks = list(acme.chat.completions.create(model=model, messages=QUESTION, max_tokens=16, temperature=0,
                                               stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == tuned.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    # On the wire, as OpenAI sends it: the finishing delta is empty, usage only when asked for.
    raw = clients["acme"].post("/v1/chat/completions", json={
        "model": model, "messages": QUESTION, "max_tokens": 4, "temperature": 0, "stream": True})
    events = [json.loads(line[6:]) for line in raw.text.splitlines() if line.startswith("data: {")]
    assert raw.text.rstrip().endswith("data: [DONE]") and raw.headers["content-type"].startswith("text/event-stream")
    assert events[-1]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "length", "logprobs": None}
    assert all("usage" not in e for e in events) and events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}

    # Another tenant's model is not found, as an unknown one is.
    globex = _openai(clients["globex"])
    for other in (model, checkpoint_model, model.replace("ftjob-", "ftjob-0")):
        with pytest.raises(NotFoundError) as err:
            globex.chat.completions.create(model=other, messages=QUESTION)
        assert err.value.body["code"] == "model_not_found" and err.value.body["param"] == "model"


def test_stop_strings_seeds_text_completions_and_refusals(env):
    from openai import BadRequestError, UnprocessableEntityError

    clients, store, models, tmp = env
    acme = _openai(clients["acme"])
    job, artifact, _ = _job(clients["acme"], store, "tiny-llama", tmp / "l", 2, None)
    model = job["fine_tuned_model"]
    reference = reference_reply(MODELS / "tiny-llama", artifact, prompt="The cat", max_new_tokens=24)
    words = reference.split()
    assert len(words) >= 3, reference
    stop = words[2]
    cut = acme.completions.create(model=model, prompt="The cat", max_tokens=24, temperature=0, stop=[stop, "\x00"])
    assert cut.object == "text_completion"
    assert cut.choices[0].text == reference[:reference.index(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = list(acme.completions.create(model=model, prompt="The cat", max_tokens=24, temperature=0,
                                            stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == cut.choices[0].text

    sampled = [acme.completions.create(model=model, prompt="The cat", max_tokens=12, seed=s, temperature=1.5).choices[0].text
               for s in (5, 5, 6)]
    assert sampled[0] == sampled[1] and sampled[0] != sampled[2]

    # A prompt longer than the context: 400 naming the limit, streamed or not.
    context = json.loads((MODELS / "tiny-llama" / "config.json").read_text())["max_position_embeddings"]
    long_prompt = "cat " * (context + 10)
    for stream in (False, True):
        with pytest.raises(BadRequestError) as err:
            acme.completions.create(model=model, prompt=long_prompt, max_tokens=8, stream=stream)
        body = err.value.body
        assert body["code"] == "context_length_exceeded" and body["param"] == "prompt"
        assert f"maximum context length is {context} tokens" in body["message"]
    with pytest.raises(BadRequestError) as err:
        acme.chat.completions.create(model="tiny-llama", messages=QUESTION, max_tokens=context)
    assert err.value.body["param"] == "messages"
    # An adapter whose weights do not load answers with an error and leaves the model as it
    # was: no half-loaded adapter stays, and the base model answers as before.
    from openai import BadRequestError, InternalServerError

    broken, _, _ = _job(clients["acme"], store, "tiny-llama", tmp / "broken", 3, "broken")
    (tmp / "broken" / "published" / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(InternalServerError) as err:
        acme.chat.completions.create(model=broken["fine_tuned_model"], messages=QUESTION, max_tokens=4)
    assert err.value.body["code"] == "generation_failed"
    engine = models.engines[str(MODELS / "tiny-llama")]
    assert broken["fine_tuned_model"] not in engine.loaded()
    assert not any(n for n in engine.peft.peft_config if n not in engine.adapters.values())
    # n choices (one after another on transformers' fallback engine: the same at temperature 0);
    # log-probabilities are the vLLM engine's only, and this engine says so with a 400.
    one = acme.chat.completions.create(model="tiny-llama", messages=QUESTION, max_tokens=4, temperature=0)
    two = acme.chat.completions.create(model="tiny-llama", messages=QUESTION, max_tokens=4, n=2, temperature=0)
    assert [c.index for c in two.choices] == [0, 1]
    assert two.choices[0].message.content == two.choices[1].message.content == one.choices[0].message.content
    assert two.usage.completion_tokens == 2 * one.usage.completion_tokens
    with pytest.raises(BadRequestError) as err:
        acme.chat.completions.create(model="tiny-llama", messages=QUESTION, max_tokens=4, logprobs=True)
    assert err.value.body["code"] == "logprobs_not_supported" and err.value.body["param"] == "logprobs"
    base_reply = acme.completions.create(model="tiny-llama", prompt="The cat", max_tokens=24, temperature=0)
    assert base_reply.choices[0].text == reference_reply(MODELS / "tiny-llama", None, prompt="The cat", max_new_tokens=24)
    # Parameters the service does not take: 422 naming each.
    for extra, param in (({"n": 17}, "n"), ({"temperature": 2.5}, "temperature"), ({"stop": ["a"] * 5}, "stop")):
        with pytest.raises(UnprocessableEntityError) as err:
            acme.chat.completions.create(model=model, messages=QUESTION, **extra)
        assert param in json.dumps(err.value.body)


def test_gemma_refuses_a_system_turn_and_a_server_without_model_servers_says_so(env, eft_home):
    from openai import BadRequestError

    clients, store, _, _ = env
    acme = _openai(clients["acme"])
    with pytest.raises(BadRequestError) as err:
        acme.chat.completions.create(model="tiny-gemma-2", messages=[{"role": "system", "content": "Be terse."}, *QUESTION],
                                     max_tokens=4)
    assert err.value.body["param"] == "messages" and "system" in err.value.body["message"].lower()

    settings = get_settings()
    bare = service_app(store, settings)
    key = clients["acme"].headers["Authorization"]
    with TestClient(bare, headers={"Authorization": key}) as client:
        response = client.post("/v1/chat/completions", json={"model": "tiny-llama", "messages": QUESTION})
    assert response.status_code == 503 and response.json()["error"]["code"] == "inference_unavailable"


@pytest.mark.parametrize("family,turn_end", [("tiny-qwen3", "<|im_end|>"), ("tiny-llama-3.1", "<|eot_id|>"),
                                             ("tiny-gemma-2", "<end_of_turn>"), ("tiny-phi-3", "<|end|>")])
def test_a_reply_ends_at_the_families_own_end_of_turn_token(family, turn_end):
    from transformers import AutoTokenizer, GenerationConfig

    from eft.training.chat import stop_token_ids

    tokenizer = AutoTokenizer.from_pretrained(MODELS / family)
    stops = stop_token_ids(tokenizer, GenerationConfig.from_pretrained(MODELS / family)
                           if (MODELS / family / "generation_config.json").is_file() else None)
    assert tokenizer.convert_tokens_to_ids(turn_end) in stops and tokenizer.eos_token_id in stops


def test_a_tenant_holding_its_share_of_generations_gets_a_429_and_others_are_served(env):
    """A tenant's completions in flight on a replica are bounded (EFT_GENERATIONS_PER_TENANT):
    one more is a 429 with Retry-After before any generation starts, another tenant is served,
    and every way a completion ends gives its slot back."""
    from openai import RateLimitError

    clients, store, models, tmp = env
    slots = clients["acme"].app.state.generations
    acme, globex = _openai(clients["acme"]), _openai(clients["globex"])
    ask = {"model": "tiny-llama", "messages": QUESTION, "max_tokens": 4, "temperature": 0}
    # Answered, streamed, and refused (a prompt over the context): each leaves no slot held.
    acme.chat.completions.create(**ask)
    assert list(acme.completions.create(model="tiny-llama", prompt="The cat", max_tokens=4, stream=True))
    r = clients["acme"].post("/v1/completions", json={"model": "tiny-llama", "prompt": "word " * 5000, "max_tokens": 4})
    assert r.status_code == 400, r.text
    assert slots.open == {}
    # acme holds all its slots (generations in flight elsewhere on this replica).
    for _ in range(slots.per_tenant):
        slots.take("acme", "completions")
    with pytest.raises(RateLimitError) as refused:
        acme.chat.completions.create(**ask)
    assert int(refused.value.response.headers["retry-after"]) >= 1
    assert "in flight" in refused.value.response.json()["error"]["message"]
    assert globex.chat.completions.create(**ask).choices[0].message.content is not None
    slots.give_back("acme")
    assert acme.chat.completions.create(**ask).choices[0].message.content is not None
    assert slots.open == {"acme": slots.per_tenant - 1}
