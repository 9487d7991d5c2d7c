"""The bundled verifiable task (assets/data/demo/reinforcement_*.jsonl): OpenAI's reinforcement rows
(a chat ending with the user's turn, and the `answer` graders read), each answer exact, graded by
the documented grader: the right reply scores 1, a wrong one 0."""

from __future__ import annotations

import json
import re

import pytest

from eft.training.graders import grade, parse_grader
from tests.helpers.paths import DEMO_DATA

GRADER = {"type": "string_check", "name": "answer", "operation": "like",
          "input": "{{ sample.output_text }}", "reference": " {{ item.answer }}."}


@pytest.mark.parametrize("split", ["train", "valid"])
def test_every_row_is_a_prompt_with_its_exact_answer_and_grades_right_and_wrong_replies(split):
    rows = [json.loads(line) for line in (DEMO_DATA / f"reinforcement_{split}.jsonl").read_text().splitlines()]
    assert len(rows) == {"train": 400, "valid": 100}[split]
    for row in rows:
        assert [m["role"] for m in row["messages"]] == ["user"]
        question = row["messages"][0]["content"]
        numbers = [int(n) for n in re.findall(r"\d+", question)]
        if "Subtract" in question:
            expected = numbers[1] - numbers[0]
        elif "minus" in question:
            expected = numbers[0] - numbers[1]
        else:
            expected = numbers[0] + numbers[1]
        assert row["answer"] == str(expected), row
        parse_grader(GRADER, item=row)
    row = rows[0]
    right, wrong = f"The answer is {row['answer']}.", f"The answer is {int(row['answer']) + 1}."
    assert grade(GRADER, right, row).score == 1.0 and grade(GRADER, wrong, row).score == 0.0
    if split == "valid":  # held out: no validation row is a training row
        trained = set((DEMO_DATA / "reinforcement_train.jsonl").read_text().splitlines())
        assert not trained & set((DEMO_DATA / "reinforcement_valid.jsonl").read_text().splitlines())
