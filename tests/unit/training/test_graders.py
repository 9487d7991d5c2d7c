"""Reinforcement graders (`training/graders/`): OpenAI's grader objects validated with every
problem named by its path, templates, each grader type's score, and the `/graders/run` response
checked against the `openai` package's own type.

Run: .venv/bin/python -m pytest -q tests/unit/training/test_graders*.py
"""

from __future__ import annotations

import re

import pytest
from openai.types.fine_tuning.alpha import GraderRunResponse
from rapidfuzz import fuzz, utils

from eft.training.graders import (GraderValidationError, JudgeRefusal, PythonOutcome, grade, grade_many,
                                  make_sample, parse_grader, run, validate)
from eft.training.graders.templates import InvalidVariableError, SampleParseError, render, sample_namespace

ANSWER = {"type": "string_check", "name": "answer", "operation": "eq",
          "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}"}


def _problems(grader: dict, item: dict | None = None) -> dict[str, str]:
    with pytest.raises(GraderValidationError) as raised:
        parse_grader(grader, item=item)
    return dict(raised.value.problems)


# Validation


def test_validate_returns_the_grader_normalized_with_names_filled():
    unnamed = {key: value for key, value in ANSWER.items() if key != "name"}
    normalized = validate(unnamed)["grader"]
    assert re.fullmatch(r"grader-[A-Za-z0-9]{12}", normalized.pop("name"))  # as OpenAI names one
    assert normalized == {key: value for key, value in ANSWER.items() if key != "name"}
    multi = validate({"type": "multi", "name": "m", "calculate_output": "a", "graders": {"a": unnamed}})["grader"]
    assert multi["graders"]["a"]["name"] == "a"
    python = validate({"type": "python", "name": "p", "source": "def grade(s, i):\n    return 1", "image_tag": "x"})
    assert python["grader"]["image_tag"] == "x"  # accepted, and ignored when it runs


def test_a_multi_grader_also_takes_the_sdks_single_grader_shape():
    grader = parse_grader({"type": "multi", "name": "m", "calculate_output": "answer * 2", "graders": ANSWER})
    assert list(grader.graders) == ["answer"]
    assert grade(grader, "Paris", {"answer": "Paris"}).score == 2.0


@pytest.mark.parametrize("grader, param, says", [
    ({**ANSWER, "operation": "contains"}, "grader.operation", "'eq', 'ne', 'like' or 'ilike', not 'contains'"),
    ({"type": "multi", "name": "m", "calculate_output": "a", "graders": {"a": {**ANSWER, "operation": "like%"}}},
     "grader.graders.a.operation", "'eq', 'ne', 'like' or 'ilike'"),
    ({k: v for k, v in ANSWER.items() if k != "reference"}, "grader.reference", "is required; add it"),
    ({**ANSWER, "refrence": "x"}, "grader.refrence", "remove it or fix its spelling"),
    ({"type": "text_similarity", "name": "t", "input": "a", "reference": "b", "evaluation_metric": "cosine"},
     "grader.evaluation_metric", "embeddings model, which this service does not have"),
    ({"type": "text_similarity", "name": "t", "input": "a", "reference": "b", "evaluation_metric": "rouge_6"},
     "grader.evaluation_metric", "'rouge_5' or 'rouge_l', not 'rouge_6'"),
    ({"type": "multi", "name": "m", "calculate_output": "inner",
      "graders": {"inner": {"type": "multi", "calculate_output": "a", "graders": {"a": ANSWER}}}},
     "grader.graders.inner.type", "cannot hold another multi grader"),
    ({"type": "label_model", "name": "l", "model": "m", "input": [], "labels": ["a"], "passing_labels": ["a"]},
     "grader.type", "only allowed among a multi grader's graders"),
    ({"type": "regex", "name": "r"}, "grader.type", "must be one of string_check, text_similarity"),
    ({"type": "python", "name": "p", "source": "def score(sample, item):\n    return 1"},
     "grader.source", "defines no `grade` function"),
    ({"type": "python", "name": "p", "source": "def grade(sample, item):\n    return 1 +"},
     "grader.source", "is not valid Python: invalid syntax (line 2)"),
    ({"type": "python", "name": "p", "source": "def grade(sample):\n    return 1"},
     "grader.source", "two positional arguments"),
    ({"type": "python", "name": "p", "source": "def grade(s, i):\n    return 1\n" + "#" * 300_000},
     "grader.source", "keep it under 256 KB"),
    ({"type": "score_model", "name": "s", "model": "m", "input": [{"role": "user", "content": "x"}], "range": [1, 0]},
     "grader.range", "two numbers [low, high] with low < high"),
    ({"type": "score_model", "name": "s", "model": "m",
      "input": [{"role": "user", "content": [{"type": "input_text"}]}]},
     "grader.input[0].content[0].text", "is required"),
    ({"type": "score_model", "name": "s", "model": "m", "input": [{"role": "judge", "content": "x"}]},
     "grader.input[0].role", "'user', 'assistant', 'system' or 'developer'"),
    ({"type": "multi", "name": "m", "calculate_output": "l", "graders": {"l": {
        "type": "label_model", "model": "m", "input": [{"role": "user", "content": "x"}],
        "labels": ["good", "bad"], "passing_labels": ["great"]}}},
     "grader.graders.l.passing_labels", "'great' not among labels"),
    ({"type": "multi", "name": "m", "calculate_output": "1", "graders": {"a-b": ANSWER}},
     "grader.graders.a-b", "cannot be named in calculate_output"),
    ({"type": "multi", "name": "m", "calculate_output": "answer + extra", "graders": {"answer": ANSWER}},
     "grader.calculate_output", "`extra` in calculate_output is not one of the graders (answer)"),
    ({**ANSWER, "input": "{{ sample.output }}"}, "grader.input", "`output` is not a sample variable"),
    ({**ANSWER, "input": "{{ items.answer }}"}, "grader.input", "starts with a namespace, `item` or `sample`"),
    ({**ANSWER, "input": "{{ item }}"}, "grader.input", "names no variable"),
])
def test_problems_name_the_field_and_the_fix(grader, param, says):
    problems = _problems(grader)
    assert param in problems, problems
    assert says in problems[param]


def test_every_problem_is_reported_together():
    with pytest.raises(GraderValidationError) as raised:
        parse_grader({"type": "multi", "name": "m", "calculate_output": "a + zz", "graders": {
            "a": {**ANSWER, "operation": "is"}, "b": {"type": "python", "name": "p", "source": "x = 1"}}})
    params = [param for param, _ in raised.value.problems]
    assert params == ["grader.graders.a.operation", "grader.graders.b.source", "grader.calculate_output"]
    assert raised.value.param == "grader.graders.a.operation"
    assert "grader.graders.b.source: defines no `grade`" in str(raised.value)


def test_with_an_item_every_item_reference_must_exist_in_it():
    grader = {**ANSWER, "reference": "{{ item.answr }}", "input": "{{ item.meta.lang }}"}
    problems = _problems(grader, item={"answer": "Paris", "meta": {"locale": "fr"}})
    assert problems["grader.reference"] == ("`{{ item.answr }}`: item has no field `answr` (its fields: answer, "
                                            "meta); fix the reference or the data")
    assert "`{{ item.meta.lang }}`: item.meta has no field `lang` (its fields: locale)" in problems["grader.input"]
    parse_grader(grader)  # without an item, only the shape of the references is checked


# Templates


def test_templates_read_nested_paths_indexes_and_json():
    sample = sample_namespace({"output_text": '{"city": "Paris", "tags": ["a", "b"]}',
                               "output_tools": [{"function": {"name": "lookup"}}]})
    item = {"a": {"b": "deep"}, "n": 1.5, "flag": True, "obj": {"x": [1]}}
    template = ("{{ item.a.b }}|{{item.n}}|{{ item.flag }}|{{ item.obj }}|{{ sample.output_json.city }}|"
                "{{ sample.output_json.tags[1] }}|{{ sample.output_tools[0].function.name }}")
    assert render(template, sample, item) == 'deep|1.5|true|{"x": [1]}|Paris|b|lookup'


def test_a_reference_that_does_not_resolve_names_itself():
    with pytest.raises(InvalidVariableError, match=re.escape("`{{ item.a.c }}`: item.a has no field `c`")):
        render("{{ item.a.c }}", make_sample("x"), {"a": {"b": 1}})
    with pytest.raises(InvalidVariableError, match=re.escape("item.xs has no index [2] (it is a list of 1)")):
        render("{{ item.xs[2] }}", make_sample("x"), {"xs": [0]})
    with pytest.raises(SampleParseError, match="the sample is not valid JSON"):
        render("{{ sample.output_json.city }}", make_sample("Paris"), {})


def test_a_sample_that_is_not_json_scores_zero_with_a_sample_parse_error():
    grader = {**ANSWER, "input": "{{ sample.output_json.city }}"}
    assert grade(grader, '{"city": "Paris"}', {"answer": "Paris"}).score == 1.0
    result = grade(grader, "Paris", {"answer": "Paris"})
    assert result.score == 0.0 and [e.kind for e in result.errors] == ["sample_parse_error"]
    missing = run(ANSWER, "Paris", {"solution": "Paris"})
    assert missing["reward"] == 0.0 and missing["metadata"]["errors"]["invalid_variable_error"]
    assert "item has no field `answer`" in missing["metadata"]["errors"]["invalid_variable_error_details"]


# string_check


@pytest.mark.parametrize("operation, text, reference, expected", [
    ("eq", "Paris", "Paris", 1.0), ("eq", "paris", "Paris", 0.0), ("eq", "Paris.", "Paris", 0.0),
    ("ne", "Lyon", "Paris", 1.0), ("ne", "Paris", "Paris", 0.0),
    ("like", "It is Paris.", "Paris", 1.0), ("like", "It is paris.", "Paris", 0.0),
    ("like", "Paris", "P%", 0.0),  # `like` is "contains", not SQL's wildcard pattern
    ("ilike", "IT IS PARIS", "Paris", 1.0), ("ilike", "Lyon", "paris", 0.0),
])
def test_string_check_operations(operation, text, reference, expected):
    grader = {**ANSWER, "operation": operation}
    assert grade(grader, text, {"answer": reference}).score == expected


# Model graders (a fake judge)


class FakeJudge:
    def __init__(self, reply: str | Exception):
        self.reply, self.calls = reply, []

    def __call__(self, model, messages, sampling_params):
        self.calls.append((model, messages, sampling_params))
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply


SCORER = {"type": "score_model", "name": "judge", "model": "gpt-4o-2024-08-06", "range": [0, 10],
          "sampling_params": {"temperature": 0.2, "seed": 7},
          "input": [{"role": "system", "content": "Score from 0 to 10."},
                    {"role": "user", "content": [{"type": "input_text", "text": "Reference: {{ item.answer }}"},
                                                 "Answer: {{ sample.output_text }}"]}]}


def test_score_model_sends_the_rendered_prompt_and_reads_the_result():
    judge = FakeJudge('{"steps": [{"description": "d", "conclusion": "c"}], "result": 7.5}')
    result = grade(SCORER, "Lyon", {"answer": "Paris"}, judge=judge)
    assert result.score == 7.5 and result.model == "gpt-4o-2024-08-06" and not result.errors
    model, messages, params = judge.calls[0]
    assert model == "gpt-4o-2024-08-06" and params == {"temperature": 0.2, "seed": 7}
    assert messages == [{"role": "system", "content": "Score from 0 to 10."},
                        {"role": "user", "content": [{"type": "input_text", "text": "Reference: Paris"},
                                                     "Answer: Lyon"]}]


@pytest.mark.parametrize("reply, score, error", [
    ('{"result": 42}', 10.0, None),  # truncated to the range
    ('{"result": -3, "steps": []}', 0.0, None),
    ("6", 6.0, None),
    ('```json\n{"result": 4}\n```', 4.0, None),
    ("I think it is good", 0.0, "model_grader_parse_error"),
    ('{"result": "high"}', 0.0, "model_grader_parse_error"),
    ('{"result": NaN}', 0.0, "model_grader_parse_error"),
    (JudgeRefusal("I cannot help with that"), 0.0, "model_grader_refusal_error"),
    (TimeoutError("upstream took too long"), 0.0, "model_grader_server_error"),
])
def test_score_model_replies(reply, score, error):
    result = grade(SCORER, "x", {"answer": "y"}, judge=FakeJudge(reply))
    assert result.score == score
    assert [e.kind for e in result.errors] == ([error] if error else [])


def test_a_model_grader_without_a_judge_is_refused_before_it_runs():
    multi = {"type": "multi", "name": "m", "calculate_output": "s", "graders": {"s": SCORER}}
    with pytest.raises(GraderValidationError) as raised:
        grade(multi, "x", {"answer": "y"})
    assert raised.value.param == "grader.graders.s.model" and "need a judge model" in str(raised.value)


def test_a_label_model_inside_a_multi_grader_passes_its_passing_labels():
    labeler = {"type": "label_model", "model": "m", "labels": ["correct", "partly", "wrong"],
               "passing_labels": ["correct", "partly"],
               "input": [{"role": "user", "content": "{{ sample.output_text }}"}]}
    multi = {"type": "multi", "name": "m", "calculate_output": "label", "graders": {"label": labeler}}
    assert grade(multi, "x", judge=FakeJudge('{"result": "partly"}')).score == 1.0
    assert grade(multi, "x", judge=FakeJudge("wrong")).score == 0.0
    unknown = grade(multi, "x", judge=FakeJudge("maybe"))
    assert unknown.score == 0.0 and unknown.errors[0].kind == "model_grader_parse_error"


# Multi graders and the run response


MULTI = {"type": "multi", "name": "profile", "calculate_output": "(name + email) / 2",
         "graders": {"name": {"type": "text_similarity", "input": "{{ sample.output_json.name }}",
                              "reference": "{{ item.name }}", "evaluation_metric": "fuzzy_match"},
                     "email": {"type": "string_check", "input": "{{ sample.output_json.email }}",
                               "reference": "{{ item.email }}", "operation": "eq"}}}
ITEM = {"name": "John Doe", "email": "john.doe@gmail.com"}


def test_a_multi_grader_combines_its_graders_with_its_formula():
    result = grade(MULTI, '{"name": "Jon Doe", "email": "john.doe@gmail.com"}', ITEM)
    name = fuzz.WRatio("Jon Doe", "John Doe", processor=utils.default_process) / 100
    assert result.sub_scores == {"name": pytest.approx(name), "email": 1.0}
    assert result.score == pytest.approx((name + 1.0) / 2) and 0.5 < result.score < 1.0


def test_a_failed_member_counts_zero_and_its_error_names_it():
    result = grade(MULTI, '{"name": "John Doe"}', ITEM)
    assert result.sub_scores == {"name": 1.0, "email": 0.0} and result.score == 0.5
    response = run(MULTI, '{"name": "John Doe"}', ITEM)
    assert response["metadata"]["errors"]["invalid_variable_error_details"].startswith(
        "email: `{{ sample.output_json.email }}`: sample.output_json has no field `email`")


def test_a_formula_without_a_finite_value_scores_zero_with_an_error():
    multi = {**MULTI, "calculate_output": "name / (email - 1)"}
    result = grade(multi, '{"name": "John Doe", "email": "john.doe@gmail.com"}', ITEM)
    assert result.score == 0.0 and result.errors[0].kind == "other_error"
    assert "division by zero" in result.errors[0].message


def test_the_run_response_has_openais_shape():
    response = run(MULTI, '{"name": "John Doe", "email": "x@y.z"}', ITEM)
    parsed = GraderRunResponse.model_validate(response)  # the openai package's own type
    assert parsed.reward == 0.5 and parsed.sub_rewards == {"name": 1.0, "email": 0.0}
    assert parsed.metadata.name == "profile" and parsed.metadata.type == "multi"
    assert parsed.metadata.scores == {"name": 1.0, "email": 0.0}
    assert parsed.metadata.errors.sample_parse_error is False and parsed.metadata.execution_time >= 0
    scored = GraderRunResponse.model_validate(run(SCORER, "x", {"answer": "y"}, judge=FakeJudge("3")))
    assert scored.reward == 3.0 and scored.metadata.sampled_model_name == "gpt-4o-2024-08-06"


def test_python_graders_of_a_batch_run_in_one_call_and_their_errors_map_to_openais_flags():
    calls = []

    def runner(source, pairs):
        calls.append(pairs)
        return [PythonOutcome(0.25), PythonOutcome(None, "ZeroDivisionError: division by zero", "runtime"),
                PythonOutcome(None, "timed out after 10 s", "timeout")]

    python = {"type": "python", "name": "p", "source": "def grade(sample, item):\n    return 0.25"}
    results = grade_many(python, [("a", {"k": 1}), ("b", None), ("c", {"k": 3})], python_runner=runner)
    assert len(calls) == 1 and [item for _, item in calls[0]] == [{"k": 1}, {}, {"k": 3}]
    assert calls[0][0][0]["output_text"] == "a"
    assert [r.score for r in results] == [0.25, 0.0, 0.0]
    assert [e.kind for r in results for e in r.errors] == ["python_grader_runtime_error", "python_grader_server_error"]
    timeout = run(python, "c", python_runner=lambda source, pairs: [PythonOutcome(None, "timed out after 10 s",
                                                                                  "timeout")])
    assert timeout["metadata"]["errors"]["python_grader_server_error_type"] == "timeout"
