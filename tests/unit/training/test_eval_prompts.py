"""The validation prompts a job replies to at each evaluation: each example's tokens before its
first trained token, and the trained run after them as the reference reply."""

from __future__ import annotations

from eft.training.data import IGNORE_INDEX, Example
from eft.training.evaluation import sample_prompts

X = IGNORE_INDEX


def test_prompt_is_what_precedes_the_first_trained_token_and_the_reference_its_run():
    chat = Example(input_ids=[1, 2, 3, 4, 5, 6, 7, 8], labels=[X, X, X, 4, 5, X, 7, 8])
    text = Example(input_ids=[9, 10, 11], labels=[9, 10, 11])  # every token trained: no prompt before 1
    untrained = Example(input_ids=[1, 2], labels=[X, X])
    second = Example(input_ids=[5, 6, 7], labels=[X, 6, 7])
    assert sample_prompts([chat, untrained, text, second], 2) == [([1, 2, 3], [4, 5]), ([9], [10, 11])]
    assert sample_prompts([chat, second], 5) == [([1, 2, 3], [4, 5]), ([5], [6, 7])]
    assert sample_prompts([chat], 0) == []
