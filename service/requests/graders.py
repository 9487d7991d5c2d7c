"""OpenAI's grader endpoints (`/v1/fine_tuning/alpha/graders/validate` and `/run`) on the graders of
reinforcement jobs (training/graders): a grader checked as a job's will be, and one reply scored.

What runs is a tenant's input (a python grader's code, templates, text metrics over their text),
so it runs in the `grade` helpers (service/isolation.py): bounded in time and memory, one tenant
never holding every helper; a python grader runs further inside its own sandboxed process.

A model grader's judge is a model of this service, called as the tenant (their models, their
limits: never the operator's credentials on their behalf). The call itself is the API's (it holds
the model servers), so a run that has model graders goes in three steps: the helper renders the
judge requests the grader will make (`judge_requests`), the API asks the models, and the helper
grades with those replies (`run`).
"""

from __future__ import annotations

import json
from typing import Any

from eft.service import isolation
from eft.service.errors import Problem, RequestInvalid

#: A reply the API could not get from the judge: the grader's model grader error.
JUDGE_FAILED = "__judge_failed__"


def _invalid(exc: Exception) -> RequestInvalid:
    problems = getattr(exc, "problems", None) or [("grader", str(exc))]
    return RequestInvalid(problems=[Problem(param, "invalid_grader", message) for param, message in problems])


def judge_key(model: str, messages: list, sampling_params: dict) -> str:
    return json.dumps([model, messages, sampling_params], sort_keys=True, default=str)


def _validate(grader: dict[str, Any], item: Any) -> dict[str, Any]:
    from eft.training.graders import validate

    return validate(grader, item)


def _judge_requests(grader: dict[str, Any], model_sample: str, item: Any) -> list[dict[str, Any]]:
    from eft.training.graders import PythonOutcome, run

    asked: list[dict[str, Any]] = []

    def recording(model: str, messages: list, sampling_params: dict) -> str:
        asked.append({"model": model, "messages": messages, "sampling_params": dict(sampling_params or {})})
        return "0"

    # Only the judge's requests are wanted: a python grader is not run for them.
    run(grader, model_sample, item, judge=recording,
        python_runner=lambda source, pairs, *limits: [PythonOutcome(0.0) for _ in pairs])
    return asked


def _run(grader: dict[str, Any], model_sample: str, item: Any, replies: dict[str, str]) -> dict[str, Any]:
    from eft.training.graders import run

    def replaying(model: str, messages: list, sampling_params: dict) -> str:
        reply = replies.get(judge_key(model, messages, dict(sampling_params or {})), JUDGE_FAILED)
        if reply.startswith(JUDGE_FAILED):
            raise RuntimeError(reply[len(JUDGE_FAILED):].lstrip(": ") or f"no reply from {model}")
        return reply

    return run(grader, model_sample, item, judge=replaying)


def validate(grader: dict[str, Any], item: Any = None) -> dict[str, Any]:
    """`{"grader": ...}` normalized, or a 422 naming each problem's field (`grader.<path>`)."""
    try:
        return isolation.run(_validate, grader, item, pool="grade", param="grader")
    except ValueError as exc:
        raise _invalid(exc) from None


def judge_requests(grader: dict[str, Any], model_sample: str, item: Any = None) -> list[dict[str, Any]]:
    """The judge calls a run of `grader` makes: `{"model", "messages", "sampling_params"}` each."""
    try:
        return isolation.run(_judge_requests, grader, model_sample, item, pool="grade", param="grader")
    except ValueError as exc:
        raise _invalid(exc) from None


def run(grader: dict[str, Any], model_sample: str, item: Any, replies: dict[str, str]) -> dict[str, Any]:
    """OpenAI's run response; `replies` are the judge's, by `judge_key`."""
    try:
        return isolation.run(_run, grader, model_sample, item, replies, pool="grade", param="grader")
    except ValueError as exc:
        raise _invalid(exc) from None
