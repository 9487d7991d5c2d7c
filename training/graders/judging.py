"""Model graders (`score_model`, and `label_model` inside a multi grader): the prompt sent to a
judge model and how its reply becomes a score.

OpenAI (graders guide, "Score model graders"): the grader's messages, templates substituted, go
to `model` with `sampling_params`, asking for the response format
`{"result": float, "steps": [{"description": string, "conclusion": string}]}`; the result is
"truncated to the given range" (`range`, default [0, 1]) and "default to 0 for all non-numeric
outputs". A label model picks one of `labels`; a label among `passing_labels` scores 1, any
other 0.

Here the call itself is the caller's: a `Judge` is `judge(model, messages, sampling_params) ->
str`, the reply's text (so this package makes no HTTP calls). It should ask its model for
`SCORE_RESPONSE_FORMAT` (or `label_response_format(labels)`), as OpenAI does. Its reply is read
leniently: a JSON object's `result`, or else the whole reply as a number (score) or a label; a
reply in a Markdown code fence is unwrapped. A judge raises `JudgeRefusal` when its model refused
(`model_grader_refusal_error`); any other exception is a `model_grader_server_error`. The judge's
token usage is not seen, so `token_usage` stays null in run responses.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Mapping, Sequence

from eft.training.graders.models import Message
from eft.training.graders.templates import render

Judge = Callable[[str, list, dict], str]

_STEPS = {"type": "array", "items": {
    "type": "object", "additionalProperties": False, "required": ["description", "conclusion"],
    "properties": {"description": {"type": "string"}, "conclusion": {"type": "string"}}}}
#: The structured output a judge asks its model for, as a chat completions `response_format`.
SCORE_RESPONSE_FORMAT: dict[str, Any] = {"type": "json_schema", "json_schema": {
    "name": "score_model_grader", "strict": True, "schema": {
        "type": "object", "additionalProperties": False, "required": ["steps", "result"],
        "properties": {"steps": _STEPS, "result": {"type": "number"}}}}}


class JudgeRefusal(Exception):
    """Raised by a judge whose model refused to grade."""


class ReplyError(ValueError):
    """A judge's reply that is not a score or one of the labels."""


def label_response_format(labels: Sequence[str]) -> dict[str, Any]:
    """The structured output a judge asks its model for, for a label model grader."""
    return {"type": "json_schema", "json_schema": {"name": "label_model_grader", "strict": True, "schema": {
        "type": "object", "additionalProperties": False, "required": ["steps", "result"],
        "properties": {"steps": _STEPS, "result": {"type": "string", "enum": list(labels)}}}}}


def render_messages(messages: Sequence[Message], sample: Mapping[str, Any], item: Any) -> list[dict[str, Any]]:
    """The grader's messages with their templates (texts and image URLs) substituted, as
    `{"role", "content"}` dicts. Raises a TemplateError naming the reference."""
    return [{"role": m.role, "content": _render_content(m.content, sample, item)} for m in messages]


def parse_score(reply: str, bounds: tuple[float, float]) -> float:
    """The score of a judge's reply, clamped to `bounds`. Raises ReplyError."""
    value = _result(reply)
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ReplyError(f"the judge's reply is not a score: {_clip(reply)}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ReplyError(f"the judge's reply has no numeric result: {_clip(reply)}")
    low, high = bounds
    return min(high, max(low, float(value)))


def parse_label(reply: str, labels: Sequence[str]) -> str:
    """The label a judge's reply names. Raises ReplyError when it is not one of `labels`."""
    value = _result(reply)
    label = value.strip() if isinstance(value, str) else value
    if label not in labels:
        raise ReplyError(f"the judge's reply is not one of the labels ({', '.join(labels)}): {_clip(reply)}")
    return label


def _result(reply: str) -> Any:
    text = reply.strip()
    if text.startswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value.get("result") if isinstance(value, dict) else value


def _render_content(content: Any, sample: Mapping[str, Any], item: Any) -> Any:
    if isinstance(content, str):
        return render(content, sample, item)
    if isinstance(content, list):
        return [_render_content(part, sample, item) for part in content]
    return {key: render(value, sample, item) if key in ("text", "image_url") and isinstance(value, str) else value
            for key, value in content.items()}


def _clip(text: str, limit: int = 200) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
