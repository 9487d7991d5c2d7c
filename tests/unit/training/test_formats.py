"""Schema checks of dataset records: every shape, and problems named by line and field."""

import json

from eft.training.formats import check_record, detect_format, scan_jsonl


def test_detects_each_shape():
    assert detect_format({"messages": []}) == "chat"
    assert detect_format({"prompt": "a", "completion": "b"}) == "prompt_completion"
    assert detect_format({"text": "a"}) == "text"
    assert detect_format({"foo": 1}) is None
    assert detect_format([1, 2]) is None


def test_valid_records_have_no_problems():
    chat = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                         {"role": "assistant", "content": "a"}]}
    assert check_record(chat) == ("chat", [])
    assert check_record({"prompt": "p", "completion": "c"}) == ("prompt_completion", [])
    assert check_record({"text": "t"}) == ("text", [])


def test_chat_problems_name_the_field():
    record = {"messages": [{"role": "user", "content": "  "}, {"role": "robot", "content": "x"},
                           {"role": "user", "content": "u", "weight": 1},
                           {"role": "assistant", "content": "a", "weight": 0}], "tools": "none"}
    _, problems = check_record(record)
    fields = {f for f, _ in problems}
    assert "messages[0].content" in fields
    assert "messages[1].role" in fields
    assert "messages[2].weight" in fields  # only assistant turns are weighted
    assert "messages" in fields  # no assistant turn with weight 1
    assert "tools" in fields


def test_tool_calls_and_weights_are_openai_chat():
    record = {"messages": [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny.", "weight": 1},
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": "You are welcome.", "weight": 0},
    ], "tools": [{"type": "function", "function": {"name": "weather", "parameters": {}}}]}
    assert check_record(record) == ("chat", [])
    _, problems = check_record({"messages": [{"role": "assistant", "content": "hi"}]})
    assert [f for f, _ in problems] == ["messages[0].role"]


def test_prompt_completion_missing_and_wrong_type():
    _, problems = check_record({"prompt": 3})
    assert ("completion", "is missing") in problems
    assert any(f == "prompt" and "string" in m for f, m in problems)


def test_scan_reports_line_numbers_and_caps(tmp_path):
    path = tmp_path / "d.jsonl"
    lines = [json.dumps({"text": "ok"}), "{not json", "", json.dumps({"text": ""})]
    lines += [json.dumps({"nope": i}) for i in range(30)]
    path.write_text("\n".join(lines) + "\n")
    scan = scan_jsonl(path, max_problems=5)
    assert scan.records == 33  # the blank line is skipped
    assert scan.formats == {"text": 1}
    assert [p.line for p in scan.problems[:2]] == [2, 4]
    assert "not valid JSON" in scan.problems[0].message
    assert len(scan.problems) == 5 and scan.problems_total == 32
