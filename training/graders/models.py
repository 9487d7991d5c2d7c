"""OpenAI's grader objects, as `method.reinforcement.grader` and `/fine_tuning/alpha/graders/*`
take them (the `openai` package's `types/graders/*` and `types/fine_tuning/alpha/*`).

A grader is one of `string_check`, `text_similarity`, `python`, `score_model` or `multi`; a multi
grader's `graders` are named graders of the first four types or `label_model` (a multi grader
cannot hold another multi grader, and `label_model` is only allowed inside one, as in OpenAI's
types). `parse_grader` checks everything it can before anything runs and reports every problem
together, each named by its path (`grader.graders.a.operation`) with what to do.

Where this differs from, or fills a gap in, OpenAI:
- `name` may be left out: OpenAI names such a grader `grader-<random>` (seen in its `/validate`
  responses); here a multi grader's member takes its key, any other grader `grader-<random>`.
- `graders` of a multi grader is an object of named graders, as OpenAI's guide and examples
  write it (the `openai` package types it as a single grader; one grader given that way is keyed
  by its name). Keys must be identifiers, since `calculate_output` names them.
- `text_similarity` with `cosine` is refused: it needs an embeddings model this service does not
  have (OpenAI offers it for evals only, not for fine-tuning).
- `python.image_tag` is accepted and ignored: the code runs with this service's interpreter and
  the packages installed with it (`sandbox.py`).
- `pass_threshold`, which OpenAI's guide shows on `text_similarity` and `score_model` (an evals
  setting), is accepted and kept; it does not change a score.
"""

from __future__ import annotations

import ast
import keyword
import math
import secrets
import string
from typing import Annotated, Any, Literal, Mapping, Optional, Sequence, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from eft.training.graders.formula import FormulaError, parse_formula
from eft.training.graders.templates import check as check_template

MAX_SOURCE_BYTES = 256 * 1024  # OpenAI's limit on a python grader's source
GRADER_TYPES = ("string_check", "text_similarity", "python", "score_model", "multi")
MEMBER_TYPES = ("string_check", "text_similarity", "python", "score_model", "label_model")
EVALUATION_METRICS = ("cosine", "fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_2",
                      "rouge_3", "rouge_4", "rouge_5", "rouge_l")
ROLES = Literal["user", "assistant", "system", "developer"]


class GraderValidationError(ValueError):
    """A grader that cannot be used. `problems` lists every (param, message) found, the param a
    path such as `grader.graders.a.operation`; `param` is the first one's."""

    def __init__(self, problems: Sequence[tuple[str, str]]):
        super().__init__(tuple(problems))

    @property
    def problems(self) -> tuple[tuple[str, str], ...]:
        return self.args[0]

    @property
    def param(self) -> str:
        return self.problems[0][0]

    def __str__(self) -> str:
        return "; ".join(f"{param}: {message}" for param, message in self.problems)


class _Object(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class StringCheckGrader(_Object):
    type: Literal["string_check"]
    name: str
    input: str
    """The text checked; a template."""
    reference: str
    """The text it is checked against; a template."""
    operation: Literal["eq", "ne", "like", "ilike"]
    """`eq`: equal, `ne`: not equal (both case-sensitive); `like`: input contains reference,
    `ilike`: the same ignoring case. 1 when it holds, else 0."""


class TextSimilarityGrader(_Object):
    type: Literal["text_similarity"]
    name: str
    input: str
    reference: str
    evaluation_metric: Literal[EVALUATION_METRICS]  # type: ignore[valid-type]
    pass_threshold: Optional[float] = None


class PythonGrader(_Object):
    type: Literal["python"]
    name: str
    source: str
    """Python code defining `grade(sample, item) -> float`."""
    image_tag: Optional[str] = None
    """OpenAI's runtime image; ignored here (the code runs with this service's interpreter)."""


class SamplingParams(_Object):
    max_completions_tokens: Optional[int] = Field(default=None, ge=1)
    reasoning_effort: Optional[Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]] = None
    seed: Optional[int] = None
    temperature: Optional[float] = Field(default=None, ge=0, le=2)
    top_p: Optional[float] = Field(default=None, gt=0, le=1)


class InputText(_Object):
    type: Literal["input_text"]
    text: str
    prompt_cache_breakpoint: Optional[dict] = None


class OutputText(_Object):
    type: Literal["output_text"]
    text: str


class InputImage(_Object):
    type: Literal["input_image"]
    image_url: str
    detail: Optional[str] = None


class AudioData(_Object):
    data: str
    format: Literal["mp3", "wav"]


class InputAudio(_Object):
    type: Literal["input_audio"]
    input_audio: AudioData


PART_TYPES = ("input_text", "output_text", "input_image", "input_audio")
_PART = TypeAdapter(Annotated[Union[InputText, OutputText, InputImage, InputAudio], Field(discriminator="type")])


class Message(_Object):
    role: ROLES
    content: Any
    """Text, a content part (`input_text`, `output_text`, `input_image`, `input_audio`) or a list
    of them; text and image URLs are templates."""
    type: Optional[Literal["message"]] = None


class ScoreModelGrader(_Object):
    type: Literal["score_model"]
    name: str
    model: str = Field(min_length=1)
    input: list[Message] = Field(min_length=1)
    range: Optional[list[float]] = None
    """[low, high] of the score; [0, 1] when left out. The judge's score is clamped to it."""
    sampling_params: Optional[SamplingParams] = None
    pass_threshold: Optional[float] = None

    @property
    def bounds(self) -> tuple[float, float]:
        low, high = self.range or (0.0, 1.0)
        return float(low), float(high)


class LabelModelGrader(_Object):
    type: Literal["label_model"]
    name: str
    model: str = Field(min_length=1)
    input: list[Message] = Field(min_length=1)
    labels: list[str] = Field(min_length=1)
    passing_labels: list[str] = Field(min_length=1)
    """The labels that score 1 (the others score 0); a subset of `labels`."""


MemberGrader = Annotated[Union[StringCheckGrader, TextSimilarityGrader, PythonGrader, ScoreModelGrader,
                               LabelModelGrader], Field(discriminator="type")]


class MultiGrader(_Object):
    type: Literal["multi"]
    name: str
    graders: dict[str, MemberGrader]
    calculate_output: str
    """A formula over the graders' keys (`formula.py`)."""


Grader = Union[StringCheckGrader, TextSimilarityGrader, PythonGrader, ScoreModelGrader, MultiGrader]
AnyGrader = Union[Grader, LabelModelGrader]
CLASSES: dict[str, type[_Object]] = {
    "string_check": StringCheckGrader, "text_similarity": TextSimilarityGrader, "python": PythonGrader,
    "score_model": ScoreModelGrader, "label_model": LabelModelGrader, "multi": MultiGrader,
}


def parse_grader(data: Mapping[str, Any] | Grader, *, item: Any = None) -> Grader:
    """The grader `data` describes (a dict as the API takes it, or a grader already parsed).
    With `item` (a dataset row), every `{{ item... }}` reference must exist in it. Raises
    GraderValidationError listing every problem."""
    if isinstance(data, (StringCheckGrader, TextSimilarityGrader, PythonGrader, ScoreModelGrader, MultiGrader)):
        if item is None:
            return data  # parsed already
        data = data.model_dump(exclude_none=True)
    problems: list[tuple[str, str]] = []
    grader = _parse(data, "grader", problems, item, key=None)
    if problems or grader is None:
        raise GraderValidationError(problems or [("grader", "is not a grader")])
    return grader  # type: ignore[return-value]


def validate(grader: Mapping[str, Any], item: Any = None) -> dict[str, Any]:
    """`POST /v1/fine_tuning/alpha/graders/validate`: `{"grader": <the grader, normalized>}`.
    Raises GraderValidationError."""
    return {"grader": parse_grader(grader, item=item).model_dump(mode="json", exclude_none=True)}


def _parse(data: Any, path: str, problems: list, item: Any, key: str | None) -> AnyGrader | None:
    allowed = MEMBER_TYPES if key is not None else GRADER_TYPES
    if not isinstance(data, Mapping):
        problems.append((path, f"must be a grader object with a `type` ({', '.join(allowed)})"))
        return None
    kind = data.get("type")
    if kind not in allowed:
        problems.append((f"{path}.type", _wrong_type(kind, allowed, key)))
        return None
    fields = dict(data)
    if fields.get("name") is None:
        fields["name"] = key if key is not None else _generated_name()
    if kind == "multi":
        return _parse_multi(fields, path, problems, item)
    try:
        grader = CLASSES[kind].model_validate(fields)
    except ValidationError as error:
        problems.extend(_pydantic_problems(error, path, CLASSES[kind]))
        return None
    problems.extend((f"{path}.{field}", message) for field, message in _CHECKS[kind](grader, item))
    return grader  # type: ignore[return-value]


def _parse_multi(fields: dict, path: str, problems: list, item: Any) -> MultiGrader | None:
    members = fields.get("graders")
    if isinstance(members, Mapping) and isinstance(members.get("type"), str):
        members = {members.get("name") or members["type"]: members}  # the single-grader shape
    if not isinstance(members, Mapping) or not members:
        problems.append((f"{path}.graders", 'must be an object of named graders, e.g. {"a": {...}, "b": {...}}'))
        members = {}
    parsed: dict[str, Any] = {}
    for key, member in members.items():
        member_path = f"{path}.graders.{key}"
        if not str(key).isidentifier() or keyword.iskeyword(key):
            problems.append((member_path, f"`{key}` cannot be named in calculate_output; rename it with "
                                          "letters, digits and underscores, not starting with a digit"))
        parsed[key] = _parse(member, member_path, problems, item, key=str(key))
    try:
        multi = MultiGrader.model_validate({**fields, "graders": {}})
    except ValidationError as error:
        problems.extend(_pydantic_problems(error, path, MultiGrader))
        return None
    try:
        parse_formula(multi.calculate_output, names=list(members))
    except FormulaError as error:
        problems.append((f"{path}.calculate_output", str(error)))
    if any(member is None for member in parsed.values()) or not parsed:
        return None
    return multi.model_copy(update={"graders": parsed})


def _wrong_type(kind: Any, allowed: Sequence[str], key: str | None) -> str:
    if key is not None and kind == "multi":
        return "a multi grader cannot hold another multi grader; put its graders in this one"
    if key is None and kind == "label_model":
        return "label_model is only allowed among a multi grader's graders; use score_model, or a multi grader"
    return f"must be one of {', '.join(allowed)}, not {kind!r}"


def _generated_name() -> str:
    alphabet = string.ascii_letters + string.digits
    return "grader-" + "".join(secrets.choice(alphabet) for _ in range(12))


def _pydantic_problems(error: ValidationError, path: str, cls: type[BaseModel]) -> list[tuple[str, str]]:
    return [(path + _loc(e["loc"]), _explain(e, cls)) for e in error.errors(include_url=False)]


def _loc(loc: Sequence[str | int]) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)


def _explain(error: Mapping[str, Any], cls: type[BaseModel]) -> str:
    if error["type"] == "missing":
        return "is required; add it"
    if error["type"] == "extra_forbidden":
        known = f" (the fields: {', '.join(cls.model_fields)})" if len(error["loc"]) == 1 else ""
        return f"is not a field here; remove it or fix its spelling{known}"
    shown = repr(error.get("input"))
    return f"{error['msg']}, not {shown if len(shown) <= 80 else shown[:77] + '...'}"


def _templates(item: Any, *fields: tuple[str, str]) -> list[tuple[str, str]]:
    return [(field, message) for field, text in fields for message in check_template(text, item)]


def _check_text_similarity(grader: TextSimilarityGrader, item: Any) -> list[tuple[str, str]]:
    problems = _templates(item, ("input", grader.input), ("reference", grader.reference))
    if grader.evaluation_metric == "cosine":
        problems.append(("evaluation_metric", "cosine needs an embeddings model, which this service does not "
                                              "have (OpenAI offers it for evals only, not fine-tuning); use "
                                              + ", ".join(EVALUATION_METRICS[1:])))
    return problems


def _check_python(grader: PythonGrader, item: Any) -> list[tuple[str, str]]:
    size = len(grader.source.encode())
    if size > MAX_SOURCE_BYTES:
        return [("source", f"is {size} bytes; keep it under {MAX_SOURCE_BYTES // 1024} KB")]
    try:
        compile(grader.source, "<grader>", "exec", dont_inherit=True)
        tree = ast.parse(grader.source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        where = f" (line {error.lineno})" if getattr(error, "lineno", None) else ""
        return [("source", f"is not valid Python: {getattr(error, 'msg', error)}{where}")]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "grade":
            return [("source", message) for message in _grade_signature_problems(node.args)]
        if isinstance(node, ast.AsyncFunctionDef) and node.name == "grade":
            return [("source", "`grade` must be a plain function (`def`), not `async def`")]
    if _binds_grade(tree):
        return []  # bound another way (assignment, import): checked when it runs
    return [("source", "defines no `grade` function; add `def grade(sample, item) -> float:` at the top level")]


def _grade_signature_problems(args: ast.arguments) -> list[str]:
    positional = len(args.posonlyargs) + len(args.args)
    required = positional - len(args.defaults)
    required_keywords = sum(default is None for default in args.kw_defaults)
    if required > 2 or required_keywords or (positional < 2 and args.vararg is None):
        return ["`grade` must take two positional arguments, `grade(sample, item)`"]
    return []


def _binds_grade(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "grade" and isinstance(node.ctx, ast.Store):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and \
                any((alias.asname or alias.name) == "grade" for alias in node.names):
            return True
    return False


def _check_messages(messages: Sequence[Message], item: Any) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for i, message in enumerate(messages):
        content = message.content
        parts = content if isinstance(content, list) else [content]
        for j, part in enumerate(parts):
            where = f"input[{i}].content" + (f"[{j}]" if isinstance(content, list) else "")
            if isinstance(part, str):
                problems += _templates(item, (where, part))
            elif isinstance(part, Mapping):
                problems += _check_part(part, where, item)
            else:
                problems.append((where, f"must be text, a content part ({', '.join(PART_TYPES)}) or a list of them"))
    return problems


def _check_part(part: Mapping[str, Any], where: str, item: Any) -> list[tuple[str, str]]:
    try:
        _PART.validate_python(part)
    except ValidationError as error:
        found = []
        for e in error.errors(include_url=False):
            loc = e["loc"][1:] if e["loc"][:1] == (part.get("type"),) else e["loc"]
            message = (f"`type` must be one of {', '.join(PART_TYPES)}" if e["type"].startswith("union_tag")
                       else _explain({**e, "loc": loc}, BaseModel))
            found.append((where + _loc(loc), message))
        return found
    return _templates(item, *((f"{where}.{key}", part[key]) for key in ("text", "image_url") if key in part))


def _check_score_model(grader: ScoreModelGrader, item: Any) -> list[tuple[str, str]]:
    problems = _check_messages(grader.input, item)
    bounds = grader.range
    if bounds is not None and (len(bounds) != 2 or not all(map(math.isfinite, bounds)) or bounds[0] >= bounds[1]):
        problems.append(("range", f"must be two numbers [low, high] with low < high, e.g. [0, 1], not {bounds}"))
    return problems


def _check_label_model(grader: LabelModelGrader, item: Any) -> list[tuple[str, str]]:
    problems = _check_messages(grader.input, item)
    unknown = [label for label in grader.passing_labels if label not in grader.labels]
    if unknown:
        problems.append(("passing_labels", f"{', '.join(map(repr, unknown))} not among labels; every passing "
                                           "label must be one of `labels`"))
    return problems


_CHECKS = {
    "string_check": lambda g, item: _templates(item, ("input", g.input), ("reference", g.reference)),
    "text_similarity": _check_text_similarity,
    "python": _check_python,
    "score_model": _check_score_model,
    "label_model": _check_label_model,
}
