"""The demo datasets of the bundled tiny model: small rule-based worlds in the three accepted
shapes (chat, prompt/completion, text), generated offline and byte-identical on every run.
Written by `python -m devkit.tiny --out assets` (devkit/tiny.py); committed under
assets/data/.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Callable

SEED = 1234
SYSTEM_PROMPT = "You are a helpful assistant. Answer in one short sentence."

# ----------------------------------------------------------------------------------------------
# Vocabulary for the synthetic language. Small on purpose: a ~1M-parameter model can only learn
# a narrow world, and every word recurring often is what makes the demo learnable in few steps.
# ----------------------------------------------------------------------------------------------

ANIMALS = (
    "cat dog bird fish fox owl bear frog duck horse cow pig sheep goat mouse rabbit lion tiger "
    "wolf deer hen bee ant snake"
).split()
PEOPLE = "boy girl man woman farmer teacher baker king queen doctor sailor child".split()
ADJECTIVES = "red blue green little big old young happy sad quick slow tall brave kind shy".split()
PLACES = (
    "the park|the river|the hill|the forest|the garden|the house|the town|the lake|the barn|"
    "the road|the sea|the school|the market|the bridge"
).split("|")
THINGS = (
    "a ball|a hat|a book|an apple|a cake|a box|a key|a cup|a kite|a coin|a shoe|a bell|a map|"
    "a stone|a flower|a letter"
).split("|")
MOTIONS = "walked ran jumped swam flew hopped went came".split()
FEELINGS = "happy sad tired hungry glad afraid proud calm".split()
OPPOSITES = {
    "hot": "cold", "big": "small", "up": "down", "fast": "slow", "old": "new", "happy": "sad",
    "light": "dark", "tall": "short", "wet": "dry", "open": "closed", "early": "late",
    "hard": "soft", "full": "empty", "near": "far", "loud": "quiet", "rich": "poor",
    "strong": "weak", "day": "night", "left": "right", "in": "out", "good": "bad",
    "clean": "dirty", "first": "last", "high": "low",
}
COLORS = {
    "banana": "yellow", "grass": "green", "sky": "blue", "snow": "white", "coal": "black",
    "lemon": "yellow", "tomato": "red", "leaf": "green", "cloud": "white", "carrot": "orange",
    "cherry": "red", "orange": "orange", "frog": "green", "crow": "black", "sea": "blue",
    "milk": "white", "plum": "purple", "strawberry": "red", "pumpkin": "orange", "night": "dark",
}
IRREGULAR_PLURALS = {
    "mouse": "mice", "child": "children", "man": "men", "woman": "women", "sheep": "sheep",
    "goose": "geese", "foot": "feet", "tooth": "teeth", "fish": "fish", "deer": "deer",
    "wolf": "wolves", "leaf": "leaves",
}
DAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
MONTHS = (
    "January February March April May June July August September October November December"
).split()
NUMBER_WORDS = "zero one two three four five six seven eight nine ten".split()


def _plural(noun: str) -> str:
    if noun in IRREGULAR_PLURALS:
        return IRREGULAR_PLURALS[noun]
    return noun + ("es" if noun.endswith(("s", "x", "ch", "sh")) else "s")


def _words(rng: random.Random, low: int = 3, high: int = 6) -> str:
    """A short lower-case phrase from the vocabulary, used by the copy-style skills."""
    pool = ANIMALS + PEOPLE + ADJECTIVES + FEELINGS + list(OPPOSITES)
    return " ".join(rng.choice(pool) for _ in range(rng.randint(low, high)))


# ----------------------------------------------------------------------------------------------
# Skills: every reply follows a fixed rule of its prompt, so held-out examples are predictable
# and a LoRA adapter visibly learns them. Each returns (question, answer, fact-as-prose).
# ----------------------------------------------------------------------------------------------

Skill = Callable[[random.Random], tuple[str, str, str]]


def skill_add(rng: random.Random) -> tuple[str, str, str]:
    a, b = rng.randint(0, 30), rng.randint(0, 30)
    question = rng.choice(("What is {a} plus {b}?", "Add {a} and {b}.", "What is {a} + {b}?"))
    answer = f"{a} plus {b} is {a + b}."
    return question.format(a=a, b=b), answer, answer


def skill_subtract(rng: random.Random) -> tuple[str, str, str]:
    a = rng.randint(1, 40)
    b = rng.randint(0, a)
    question = rng.choice(("What is {a} minus {b}?", "Subtract {b} from {a}."))
    answer = f"{a} minus {b} is {a - b}."
    return question.format(a=a, b=b), answer, answer


def skill_opposite(rng: random.Random) -> tuple[str, str, str]:
    word, other = rng.choice(sorted(OPPOSITES.items()))
    if rng.random() < 0.5:
        word, other = other, word
    question = rng.choice(("What is the opposite of {w}?", "Give me the opposite of '{w}'."))
    answer = f"The opposite of {word} is {other}."
    return question.format(w=word), answer, answer


def skill_color(rng: random.Random) -> tuple[str, str, str]:
    thing, color = rng.choice(sorted(COLORS.items()))
    question = rng.choice(("What color is {t}?", "Tell me the color of {t}."))
    answer = f"The {thing} is {color}."
    return question.format(t=f"the {thing}"), answer, answer


def skill_plural(rng: random.Random) -> tuple[str, str, str]:
    noun = rng.choice(ANIMALS + PEOPLE + sorted(IRREGULAR_PLURALS))
    answer = f"The plural of {noun} is {_plural(noun)}."
    return f"What is the plural of {noun}?", answer, answer


def skill_next(rng: random.Random) -> tuple[str, str, str]:
    kind = rng.choice(("day", "month", "number"))
    if kind == "number":
        n = rng.randint(0, 98)
        item, nxt = str(n), str(n + 1)
    else:
        seq = DAYS if kind == "day" else MONTHS
        i = rng.randrange(len(seq))
        item, nxt = seq[i], seq[(i + 1) % len(seq)]
    answer = f"The {kind} after {item} is {nxt}."
    return f"What {kind} comes after {item}?", answer, answer


def skill_repeat(rng: random.Random) -> tuple[str, str, str]:
    phrase = _words(rng)
    return f"Repeat after me: {phrase}", phrase, f"She said {phrase} and he said {phrase}."


def skill_first_last(rng: random.Random) -> tuple[str, str, str]:
    phrase = _words(rng)
    which = rng.choice(("first", "last"))
    word = phrase.split()[0 if which == "first" else -1]
    prose = f"In '{phrase}' the {which} word is {word}."
    return f"What is the {which} word of: {phrase}", f"The {which} word is {word}.", prose


def skill_number_word(rng: random.Random) -> tuple[str, str, str]:
    n = rng.randint(0, 10)
    answer = f"{n} is written {NUMBER_WORDS[n]}."
    return f"How do you write {n} in words?", answer, answer


SKILLS: tuple[Skill, ...] = (
    skill_add, skill_subtract, skill_opposite, skill_color, skill_plural, skill_next,
    skill_repeat, skill_first_last, skill_number_word,
)


# ----------------------------------------------------------------------------------------------
# Examples in the three dataset shapes, and the pretraining prose.
# ----------------------------------------------------------------------------------------------


def chat_example(rng: random.Random) -> dict:
    """One or two user/assistant turns, a fixed system prompt on some examples."""
    messages = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": SYSTEM_PROMPT})
    for _ in range(1 if rng.random() < 0.75 else 2):
        question, answer, _ = rng.choice(SKILLS)(rng)
        messages.append({"role": "user", "content": question})
        messages.append({"role": "assistant", "content": answer})
    return {"messages": messages}


def preference_example(rng: random.Random) -> dict:
    """A question with the right reply preferred over a wrong one: the answer to another
    question of the same skill (plausible, but wrong) or of another skill (off topic)."""
    skill = rng.choice(SKILLS)
    question, answer, _ = skill(rng)
    other = skill if rng.random() < 0.6 else rng.choice(SKILLS)
    for _ in range(20):
        wrong = other(rng)[1]
        if wrong != answer:
            break
    messages = [{"role": "user", "content": question}]
    if rng.random() < 0.4:
        messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
    return {"input": {"messages": messages},
            "preferred_output": [{"role": "assistant", "content": answer}],
            "non_preferred_output": [{"role": "assistant", "content": wrong}]}


def reinforcement_example(rng: random.Random) -> dict:
    """A question with one exact answer (sums and differences of small numbers) for reinforcement
    fine-tuning, in OpenAI's shape: a chat whose last message is the user's, and the fields the
    graders read as `{{ item.* }}`: `answer`, the number the reply must give."""
    skill = rng.choice((skill_add, skill_subtract))
    question, reply, _ = skill(rng)
    return {"messages": [{"role": "user", "content": question}], "answer": reply.rstrip(".").rsplit(" ", 1)[1]}


def completion_example(rng: random.Random) -> dict:
    question, answer, _ = rng.choice(SKILLS)(rng)
    return {"prompt": f"Question: {question}\nAnswer:", "completion": f" {answer}"}


def facts(rng: random.Random) -> str:
    """A short paragraph of facts: the skills' knowledge as plain prose."""
    return " ".join(rng.choice(SKILLS)(rng)[2] for _ in range(rng.randint(3, 5)))


def text_example(rng: random.Random) -> dict:
    return {"text": facts(rng)}


def story(rng: random.Random) -> str:
    """Synthetic children's-book prose: the base model's pretraining language."""
    who = rng.choice(ANIMALS + PEOPLE)
    name = f"the {rng.choice(ADJECTIVES)} {who}"
    place, other = rng.sample(PLACES, 2)
    thing = rng.choice(THINGS)
    sentences = [
        f"Once upon a time {name} lived near {place}.",
        f"Every {rng.choice(DAYS)} the {who} {rng.choice(MOTIONS)} to {other}.",
        f"One day the {who} found {thing} by {rng.choice(PLACES)}.",
        f"It had {NUMBER_WORDS[rng.randint(2, 10)]} {_plural(rng.choice(ANIMALS))} with it.",
        f"The {who} was very {rng.choice(FEELINGS)}.",
        f"In {rng.choice(MONTHS)} the {who} {rng.choice(MOTIONS)} home with {thing}.",
        f"The {rng.choice(ANIMALS)} said that {rng.randint(2, 30)} is a good number.",
        f"The sky was {COLORS['sky']} and the grass was {COLORS['grass']}.",
    ]
    rng.shuffle(sentences)
    return " ".join(sentences[: rng.randint(3, len(sentences))])


def echo(rng: random.Random) -> str:
    """Prose that repeats a random phrase: it rewards copying from earlier in the context (what
    the repeat and first/last-word skills need) and puts every word and number in varied
    contexts, so no embedding the demo needs is left untrained."""
    pool = ANIMALS + PEOPLE + ADJECTIVES + FEELINGS + list(OPPOSITES) + DAYS + MONTHS
    parts = []
    for _ in range(rng.randint(1, 3)):
        phrase = " ".join(
            str(rng.randint(0, 99)) if rng.random() < 0.15 else rng.choice(pool)
            for _ in range(rng.randint(1, 7))
        )
        a, b = rng.sample(ANIMALS + PEOPLE, 2)
        parts.append(rng.choice((
            f"The {a} said {phrase}. Then the {b} said {phrase} too.",
            f"The {a} wrote {phrase} on {rng.choice(THINGS)}, and the {b} read {phrase}.",
            f"{phrase}, said the {a}. {phrase}, said the {b}.",
        )))
    return " ".join(parts)


def unique_split(make: Callable[[random.Random], dict], n_train: int, n_valid: int,
                 rng: random.Random) -> tuple[list[dict], list[dict]]:
    """Draw distinct examples so no validation row also appears in the training split."""
    seen: set[str] = set()
    rows: list[dict] = []
    for _ in range(50 * (n_train + n_valid)):  # bounded: the generators have ample variety
        row = make(rng)
        key = json.dumps(row, sort_keys=True)
        if key not in seen:
            seen.add(key)
            rows.append(row)
            if len(rows) == n_train + n_valid:
                return rows[:n_train], rows[n_train:]
    raise RuntimeError(f"{make.__name__} produced only {len(rows)} distinct examples")


# ----------------------------------------------------------------------------------------------
# Writing the datasets.
# ----------------------------------------------------------------------------------------------

# name -> (example maker, training rows, validation rows). Sizes keep the committed files small
# (well under 2 MB together) while the chat set still covers roughly one epoch of the demo job.
DATASETS: dict[str, tuple[Callable[[random.Random], dict], int, int]] = {
    "chat": (chat_example, 1600, 160),
    "completion": (completion_example, 600, 100),
    "text": (text_example, 600, 100),
    "preference": (preference_example, 600, 100),
    "reinforcement": (reinforcement_example, 400, 100),
}
#: Datasets whose words the tokenizer is not trained on (their words are the other datasets').
NOT_IN_TOKENIZER = ("reinforcement",)

DATA_README = """\
# Bundled datasets

Generated by `python -m devkit.tiny --out assets` (`--data-only` writes only these files).
They are synthetic and rule-based: every reply follows from its prompt, so a small model learns
them quickly and a held-out split measures real learning. Generation is seeded
(`random.Random("{seed}:<name>")`), so rebuilding gives byte-identical files; no row of a
`_valid` file appears in the matching `_train` file.

The skills: addition and subtraction of small numbers ("7 plus 5 is 12."), opposites
("The opposite of hot is cold."), colors of things, plurals, the next day/month/number,
repeating a phrase, the first or last word of a phrase, and writing a number in words. Rows
are distinct, but the lookup skills draw on small tables, so the same fact (not the same row)
can appear in both splits, as world knowledge would.

| File | Rows | Shape |
|------|------|-------|
{table}

* `chat_*`: `{{"messages": [{{"role": "system"|"user"|"assistant", "content": ...}}, ...]}}`.
  One user/assistant turn (about 75%) or two; about 40% open with the fixed system prompt
  `{system}`
  This is the demo task: train on the assistant tokens only.
* `completion_*`: `{{"prompt": "Question: ...\\nAnswer:", "completion": " ..."}}`, the same
  skills as prompt/completion pairs; the loss belongs on the completion.
* `preference_*`: `{{"input": {{"messages": [...]}}, "preferred_output": [{{"role": "assistant", ...}}],
  "non_preferred_output": [...]}}`, preference pairs for DPO: the right reply to a question is
  preferred over the reply to another question (of the same skill, or of another).
* `reinforcement_*`: `{{"messages": [{{"role": "user", "content": "What is 7 plus 5?"}}], "answer": "12"}}`,
  for reinforcement fine-tuning: the reply is graded against `answer` (a `string_check` grader
  on `{{{{ item.answer }}}}`, or a `python` grader that reads the reply's number).
* `text_*`: `{{"text": ...}}`, paragraphs of three to five of the same facts as plain prose,
  for plain language-model fine-tuning.
"""


def write_if_changed(path: Path, text: str) -> bool:
    """Write only when the content differs, so reruns leave committed files and mtimes alone."""
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return True


def build_splits() -> dict[str, list[dict]]:
    """Every dataset file's rows, keyed by file stem (e.g. 'chat_train')."""
    splits: dict[str, list[dict]] = {}
    for name, (make, n_train, n_valid) in DATASETS.items():
        # A per-dataset seed keeps each file stable when another dataset's recipe changes.
        train, valid = unique_split(make, n_train, n_valid, random.Random(f"{SEED}:{name}"))
        splits[f"{name}_train"], splits[f"{name}_valid"] = train, valid
    return splits


def write_data(out: Path) -> dict[str, list[dict]]:
    splits = build_splits()
    demo = out / "data" / "demo"
    table = []
    for stem, rows in splits.items():
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        path = demo / f"{stem}.jsonl"
        changed = write_if_changed(path, text)
        print(f"{'wrote' if changed else 'unchanged'} {path} ({len(rows)} rows, {len(text)} bytes)")
        table.append(f"| `demo/{stem}.jsonl` | {len(rows)} | {stem.split('_')[0]} |")
    readme = DATA_README.format(seed=SEED, table="\n".join(table), system=SYSTEM_PROMPT)
    path = out / "data" / "README.md"
    print(f"{'wrote' if write_if_changed(path, readme) else 'unchanged'} {path}")
    return splits
