"""The trainers' sampler (service/serving/sampler.py): a Ray actor in the model servers' environment
that samples `n` completions per prompt with token ids and log-probabilities, called from a Ray
task as a trainer's worker calls it, and refreshed in place when an adapter's weights change."""

from __future__ import annotations

import pytest
import ray
import torch

from eft.service.serving.engine import AdapterSource, BaseSource, EngineOptions
from tests.helpers.adapters import as_checkpoint, random_adapter
from tests.helpers.paths import SERVE_PYTHON, TINY_LLAMA

PROMPTS = [[2, 318, 268, 441, 21], [2, 515, 286, 397]]
#: The bundled task's dense grader (docs/api.md): 1 / (1 + distance) of the reply's last number.
NEAR = """import re
def grade(sample, item):
    numbers = re.findall(r"-?\\d+", sample["output_text"])
    return 1.0 / (1.0 + abs(int(numbers[-1]) - int(item["answer"]))) if numbers else 0.0
"""


@pytest.fixture(scope="module")
def sampler(ray_cluster, tmp_path_factory):
    from eft.service.serving.sampler import Sampler

    assert SERVE_PYTHON.exists(), "make setup builds the model servers' environment"
    root = tmp_path_factory.mktemp("sampler")
    first = random_adapter(str(TINY_LLAMA), root / "step-1", seed=11)
    second = as_checkpoint(random_adapter(str(TINY_LLAMA), root / "step-2-adapter", seed=12), root / "step-2")
    handle = Sampler.start(BaseSource(str(TINY_LLAMA)), EngineOptions(cache_dir=str(root / "cache"), max_lora_rank=8,
                                                                      max_model_len=512),
                           python=str(SERVE_PYTHON), num_gpus=1 if torch.cuda.is_available() else 0)
    return handle, first, second


@ray.remote
def _rollouts(handle, adapter, seed):
    """A trainer's side: a Ray task holding the sampler's handle."""
    return ray.get(handle.sample.remote(PROMPTS, n=4, max_tokens=12, temperature=1.0, seed=seed, adapter=adapter))


def _log_probs(adapter_dir, prompt: list[int], tokens: list[int]) -> list[float]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(TINY_LLAMA, dtype=torch.float32),
                                      str(adapter_dir)).eval()
    ids = torch.tensor([prompt + tokens])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0].tolist()


def test_groups_of_samples_with_token_log_probs_from_a_ray_task(sampler):
    handle, first, _ = sampler
    policy = AdapterSource("policy", str(first))
    groups = ray.get(_rollouts.remote(handle, policy, 5))
    assert [len(group) for group in groups] == [4, 4]
    for group in groups:
        for sample in group:
            assert sample["token_ids"] and len(sample["logprobs"]) == len(sample["token_ids"])
            assert all(lp <= 0 for lp in sample["logprobs"]) and sample["finish_reason"] in ("stop", "length")
        assert len({tuple(s["token_ids"]) for s in group}) > 1, "a group at temperature 1 samples different answers"
    assert ray.get(_rollouts.remote(handle, policy, 5)) == groups, "the same seed gives the same samples"
    assert ray.get(_rollouts.remote(handle, policy, 6)) != groups
    # The log-probabilities are the policy's own: what transformers + PEFT compute for those tokens.
    sample = groups[0][0]
    expected = _log_probs(first, PROMPTS[0], sample["token_ids"])
    assert max(abs(a - b) for a, b in zip(sample["logprobs"], expected)) < 1e-3, (sample["logprobs"], expected)


def test_rollouts_of_the_bundled_task_are_graded_groups_that_train_on_their_completions(sampler):
    """training/rollouts.py as a trainer's worker runs it (in a Ray task, the policy named by a plain
    dict): the bundled task's prompts rendered as the model servers render chats, 4 samples each,
    graded, advantages centred per prompt; the same seed, the same step."""
    import json

    from transformers import AutoTokenizer

    from eft.training.data import IGNORE_INDEX
    from eft.training.graders import grade
    from eft.training.rollouts import grade_groups, prompt_of, sample, summary
    from tests.helpers.paths import DEMO_DATA

    handle, first, _ = sampler
    # A dense reward (how near the reply's last number is to the answer): the bundled base model is
    # not instruction-tuned, and exact answers from it are rare.
    grader = {"type": "python", "name": "near", "source": NEAR}
    rows = [json.loads(line) for line in (DEMO_DATA / "reinforcement_train.jsonl").read_text().splitlines()[:4]]
    tokenizer = AutoTokenizer.from_pretrained(TINY_LLAMA)
    prompts = [prompt_of(row, tokenizer) for row in rows]

    @ray.remote
    def step(adapter):
        groups = sample(handle, prompts, n=4, max_tokens=16, temperature=1.0, top_p=1.0, seed=1000, adapter=adapter)
        return groups, grade_groups(prompts, groups, grader)

    # The policy named by a plain dict reaches the engine as an adapter; the base model's replies
    # are graded below.
    assert ray.get(step.remote({"model": "policy", "location": str(first), "kind": "artifact"}))[0] != \
        ray.get(step.remote(None))[0]
    policy = None
    groups, done = ray.get(step.remote(policy))
    assert len(done.rollouts) == 16 and [len(g) for g in groups] == [4] * 4
    for i, rollout in enumerate(done.rollouts):
        prompt, reply = prompts[i // 4], groups[i // 4][i % 4]
        assert rollout.input_ids == prompt.ids + reply["token_ids"]
        assert rollout.labels == [IGNORE_INDEX] * len(prompt.ids) + reply["token_ids"]
        assert rollout.sampler_logprobs == reply["logprobs"] and len(reply["logprobs"]) == len(reply["token_ids"])
        assert rollout.reward == grade(grader, reply["text"], rows[i // 4]).score
    for g in range(4):  # each prompt's advantages are its rewards centred (and scaled)
        group = done.rollouts[4 * g:4 * g + 4]
        assert abs(sum(r.advantage for r in group)) < 1e-4
        assert all((r.advantage > 0) == (r.reward > sum(x.reward for x in group) / 4) for r in group
                   if r.reward != sum(x.reward for x in group) / 4)
    metrics = summary(done.sums)
    assert 0 < metrics["reward_mean"] < 1 and metrics["reward_std"] > 0, metrics
    assert metrics["reward_mean"] == sum(r.reward for r in done.rollouts) / 16
    assert metrics["response_length"] == sum(len(r.sampler_logprobs) for r in done.rollouts) / 16
    print(f"\nbundled task, 4 prompts x 4 samples: {metrics}")
    again, _ = ray.get(step.remote(policy))
    assert again == groups, "a step sampled again (a resumed run) draws the same replies"


def test_an_adapter_refreshed_in_place_samples_with_its_new_weights(sampler):
    handle, first, second = sampler

    def greedy(adapter: AdapterSource) -> list:
        groups = ray.get(handle.sample.remote(PROMPTS, n=1, max_tokens=12, temperature=0, adapter=adapter))
        return [group[0]["token_ids"] for group in groups]

    before = greedy(AdapterSource("policy", str(first)))
    after = greedy(AdapterSource("policy", str(second), "checkpoint"))  # the trainer's next checkpoint
    assert after != before
    assert after == greedy(AdapterSource("fresh", str(second), "checkpoint"))
    assert before == greedy(AdapterSource("fresh-first", str(first)))
    assert sorted(ray.get(handle.adapters.remote())) == ["fresh", "fresh-first", "policy"]


def test_a_short_request_is_not_held_behind_another_callers_flood(sampler):
    """Continuous batching: while one caller's 32 long completions run, another's 4-token request
    joins the running batch instead of waiting for them (transformers' engine would make it wait
    for all 32). Its latency stays within 3x of its latency alone, measured in the same run."""
    import statistics
    import time

    handle, first, _ = sampler
    policy = AdapterSource("policy", str(first))

    def short() -> float:
        started = time.monotonic()
        ray.get(handle.sample.remote([PROMPTS[1]], n=1, max_tokens=4, temperature=0, adapter=policy))
        return time.monotonic() - started

    short()  # the adapter loaded, the shapes seen
    alone = statistics.median(short() for _ in range(5))
    flood = handle.sample.remote(PROMPTS * 16, n=1, max_tokens=256, temperature=1.0, seed=1, ignore_eos=True)
    during = []
    while len(during) < 5:
        during.append(short())
    ready, _ = ray.wait([flood], timeout=0)
    assert not ready, "the flood ended before the short requests did: it measured nothing"
    flooded = statistics.median(during)
    print(f"\nshort request alone {alone * 1000:.0f} ms, during a 32 x 256-token flood {flooded * 1000:.0f} ms "
          f"({flooded / alone:.2f}x)")
    assert flooded <= 3 * alone, (alone, flooded)
    assert all(len(group[0]["token_ids"]) == 256 for group in ray.get(flood))


def test_a_caller_that_leaves_has_its_requests_aborted_in_the_engine(sampler):
    """Cancelling a `sample` call (a trainer's worker gone, an API client that left) aborts its
    requests in vLLM instead of generating for nobody: 256 requests of 480 tokens (over 120k tokens,
    tens of seconds of generation here) are gone from the engine within seconds of the cancel."""
    import time

    handle, _, _ = sampler
    long = handle.sample.remote(PROMPTS * 128, n=1, max_tokens=480, temperature=1.0, seed=2, ignore_eos=True)
    deadline = time.monotonic() + 60
    while ray.get(handle.generating.remote()) < 256:  # every request is in the engine
        assert time.monotonic() < deadline, "the requests never reached the engine"
    ray.cancel(long)
    cancelled = time.monotonic()
    with pytest.raises((ray.exceptions.TaskCancelledError, ray.exceptions.RayTaskError)):
        ray.get(long, timeout=60)
    while (left := ray.get(handle.generating.remote())) > 0:
        assert time.monotonic() - cancelled < 5, f"{left} cancelled requests kept generating"
    print(f"\n256 requests aborted {time.monotonic() - cancelled:.2f} s after the cancel")
