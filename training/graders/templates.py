"""Grader templates: `{{ item.answer }}`, `{{ item.ground_truth.date }}`, `{{ sample.output_text }}`,
`{{ sample.output_json.email }}`, `{{ sample.output_tools[0].function.name }}`.

OpenAI's rules (graders guide, "Templating"): a reference is `{{ namespace.variable }}`, the only
namespaces are `item` (the dataset row) and `sample` (the model's output), and nested values are
reached with a JSON-path-like syntax. The sample namespace holds `output_text`, `output_json` (the
output parsed as JSON; in `/graders/run` "populated if the model sample is a valid JSON string"),
`output_tools`, `choices` and `output_audio`.

What this module does:
- a value that is a string is substituted as it is; anything else as JSON (`1.0`, `true`,
  `{"a": 1}`);
- a path reads object keys (`.key`) and list indexes (`[0]`, or `.0` on a list);
- a reference to `sample.output_json` of a sample that is not JSON raises `SampleParseError`
  (the grader scores 0 and the run reports `sample_parse_error`); a path that the item or the
  sample does not have raises `InvalidVariableError` (`invalid_variable_error`);
- `check` finds the problems a grader can be refused for before it runs: a malformed reference,
  a namespace other than `item`/`sample`, a sample variable that does not exist, and, when an
  item is given, an item path it does not have.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

NAMESPACES = ("item", "sample")
SAMPLE_VARIABLES = ("output_text", "output_json", "output_tools", "choices", "output_audio")

_TEMPLATE = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_PATH = re.compile(r"[A-Za-z_][\w-]*")
_STEP = re.compile(r"\.([^.\[\]\s]+)|\[(\d+)\]")


class TemplateError(ValueError):
    """A reference that cannot be substituted. `kind` is the error flag of OpenAI's run
    response it is reported as."""

    kind = "invalid_variable_error"


class InvalidVariableError(TemplateError):
    kind = "invalid_variable_error"


class SampleParseError(TemplateError):
    kind = "sample_parse_error"


@dataclass(frozen=True)
class Reference:
    """One `{{ ... }}` of a template: `text` as written inside the braces, its namespace and
    the path of keys (str) and indexes (int) under it."""

    text: str
    namespace: str
    path: tuple[str | int, ...]


def parse_reference(text: str) -> Reference:
    """The reference written inside one pair of braces. Raises InvalidVariableError, saying
    how to write it, when it is not `namespace.variable[...]`."""
    text = text.strip()
    head = _PATH.match(text)
    if head is None or head.group() not in NAMESPACES:
        raise InvalidVariableError(f"`{{{{ {text} }}}}`: a reference starts with a namespace, "
                                   f"`item` or `sample` (e.g. `{{{{ item.answer }}}}`)")
    path: list[str | int] = []
    position = head.end()
    while position < len(text):
        step = _STEP.match(text, position)
        if step is None:
            raise InvalidVariableError(f"`{{{{ {text} }}}}`: cannot read the path from "
                                       f"`{text[position:]}`; write keys as `.key` and indexes as `[0]`")
        path.append(step.group(1) if step.group(1) is not None else int(step.group(2)))
        position = step.end()
    if not path:
        raise InvalidVariableError(f"`{{{{ {text} }}}}` names no variable; write "
                                   f"`{{{{ {text}.<field> }}}}`")
    return Reference(text, head.group(), tuple(path))


def references(template: str) -> list[Reference]:
    """Every reference of a template, in order. Raises InvalidVariableError for a malformed one."""
    return [parse_reference(match.group(1)) for match in _TEMPLATE.finditer(template)]


def make_sample(output_text: str, *, output_tools: list | None = None, choices: list | None = None,
                output_audio: Any = None) -> dict[str, Any]:
    """The sample namespace of a model's reply: `output_json` is the reply parsed as JSON, None
    when it is not JSON."""
    return {"output_text": output_text, "output_json": _parse_json(output_text),
            "output_tools": output_tools or [], "choices": choices or [], "output_audio": output_audio}


def sample_namespace(sample: str | Mapping[str, Any]) -> dict[str, Any]:
    """A sample as graders read it: a string is a reply's text; a mapping keeps what it has, and
    gets `output_json` parsed from `output_text` when it has none."""
    if isinstance(sample, str):
        return make_sample(sample)
    namespace = dict(sample)
    if namespace.get("output_json") is None and isinstance(namespace.get("output_text"), str):
        namespace["output_json"] = _parse_json(namespace["output_text"])
    return namespace


def resolve(reference: Reference, sample: Mapping[str, Any], item: Any) -> Any:
    """The value a reference names. Raises SampleParseError or InvalidVariableError."""
    if reference.namespace == "sample":
        variable = reference.path[0]
        if variable == "output_json" and sample.get("output_json") is None:
            raise SampleParseError(f"`{{{{ {reference.text} }}}}`: the sample is not valid JSON, so it "
                                   f"has no output_json")
        value: Any = sample
    elif item is None:
        raise InvalidVariableError(f"`{{{{ {reference.text} }}}}`: no item was given; pass the dataset "
                                   f"row as the item")
    else:
        value = item
    for depth, step in enumerate(reference.path):
        child, found = _step(value, step)
        if not found:
            where = "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in reference.path[:depth])
            raise InvalidVariableError(f"`{{{{ {reference.text} }}}}`: {reference.namespace}{where} has "
                                       f"no {_describe(step)}{_keys_hint(value)}")
        value = child
    return value


def render(template: str, sample: Mapping[str, Any], item: Any) -> str:
    """The template with every reference substituted (strings as they are, other values as
    JSON). Raises a TemplateError subclass naming the reference."""
    def substitute(match: re.Match) -> str:
        value = resolve(parse_reference(match.group(1)), sample, item)
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    return _TEMPLATE.sub(substitute, template)


def check(template: str, item: Any = None) -> list[str]:
    """What is wrong with a template's references, each message naming the reference; with an
    item, also the item paths it does not have."""
    problems: list[str] = []
    for match in _TEMPLATE.finditer(template):
        try:
            reference = parse_reference(match.group(1))
            if reference.namespace == "sample" and reference.path[0] not in SAMPLE_VARIABLES:
                raise InvalidVariableError(
                    f"`{{{{ {reference.text} }}}}`: `{reference.path[0]}` is not a sample variable; use "
                    f"one of {', '.join(SAMPLE_VARIABLES)}")
            if reference.namespace == "item" and item is not None:
                resolve(reference, {}, item)
        except TemplateError as error:
            problems.append(str(error))
    return problems


def _step(value: Any, step: str | int) -> tuple[Any, bool]:
    if isinstance(value, Mapping):
        key = str(step)
        return (value[key], True) if key in value else (None, False)
    if isinstance(value, list):
        index = step if isinstance(step, int) else int(step) if str(step).isdigit() else None
        if index is not None and index < len(value):
            return value[index], True
    return None, False


def _describe(step: str | int) -> str:
    return f"index [{step}]" if isinstance(step, int) else f"field `{step}`"


def _keys_hint(value: Any) -> str:
    if value is None:
        return " (it is null); fix the reference or the data"
    if isinstance(value, Mapping):
        keys = ", ".join(sorted(str(k) for k in value)[:20]) or "none"
        return f" (its fields: {keys}); fix the reference or the data"
    if isinstance(value, list):
        return f" (it is a list of {len(value)}); fix the reference or the data"
    return f" (it is {type(value).__name__}, not an object); fix the reference or the data"


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None
