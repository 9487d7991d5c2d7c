"""The `text_similarity` grader's metrics: a score in [0, 1] for how close `input` is to
`reference`.

OpenAI documents the metrics only by name and library (graders guide, "Text similarity grader";
Azure OpenAI's RFT guide says the same): `fuzzy_match` "using rapidfuzz", `bleu`, `gleu` (Google
BLEU), `meteor`, `rouge_1`..`rouge_5` and `rouge_l` "as defined by the rouge python library", and
`cosine` over `text-embedding-3-large` embeddings "only available for evals". OpenAI's Python
grader image ships rapidfuzz 3.10, nltk 3.9 and rouge-score 0.1.2, the libraries used here. The
exact settings are not published; this module's choices:

- `fuzzy_match`: `rapidfuzz.fuzz.WRatio(input, reference, processor=utils.default_process) / 100`
  (lower-cased, other characters than letters and digits read as spaces; the scorer of OpenAI's
  own rapidfuzz example in the graders guide).
- `bleu`: nltk's `sentence_bleu` against the one reference, uniform 1- to 4-gram weights, with
  Chen & Cherry's smoothing method 4 (sentence-level BLEU is 0 for any short reply without a
  4-gram match otherwise); case-sensitive.
- `gleu`: nltk's `sentence_gleu`, 1- to 4-grams; case-sensitive.
- `meteor`: nltk's `meteor_score` (alpha 0.9, beta 3, gamma 0.5, lower-cased, Porter stems).
  Its synonym stage needs the WordNet corpus, which is a download; nothing is downloaded at run
  time here, so it is given a WordNet with no synsets: words match exactly or by stem, never as
  synonyms (OpenAI's image has WordNet, so its METEOR can be higher where synonyms match).
  Identical texts score just under 1 (METEOR's fragmentation penalty), and nltk aligns repeated
  words greedily from the end, which can count more chunks than the best alignment.
- `rouge_1`..`rouge_5`, `rouge_l`: rouge-score's `rouge1`..`rouge5`, `rougeL` F-measure, the
  library's default tokenizer (lower-cased, ASCII letters and digits only: text in other scripts
  scores 0) and no stemming.
- `bleu`, `gleu`, `meteor` split words with nltk's `NLTKWordTokenizer` (the Treebank rules of
  `word_tokenize`, which need no downloaded data).
- An empty input or reference scores 0 under every metric.
- `cosine` is refused when a grader is validated (no embeddings model here).

The libraries are imported on first use (nltk takes about half a second to import).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable

ROUGE_TYPES = {"rouge_1": "rouge1", "rouge_2": "rouge2", "rouge_3": "rouge3", "rouge_4": "rouge4",
               "rouge_5": "rouge5", "rouge_l": "rougeL"}


def similarity(metric: str, text: str, reference: str) -> float:
    """The `metric` score of `text` against `reference`, in [0, 1]. Raises KeyError for a
    metric this service does not compute."""
    scorer = METRICS[metric]
    if not text.strip() or not reference.strip():
        return 0.0
    return min(1.0, max(0.0, float(scorer(text, reference))))


def fuzzy_match(text: str, reference: str) -> float:
    from rapidfuzz import fuzz, utils

    return fuzz.WRatio(text, reference, processor=utils.default_process) / 100.0


def bleu(text: str, reference: str) -> float:
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    hypothesis, references = _words(text), [_words(reference)]
    return sentence_bleu(references, hypothesis, smoothing_function=SmoothingFunction().method4)


def gleu(text: str, reference: str) -> float:
    from nltk.translate.gleu_score import sentence_gleu

    return sentence_gleu([_words(reference)], _words(text))


class NoSynonyms:
    """A WordNet stand-in with no synsets, for nltk's METEOR: exact and stem matches only."""

    def synsets(self, *args: Any, **kwargs: Any) -> list:
        return []


def meteor(text: str, reference: str) -> float:
    from nltk.translate.meteor_score import meteor_score

    return meteor_score([_words(reference)], _words(text), wordnet=NoSynonyms())


def _rouge(kind: str) -> Callable[[str, str], float]:
    def score(text: str, reference: str) -> float:
        return _rouge_scorer(kind).score(reference, text)[kind].fmeasure

    return score


@lru_cache(maxsize=None)
def _rouge_scorer(kind: str) -> Any:
    from rouge_score.rouge_scorer import RougeScorer

    return RougeScorer([kind], use_stemmer=False)


def _words(text: str) -> list[str]:
    return _tokenizer().tokenize(text)


@lru_cache(maxsize=1)
def _tokenizer() -> Any:
    from nltk.tokenize import NLTKWordTokenizer

    return NLTKWordTokenizer()


METRICS: dict[str, Callable[[str, str], float]] = {
    "fuzzy_match": fuzzy_match, "bleu": bleu, "gleu": gleu, "meteor": meteor,
    **{metric: _rouge(kind) for metric, kind in ROUGE_TYPES.items()},
}
