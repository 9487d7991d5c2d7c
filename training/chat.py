"""Which tokens of a chat record carry the loss, under any model's own chat template.

A template with `{% generation %}` markers says so itself (transformers' assistant mask). The
templates real checkpoints ship (Llama 3, Qwen, Mistral, Gemma, Phi, SmolLM, ...) have no such
markers, so each assistant turn is located on the rendered conversation:

* the turn starts where the conversation up to it, rendered with the generation prompt, ends
  (what the model is asked to continue from at inference);
* it ends after the turn's end-of-turn text (`<|eot_id|>`, `<|im_end|>`, `</s>`,
  `<end_of_turn>`, ...): what follows the turn's content up to the first whitespace (a line
  break, or a conversation-final EOS after one, is left to what follows).

The conversation is rendered once, and the template's shape is read once per tokenizer off a
probe conversation: its generation prompt, the text it puts between that prompt and a turn's
content, and its end-of-turn text. Each message's content is then found in the rendering in
order, so the cost is linear in the conversation's length (rendering every prefix, as the
definition reads, is quadratic: a 700-turn record took 22 s). Where a turn's content cannot be
found as given (a template that rewrites it), a conversation of at most `PREFIX_RENDER_MESSAGES`
messages is located by rendering its prefixes: the turn starts where the prefix with the
generation prompt ends, provided the full rendering starts with it; else (Qwen 3 drops earlier
`<think>` reasoning) where the generation prompt ends, or where its content starts, found by
rendering the conversation again with that content replaced by two different markers. Every
span is checked against the rendered text (it must hold the turn's content), so a template
this cannot follow is reported, never trained on silently.

Character spans become token labels through the tokenizer's offsets (a fast tokenizer is
required); a token is trained when it overlaps a span.
"""

from __future__ import annotations

import bisect
import json
import re
import weakref
from dataclasses import dataclass
from typing import Any, Sequence

#: What a chat job trains on: every assistant turn (default), the last one only, or every token.
TRAIN_ON = ("assistant", "last_assistant", "all")
#: What to do with a system message: pass it to the template, or fold it into the first user turn.
SYSTEM_MESSAGE = ("keep", "fold")

_MARKERS = ("\u2b1a\u2460\u2b1a", "\u2b1b\u2461\u2b1b")  # two contents that differ at both ends
#: The longest conversation located by rendering its prefixes (quadratic) when its turns cannot
#: be found in one rendering.
PREFIX_RENDER_MESSAGES = 64


class TemplateError(Exception):
    """The model's chat template cannot express this record. `field` names the part of the
    record, `rule` what the template requires, and the message says how to fix it."""

    def __init__(self, field: str, message: str, rule: str = "template_refused"):
        self.field, self.rule = field, rule
        super().__init__(message)


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    message: int  # index of the assistant message in the record


def _fix_hint(reason: str, messages: Sequence[dict[str, Any]]) -> str:
    low = reason.lower()
    has_system = any(m.get("role") == "system" for m in messages)
    fold = ("set data.system_message to 'fold' to merge the system message into the first user "
            "turn (as Gemma's own templates do), or remove it")
    if "system" in low:
        return fold
    if "alternat" in low:
        alternate = "make roles alternate user/assistant: merge consecutive messages of the same role"
        return f"{alternate}; this template counts a system message as a turn too: {fold}" if has_system else alternate
    return "change the record to the shape the model's chat template accepts"


def _has_generation_markers(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and bool(re.search(r"\{%-?\s*generation\s*-?%\}", template))


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def prepare_messages(messages: Sequence[dict[str, Any]], system_message: str = "keep") -> list[dict[str, Any]]:
    """The messages as the template will see them: `weight` removed, and with `fold` a leading
    system message merged into the first user turn (separated by a blank line)."""
    out = [{k: v for k, v in m.items() if k != "weight"} for m in messages]
    if system_message == "fold" and len(out) > 1 and out[0].get("role") == "system":
        system, rest = out[0], out[1:]
        for m in rest:
            if m.get("role") == "user":
                m["content"] = f"{system.get('content') or ''}\n\n{m.get('content') or ''}"
                break
        out = rest
    return out


def render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any = None,
           add_generation_prompt: bool = False, field: str = "messages") -> str:
    """The template's text for `messages`. Raises TemplateError when the template refuses."""
    if not has_chat_template(tokenizer):
        raise TemplateError(field, "the model has no chat template, so chat records cannot be "
                            "rendered: use a chat/instruct checkpoint, or prompt/completion or "
                            "text records", "no_chat_template")
    try:
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
    except Exception as exc:  # noqa: BLE001 - jinja's TemplateError, raise_exception(), bad input
        raise _refusal(exc, field, messages) from None


def _refusal(exc: Exception, field: str, messages: Sequence[dict[str, Any]]) -> TemplateError:
    reason = str(exc).strip() or type(exc).__name__
    return TemplateError(field, f"the model's chat template refuses it ({reason}): {_fix_hint(reason, messages)}")


def _common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix (slice comparisons, halving: no loop per character)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: str, b: str) -> int:
    return _common_prefix(a[::-1], b[::-1])


def _content_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _content_region(tokenizer: Any, messages: list[dict[str, Any]], i: int, full: str,
                    tools: Any) -> tuple[int, int]:
    """Where message i's content lies in `full` (its rendering), by re-rendering with markers."""
    starts, ends = [], []
    for marker in _MARKERS:
        changed = [dict(m) for m in messages]
        changed[i]["content"] = marker
        other = render(tokenizer, changed, tools)
        starts.append(_common_prefix(full, other))
        ends.append(len(full) - _common_suffix(full, other))
    return min(starts), max(ends)


def _content_tail(message: dict[str, Any]) -> str:
    """The end of a turn's content as templates render it (trimmed, earlier reasoning dropped)."""
    return _content_text(message).split("</think>")[-1].strip()[-32:]


def _turn_end(turn: str, message: dict[str, Any]) -> int:
    """Where a turn rendered last ends: after its content and the end-of-turn text that
    follows it up to the first whitespace (a conversation-final EOS after a line break, as
    Phi-3's template adds, belongs to no turn)."""
    tail = _content_tail(message)
    at = turn.rfind(tail) if tail else -1
    if at < 0:
        return len(turn.rstrip())
    content_end = at + len(tail)
    return content_end + len(re.match(r"\S*", turn[content_end:]).group())


def _check(full: str, span: Span, message: dict[str, Any], field: str) -> None:
    tail = _content_tail(message)
    if tail and tail not in full[span.start:span.end]:
        raise TemplateError(field, "could not find this assistant turn in the chat template's "
                            "rendering of the conversation: this template is not supported for "
                            "training; use one that renders each turn's content as given",
                            "template_unsupported")


def assistant_spans(tokenizer: Any, messages: list[dict[str, Any]], tools: Any = None) -> tuple[str, list[Span]]:
    """The full rendering and each assistant turn's trained character span within it."""
    full = render(tokenizer, messages, tools)
    shape = _shape(tokenizer, tools)
    spans = _spans_in_order(full, messages, shape) if shape is not None else None
    if spans is None:
        if len(messages) > PREFIX_RENDER_MESSAGES:
            raise TemplateError("messages", "could not find each assistant turn's content in the chat template's "
                                f"rendering of this {len(messages)}-message conversation (the template rewrites "
                                f"it): split it into conversations of at most {PREFIX_RENDER_MESSAGES} messages",
                                "template_unsupported")
        spans = _spans_by_prefixes(tokenizer, messages, tools, full)
    for span in spans:
        _check(full, span, messages[span.message], f"messages[{span.message}]")
    return full, spans


@dataclass(frozen=True)
class _Shape:
    """What a template renders around an assistant turn, read off a probe conversation."""

    prompt: str  # the generation prompt (`<|im_start|>assistant\n`; empty for some templates)
    gap: str  # between the generation prompt and the turn's content (a space, an empty think block)
    end: str  # the end-of-turn text


_shapes: "weakref.WeakKeyDictionary[Any, dict[str, _Shape | None]]" = weakref.WeakKeyDictionary()


def _shape(tokenizer: Any, tools: Any) -> _Shape | None:
    """The template's shape (None where the probe's renderings do not nest), once per
    tokenizer and tools."""
    key = json.dumps(tools, sort_keys=True, default=str) if tools else ""
    try:
        known = _shapes.setdefault(tokenizer, {})
    except TypeError:  # a tokenizer that takes no weak reference: read it every time
        known = {}
    if key not in known:
        user, answer = "\u2b1a\u2460", "\u2b1a\u2461"
        asked = [{"role": "user", "content": user}]
        bare = render(tokenizer, asked, tools)
        prompted = render(tokenizer, asked, tools, add_generation_prompt=True)
        answered = render(tokenizer, asked + [{"role": "assistant", "content": answer}], tools)
        at = answered.find(answer, len(prompted))
        if not answered.startswith(prompted) or at < 0:
            shape = None
        else:  # (a template may end a conversation with text it leaves out before a prompt: Phi-3's EOS)
            shape = _Shape(prompted[_common_prefix(bare, prompted):], answered[len(prompted):at],
                           _end_of_turn(tokenizer, tools))
        if len(known) >= 64:
            known.clear()
        known[key] = shape
    return known[key]


def _find_content(full: str, message: dict[str, Any], cursor: int) -> tuple[int, int] | None:
    """Where `message`'s content lies in `full` at or after `cursor`: as given, trimmed, or (a
    template that drops earlier reasoning) its text after `</think>`."""
    text = _content_text(message)
    for candidate in (text, text.strip(), _content_tail(message)):
        if candidate:
            at = full.find(candidate, cursor)
            if at >= 0:
                return at, at + len(candidate)
    return None


def _spans_in_order(full: str, messages: list[dict[str, Any]], shape: _Shape) -> list[Span] | None:
    """Each assistant turn's span, found by locating every message's content in `full` in
    order (one pass); None where an assistant turn's content is not there as given."""
    spans: list[Span] = []
    cursor = 0
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            found = _find_content(full, message, cursor) if _content_text(message).strip() else None
            if found is not None:
                cursor = found[1]
            continue
        if _content_text(message).strip():
            found = _find_content(full, message, cursor)
            if found is None:
                return None
            content_start, content_end = found
            lead = len(shape.gap)
            if full.startswith(shape.gap, content_start - lead) and full.startswith(
                    shape.prompt, content_start - lead - len(shape.prompt)) and content_start - lead >= cursor:
                start = content_start - lead
            else:  # the turn is rendered without the gap here (earlier reasoning dropped)
                at = full.rfind(shape.prompt, cursor, content_start) if shape.prompt else -1
                if at < 0:
                    return None
                start = at + len(shape.prompt)
            if shape.end and full.startswith(shape.end, content_end):
                end = content_end + len(shape.end)
            elif i == len(messages) - 1 or not shape.end:  # what follows, up to the first whitespace
                end = content_end + len(re.match(r"\S*", full[content_end:]).group())
            else:
                closing = full.find(shape.end, content_end)
                if closing < 0:
                    return None
                end = closing + len(shape.end)
        else:  # no content (tool calls only): from the generation prompt to the end-of-turn text
            at = full.find(shape.prompt, cursor) if shape.prompt else -1
            closing = full.find(shape.end, at + len(shape.prompt)) if at >= 0 and shape.end else -1
            if closing < 0:
                return None
            start, end = at + len(shape.prompt), closing + len(shape.end)
        spans.append(Span(start, end, i))
        cursor = end
    return spans


def _spans_by_prefixes(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, full: str) -> list[Span]:
    """Each assistant turn's span by rendering the conversation up to it (quadratic: for
    templates whose rendering of a turn cannot be found as given, in short conversations)."""
    spans: list[Span] = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        field = f"messages[{i}]"
        prompt = render(tokenizer, messages[:i], tools, add_generation_prompt=True, field=field) if i else ""
        through = full if i == len(messages) - 1 else render(tokenizer, messages[: i + 1], tools, field=field)
        if full.startswith(through) and through.startswith(prompt):
            span = Span(len(prompt), len(prompt) + _turn_end(through[len(prompt):], message), i)
        else:
            span = _located_span(tokenizer, messages, i, full, prompt, through, tools)
        spans.append(span)
    return spans


def _end_of_turn(tokenizer: Any, tools: Any) -> str:
    """The text this template puts after an assistant turn's content when another turn follows
    (`<|im_end|>`, `<|eot_id|>`, `</s>`, ...), read off a two-turn probe conversation."""
    user, answer, later = "\u2b1a\u2460", "\u2b1a\u2461", "\u2b1a\u2462"
    probe = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    last = render(tokenizer, probe, tools)
    more = render(tokenizer, probe + [{"role": "user", "content": later}], tools)
    after_last = last[last.rfind(answer) + len(answer):]
    after_more = more[more.rfind(answer) + len(answer):]
    shared = after_last[:_common_prefix(after_last, after_more)]
    return re.match(r"\S*", shared).group()


def _located_span(tokenizer: Any, messages: list[dict[str, Any]], i: int, full: str, prompt: str,
                  through: str, tools: Any) -> Span:
    """A turn rendered differently when it is not last: it starts where the generation prompt
    ends (or, failing that, where its content starts) and ends after the template's
    end-of-turn text that first follows its content."""
    if _content_text(messages[i]):
        start, content_end = _content_region(tokenizer, messages, i, full, tools)
    else:
        start = content_end = len(prompt)
    if full.startswith(prompt) and len(prompt) <= start:
        start = len(prompt)
    end_of_turn = _end_of_turn(tokenizer, tools)
    at = full.find(end_of_turn, content_end) if end_of_turn else -1
    if at < 0:
        if not _content_text(messages[i]):
            raise TemplateError(f"messages[{i}]", "could not find where this assistant turn ends in "
                                "the chat template's rendering: this template is not supported "
                                "for training", "template_unsupported")
        return Span(start, content_end, i)
    return Span(start, at + len(end_of_turn), i)


def label_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[bool]:
    """For each token's (start, end) character offsets: does it overlap a span? (A binary
    search per token over the merged spans: linear in the tokens, whatever the turns.)"""
    merged: list[list[int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    ends = [b for _, b in merged]
    out = []
    for s, e in offsets:
        j = bisect.bisect_right(ends, s)  # the first span ending after s
        if j == len(merged):
            out.append(False)
        elif e > s:
            out.append(merged[j][0] < e)
        else:  # zero-width (an added special token with no text): inside a span or not
            out.append(merged[j][0] <= s)
    return out


def tokenize_chat(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Any = None,
                  train_on: str = "assistant", system_message: str = "keep") -> tuple[list[int], list[bool]]:
    """Token ids of the rendered conversation and, per token, whether it is trained.

    `train_on`: "assistant" (every assistant turn whose `weight` is not 0), "last_assistant"
    (the last such turn), or "all" (every token). Raises TemplateError.
    """
    weights = [m.get("weight", 1) for m in messages]
    prepared = prepare_messages(messages, system_message)
    if system_message == "fold" and len(prepared) < len(messages):
        weights = weights[1:]
    if train_on == "all":
        full = render(tokenizer, prepared, tools)
        ids = tokenizer(full, add_special_tokens=False)["input_ids"]
        return list(ids), [True] * len(ids)
    if train_on == "assistant" and all(w != 0 for w in weights) and _has_generation_markers(tokenizer):
        # The template marks what the model generates itself: use transformers' own mask.
        try:
            out = tokenizer.apply_chat_template(prepared, tools=tools, tokenize=True, return_dict=True,
                                                return_assistant_tokens_mask=True)
        except Exception as exc:  # noqa: BLE001 - as in render()
            raise _refusal(exc, "messages", messages) from None
        return list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]
    if not getattr(tokenizer, "is_fast", False):
        raise TemplateError("model", "assistant-only training needs a fast (Rust) tokenizer with "
                            "character offsets; the model ships only a slow one", "slow_tokenizer")
    full, spans = assistant_spans(tokenizer, prepared, tools)
    spans = [s for s in spans if weights[s.message] != 0]
    if train_on == "last_assistant":
        spans = spans[-1:]
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    mask = label_mask(encoded["offset_mapping"], [(s.start, s.end) for s in spans])
    return list(encoded["input_ids"]), mask


def stop_token_ids(tokenizer: Any, generation_config: Any = None) -> list[int]:
    """The tokens that end a reply: the model's end-of-sequence tokens (its generation config's
    and the tokenizer's), and the chat template's end-of-turn token (`<|eot_id|>`, `<|im_end|>`,
    `<end_of_turn>`, ...) when that is one token."""
    eos = getattr(generation_config, "eos_token_id", None)
    stops = {*([eos] if isinstance(eos, int) else eos or [])}
    if tokenizer.eos_token_id is not None:
        stops.add(tokenizer.eos_token_id)
    if has_chat_template(tokenizer):
        try:
            turn_end = tokenizer(_end_of_turn(tokenizer, None), add_special_tokens=False)["input_ids"]
        except Exception:  # noqa: BLE001 - a template the probe cannot follow: EOS only
            turn_end = []
        if len(turn_end) == 1:
            stops.add(turn_end[0])
    return sorted(stops)
