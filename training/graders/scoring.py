"""Scoring a model's reply with a grader, and OpenAI's `/fine_tuning/alpha/graders/run` response.

`grade(grader, sample, item)` scores one reply; `grade_many(grader, pairs)` scores a batch, every
python grader of it in one sandboxed process. A grader never raises for what a sample, an item,
a judge or a python grader's code does: the score is then 0 (OpenAI: an invalid result "will be
marked as invalid and return a 0 grade") and the result carries the error, as one of the flags
of OpenAI's run response (`metadata.errors`):

- `sample_parse_error`: a template reads `sample.output_json` of a reply that is not JSON;
- `invalid_variable_error`: a template reads a path the item or the sample does not have;
- `python_grader_runtime_error`: the grader's code raised, returned something that is not a
  finite number, or tried something the sandbox refuses (network, processes, files);
- `python_grader_server_error` (with `python_grader_server_error_type` timeout, memory or
  crashed): its process ran out of time or memory, or died;
- `model_grader_parse_error`, `model_grader_refusal_error`, `model_grader_server_error`: the
  judge's reply was not a score (or label), its model refused, or the call failed;
- `other_error`: a multi grader's formula had no finite value (division by zero, `log(0)`).

A multi grader scores each of its graders, then its formula over their scores (a failed member
counts 0); its result has the members' scores (`sub_rewards` and `metadata.scores` of the run
response) and all their errors, each message prefixed with the member's key.

Where this differs from OpenAI: OpenAI's run response's `token_usage` and
`model_grader_token_usage_per_model` count the judge's tokens; the judge here returns text only,
so they are null and `{}`. Each error flag comes with a `<flag>_details` message, as OpenAI's
own responses carry for several of them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from eft.training.graders.formula import FormulaError, parse_formula
from eft.training.graders.judging import Judge, JudgeRefusal, ReplyError, parse_label, parse_score, render_messages
from eft.training.graders.models import (AnyGrader, Grader, GraderValidationError, LabelModelGrader, MultiGrader,
                                         PythonGrader, ScoreModelGrader, StringCheckGrader, TextSimilarityGrader,
                                         parse_grader)
from eft.training.graders.sandbox import RUNTIME_KINDS, PythonOutcome, run_python_grader
from eft.training.graders.similarity import similarity
from eft.training.graders.templates import TemplateError, make_sample, render, sample_namespace

PythonRunner = Callable[[str, Sequence[tuple[Mapping[str, Any], Any]]], Sequence[PythonOutcome]]
#: The error flags of OpenAI's run response, in its order.
ERROR_KINDS = ("formula_parse_error", "invalid_variable_error", "model_grader_parse_error",
               "model_grader_refusal_error", "model_grader_server_error", "other_error",
               "python_grader_runtime_error", "python_grader_server_error", "sample_parse_error",
               "truncated_observation_error", "unresponsive_reward_error")
#: The flags this package raises; each comes with `<flag>_details` in a run response.
RAISED_KINDS = ("invalid_variable_error", "model_grader_parse_error", "model_grader_refusal_error",
                "model_grader_server_error", "other_error", "python_grader_runtime_error",
                "python_grader_server_error", "sample_parse_error")
OPERATIONS: dict[str, Callable[[str, str], bool]] = {
    "eq": lambda text, reference: text == reference,
    "ne": lambda text, reference: text != reference,
    "like": lambda text, reference: reference in text,
    "ilike": lambda text, reference: reference.lower() in text.lower(),
}


@dataclass(frozen=True)
class GradeError:
    kind: str
    """One of ERROR_KINDS."""
    message: str
    grader: str
    """The name of the grader (a multi grader's member: its key) that failed."""
    server_error_type: str | None = None
    """For python_grader_server_error: timeout, memory or crashed."""


@dataclass(frozen=True)
class GradeResult:
    score: float
    name: str
    type: str
    sub_scores: Mapping[str, float] = field(default_factory=dict)
    """A multi grader's members' scores, by key."""
    errors: tuple[GradeError, ...] = ()
    execution_time_s: float = 0.0
    model: str | None = None
    """The judge model of a score_model grader."""


@dataclass(frozen=True)
class _Outcome:
    score: float
    errors: tuple[GradeError, ...] = ()
    seconds: float = 0.0
    sub_scores: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Tools:
    judge: Judge | None
    python_runner: PythonRunner


def grade(grader: Grader | Mapping[str, Any], sample: str | Mapping[str, Any], item: Any = None, *,
          judge: Judge | None = None, python_runner: PythonRunner | None = None) -> GradeResult:
    """The score of one sample (a reply's text, or the sample namespace: `output_text`,
    `output_json`, `output_tools`, ...) against a dataset item. Raises GraderValidationError for
    a grader that cannot be used (or a model grader without a judge)."""
    return grade_many(grader, [(sample, item)], judge=judge, python_runner=python_runner)[0]


def grade_many(grader: Grader | Mapping[str, Any], pairs: Sequence[tuple[str | Mapping[str, Any], Any]], *,
               judge: Judge | None = None, python_runner: PythonRunner | None = None) -> list[GradeResult]:
    """The scores of many (sample, item) pairs, in order; a python grader runs them all in one
    sandboxed process (`sandbox.run_python_grader`, unless `python_runner` is given)."""
    parsed = parse_grader(grader)
    _require_judge(parsed, judge, "grader")
    contexts = [(sample_namespace(sample), item) for sample, item in pairs]
    outcomes = _score(parsed, contexts, _Tools(judge, python_runner or run_python_grader))
    model = parsed.model if isinstance(parsed, ScoreModelGrader) else None
    return [GradeResult(o.score, parsed.name, parsed.type, o.sub_scores, o.errors, o.seconds, model) for o in outcomes]


def run(grader: Mapping[str, Any], model_sample: str, item: Any = None, *, judge: Judge | None = None,
        python_runner: PythonRunner | None = None) -> dict[str, Any]:
    """`POST /v1/fine_tuning/alpha/graders/run`: the run response of one model sample (a reply's
    text; `output_json` is it parsed when it is JSON) and item. Raises GraderValidationError."""
    result = grade(grader, make_sample(model_sample), item, judge=judge, python_runner=python_runner)
    return run_response(result)


def run_response(result: GradeResult) -> dict[str, Any]:
    """A grade result in the shape of OpenAI's run response (`GraderRunResponse`)."""
    errors: dict[str, Any] = {}
    for kind in ERROR_KINDS:
        found = [e for e in result.errors if e.kind == kind]
        errors[kind] = bool(found)
        if kind in RAISED_KINDS:
            errors[f"{kind}_details"] = "; ".join(
                f"{e.grader}: {e.message}" if result.type == "multi" else e.message for e in found) or None
        if kind == "python_grader_server_error":
            errors["python_grader_server_error_type"] = found[0].server_error_type if found else None
    metadata = {"name": result.name, "type": result.type, "errors": errors, "execution_time": result.execution_time_s,
                "scores": dict(result.sub_scores), "token_usage": None, "sampled_model_name": result.model}
    return {"reward": result.score, "metadata": metadata, "sub_rewards": dict(result.sub_scores),
            "model_grader_token_usage_per_model": {}}


def _score(grader: AnyGrader, contexts: list, tools: _Tools) -> list[_Outcome]:
    return _SCORERS[grader.type](grader, contexts, tools)


def _each(grader: AnyGrader, contexts: list, score: Callable[[Mapping[str, Any], Any], float]) -> list[_Outcome]:
    outcomes = []
    for sample, item in contexts:
        started = time.perf_counter()
        try:
            value, errors = score(sample, item), ()
        except TemplateError as error:
            value, errors = 0.0, (GradeError(error.kind, str(error), grader.name),)
        except Exception as error:  # a metric library failing on this text
            value, errors = 0.0, (GradeError("other_error", f"{type(error).__name__}: {error}"[:500], grader.name),)
        outcomes.append(_Outcome(value, errors, time.perf_counter() - started))
    return outcomes


def _string_check(grader: StringCheckGrader, contexts: list, tools: _Tools) -> list[_Outcome]:
    check = OPERATIONS[grader.operation]
    return _each(grader, contexts, lambda sample, item: float(
        check(render(grader.input, sample, item), render(grader.reference, sample, item))))


def _text_similarity(grader: TextSimilarityGrader, contexts: list, tools: _Tools) -> list[_Outcome]:
    return _each(grader, contexts, lambda sample, item: similarity(
        grader.evaluation_metric, render(grader.input, sample, item), render(grader.reference, sample, item)))


def _python(grader: PythonGrader, contexts: list, tools: _Tools) -> list[_Outcome]:
    outcomes = tools.python_runner(grader.source, [(sample, {} if item is None else item) for sample, item in contexts])
    return [_python_outcome(grader, outcome) for outcome in outcomes]


def _python_outcome(grader: PythonGrader, outcome: PythonOutcome) -> _Outcome:
    if outcome.score is not None:
        return _Outcome(outcome.score, (), outcome.seconds)
    if outcome.kind in RUNTIME_KINDS:
        error = GradeError("python_grader_runtime_error", outcome.error or "failed", grader.name)
    else:
        error = GradeError("python_grader_server_error", outcome.error or "failed", grader.name, outcome.kind)
    return _Outcome(0.0, (error,), outcome.seconds)


def _model_grader(grader: ScoreModelGrader | LabelModelGrader, contexts: list, tools: _Tools) -> list[_Outcome]:
    assert tools.judge is not None  # checked by grade_many
    params = grader.sampling_params.model_dump(exclude_none=True) if getattr(grader, "sampling_params", None) else {}
    outcomes = []
    for sample, item in contexts:
        started = time.perf_counter()
        try:
            reply = tools.judge(grader.model, render_messages(grader.input, sample, item), params)
            if isinstance(grader, ScoreModelGrader):
                value, errors = parse_score(reply, grader.bounds), ()
            else:
                value, errors = float(parse_label(reply, grader.labels) in grader.passing_labels), ()
        except TemplateError as error:
            value, errors = 0.0, (GradeError(error.kind, str(error), grader.name),)
        except ReplyError as error:
            value, errors = 0.0, (GradeError("model_grader_parse_error", str(error), grader.name),)
        except JudgeRefusal as error:
            value, errors = 0.0, (GradeError("model_grader_refusal_error", str(error) or "refused", grader.name),)
        except Exception as error:  # the judge's call: any failure is the model server's
            value, errors = 0.0, (GradeError("model_grader_server_error", f"{type(error).__name__}: {error}"[:500],
                                             grader.name),)
        outcomes.append(_Outcome(value, errors, time.perf_counter() - started))
    return outcomes


def _multi(grader: MultiGrader, contexts: list, tools: _Tools) -> list[_Outcome]:
    formula = parse_formula(grader.calculate_output, grader.graders)
    members = {key: _score(member, contexts, tools) for key, member in grader.graders.items()}
    outcomes = []
    for n in range(len(contexts)):
        scores = {key: outcomes_of[n].score for key, outcomes_of in members.items()}
        errors = tuple(replace(e, grader=key) for key, outcomes_of in members.items() for e in outcomes_of[n].errors)
        seconds = sum(outcomes_of[n].seconds for outcomes_of in members.values())
        try:
            value = formula.evaluate(scores)
        except FormulaError as error:
            value, errors = 0.0, errors + (GradeError("other_error", str(error), grader.name),)
        outcomes.append(_Outcome(value, errors, seconds, scores))
    return outcomes


def _require_judge(grader: AnyGrader, judge: Judge | None, path: str) -> None:
    if isinstance(grader, MultiGrader):
        for key, member in grader.graders.items():
            _require_judge(member, judge, f"{path}.graders.{key}")
    elif isinstance(grader, (ScoreModelGrader, LabelModelGrader)) and judge is None:
        raise GraderValidationError([(f"{path}.model", f"{grader.type} graders need a judge model, and none is "
                                                      "configured here; use another grader type")])


_SCORERS: dict[str, Callable[[Any, list, _Tools], list[_Outcome]]] = {
    "string_check": _string_check, "text_similarity": _text_similarity, "python": _python,
    "score_model": _model_grader, "label_model": _model_grader, "multi": _multi,
}
