"""The `text_similarity` metrics (`training/graders/similarity.py`): each equals its library's
value computed here directly, and hand-checked values hold (identical, disjoint, partial)."""

from __future__ import annotations

import pytest
from nltk.tokenize import NLTKWordTokenizer
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
from nltk.translate.gleu_score import sentence_gleu
from nltk.translate.meteor_score import meteor_score
from rapidfuzz import fuzz, utils
from rouge_score.rouge_scorer import RougeScorer

from eft.training.graders import grade
from eft.training.graders.similarity import METRICS, NoSynonyms, similarity

HYPOTHESIS, REFERENCE = "the cat sat on the mat", "the cat sat on a mat"
PAIRS = [(HYPOTHESIS, REFERENCE),
         ("The quick brown fox jumps over the lazy dog.", "A quick brown dog jumps over a fox!"),
         ("Paris is the capital of France", "The capital of France is Paris"), ("cats running", "the cat runs")]
tokens = NLTKWordTokenizer().tokenize


def _library(metric: str, text: str, reference: str) -> float:
    if metric == "fuzzy_match":
        return fuzz.WRatio(text, reference, processor=utils.default_process) / 100
    if metric == "bleu":
        return sentence_bleu([tokens(reference)], tokens(text), smoothing_function=SmoothingFunction().method4)
    if metric == "gleu":
        return sentence_gleu([tokens(reference)], tokens(text))
    if metric == "meteor":
        return meteor_score([tokens(reference)], tokens(text), wordnet=NoSynonyms())
    kind = {"rouge_l": "rougeL"}.get(metric, metric.replace("_", ""))
    return RougeScorer([kind]).score(reference, text)[kind].fmeasure


@pytest.mark.parametrize("metric", sorted(METRICS))
@pytest.mark.parametrize("text, reference", PAIRS)
def test_each_metric_is_its_librarys_value(metric, text, reference):
    assert similarity(metric, text, reference) == pytest.approx(_library(metric, text, reference))


@pytest.mark.parametrize("metric", sorted(METRICS))
def test_identical_disjoint_and_empty_texts(metric):
    identical = similarity(metric, HYPOTHESIS, HYPOTHESIS)
    # METEOR's fragmentation penalty keeps one chunk of 6 words under 1: 1 - 0.5 * (1/6)^3
    assert identical == pytest.approx(1 - 0.5 / 6 ** 3 if metric == "meteor" else 1.0)
    assert similarity(metric, "vex rum", "bag") == 0.0  # no word, and no character, in common
    assert similarity(metric, "", HYPOTHESIS) == 0.0 and similarity(metric, HYPOTHESIS, "  ") == 0.0


# "the cat sat on the mat" against "the cat sat on a mat", by hand: clipped matches of 1- to
# 4-grams 5/6, 3/5, 2/4, 1/3; the longest common subsequence is 5 words.
@pytest.mark.parametrize("metric, expected", [
    ("bleu", (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25),  # lengths equal: no brevity penalty
    ("gleu", (5 + 3 + 2 + 1) / (6 + 5 + 4 + 3)),
    ("rouge_1", 5 / 6), ("rouge_2", 3 / 5), ("rouge_3", 2 / 4), ("rouge_4", 1 / 3), ("rouge_5", 0 / 2),
    ("rouge_l", 5 / 6),
])
def test_a_partial_match_by_hand(metric, expected):
    assert similarity(metric, HYPOTHESIS, REFERENCE) == pytest.approx(expected)


def test_meteor_by_hand():
    # "the cat sat" against "the cat sat down": 3 matches, P = 1, R = 3/4, one chunk
    f_mean = (1 * 0.75) / (0.9 * 1 + 0.1 * 0.75)
    assert similarity("meteor", "the cat sat", "the cat sat down") == pytest.approx(f_mean * (1 - 0.5 * (1 / 3) ** 3))


def test_fuzzy_match_by_hand():
    assert similarity("fuzzy_match", "hello", "hallo") == pytest.approx(0.8)  # 2 * 4 common / 10 characters
    assert similarity("fuzzy_match", "Hello World!", "hello world") == 1.0  # case and punctuation ignored


def test_meteor_matches_stems_but_has_no_synonyms():
    assert similarity("meteor", "cats", "cat") > 0.4  # Porter stems match
    assert similarity("meteor", "big", "large") == 0.0  # a synonym only with WordNet, never downloaded


def test_the_grader_reads_its_templates_and_scores_with_the_metric():
    grader = {"type": "text_similarity", "name": "t", "input": "{{ sample.output_text }}",
              "reference": "{{ item.summary }}", "evaluation_metric": "rouge_l", "pass_threshold": 0.5}
    assert grade(grader, HYPOTHESIS, {"summary": REFERENCE}).score == pytest.approx(5 / 6)
