"""Data at scale: validation time and memory per rank for generated chat datasets.

    .venv/bin/python bench/data_scale.py                 # 10^4, 10^5 and 10^6 examples
    .venv/bin/python bench/data_scale.py --sizes 10000   # one size

For each size, a chat dataset (a user question and an assistant answer per record) is written
as JSONL and tokenised with a real family's tokenizer and chat template (`tiny-qwen2.5`: ChatML
with Qwen's injected default system prompt), as a job's validation does: into the token cache
(memory-mapped Arrow). Then two "ranks" (processes, as the workers of a node) each open the
entry and read every example once, the way an epoch reads them; each reports its private
memory (`RssAnon`: what the process itself holds, not the file pages it maps, which the page
cache shares between ranks) after importing, after opening, and after the pass; and, for
comparison, after also holding the examples as Python lists (the previous in-memory layout).

Writes the table into BENCHMARKS.md between the `data-scale` markers.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "assets" / "models" / "tiny-qwen2.5"
MARK_BEGIN, MARK_END = "<!-- data-scale:begin -->", "<!-- data-scale:end -->"


def rss_anon_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def write_dataset(path: Path, n: int) -> None:
    rng = random.Random(n)
    words = "red blue green cat dog bird tree river stone house garden morning evening".split()
    with open(path, "w") as handle:
        for i in range(n):
            question = " ".join(rng.choice(words) for _ in range(rng.randint(4, 12)))
            answer = " ".join(rng.choice(words) for _ in range(rng.randint(4, 20)))
            handle.write(json.dumps({"messages": [{"role": "user", "content": f"{question}?"},
                                                  {"role": "assistant", "content": f"{answer}."}]}) + "\n")


def rank(data: str, cache: str, out: "mp.Queue") -> None:
    import datasets  # noqa: F401 - imported before the baseline: its code is not data
    from transformers import AutoTokenizer

    from eft.training.datacache import load_examples_cached

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    base = rss_anon_mb()
    loaded = load_examples_cached(data, tokenizer, 512, cache)
    opened = rss_anon_mb()
    tokens = 0
    examples = loaded.examples
    for i in range(len(examples)):
        tokens += len(examples[i].input_ids)
    passed = rss_anon_mb()
    as_lists = [examples[i] for i in range(len(examples))]  # the in-memory layout, for comparison
    held = rss_anon_mb()
    out.put({"base": base, "opened": opened - base, "after_pass": passed - base, "as_lists": held - base,
             "tokens": tokens, "examples": len(as_lists)})


def measure(n: int, work: Path) -> dict:
    import datasets  # noqa: F401 - imported before the baseline: its code is not data
    from transformers import AutoTokenizer

    from eft.training.data import TokenizeOptions
    from eft.training.datacache import cache_key, load_examples_cached

    data = work / f"chat-{n}.jsonl"
    write_dataset(data, n)
    cache = work / f"cache-{n}"
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    before = rss_anon_mb()
    started = time.perf_counter()
    loaded = load_examples_cached(str(data), tokenizer, 512, str(cache))
    validation_s = time.perf_counter() - started
    validator_mb = rss_anon_mb() - before
    entry = cache / cache_key(str(data), tokenizer, TokenizeOptions(512))
    arrow_mb = (entry / "data.arrow").stat().st_size / 2**20
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank, args=(str(data), str(cache), out)) for _ in range(2)]
    for p in procs:
        p.start()
    ranks = [out.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join()
    tokens = int(loaded.lengths.sum())
    return {"examples": n, "tokens": tokens, "jsonl_mb": data.stat().st_size / 2**20, "arrow_mb": arrow_mb,
            "validation_s": validation_s, "validator_anon_mb": validator_mb,
            "rank_opened_mb": max(r["opened"] for r in ranks), "rank_after_pass_mb": max(r["after_pass"] for r in ranks),
            "rank_as_lists_mb": max(r["as_lists"] for r in ranks)}


def table(rows: list[dict]) -> str:
    lines = [
        "| examples | tokens | JSONL MB | Arrow cache MB | validation s | examples/s | validator +MB | "
        "rank +MB opened | rank +MB after a full pass | +MB if held as lists |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['examples']:,} | {r['tokens']:,} | {r['jsonl_mb']:.1f} | {r['arrow_mb']:.1f} | "
            f"{r['validation_s']:.1f} | {r['examples'] / r['validation_s']:,.0f} | {r['validator_anon_mb']:.1f} | "
            f"{r['rank_opened_mb']:.1f} | {r['rank_after_pass_mb']:.1f} | {r['rank_as_lists_mb']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="eft-data-scale-") as tmp:
        for n in args.sizes:
            rows.append(measure(n, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
               f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.1f} GiB, Python "
               f"{platform.python_version()}")
    body = (f"{MARK_BEGIN}\nMeasured by `bench/data_scale.py` on {machine}; tokenizer and chat template "
            f"of `tiny-qwen2.5`, max_seq_len 512, one process tokenising.\n\n{table(rows)}\n{MARK_END}")
    print(body)
    if not args.no_write:
        path = ROOT / "BENCHMARKS.md"
        text = path.read_text()
        if MARK_BEGIN in text:
            text = text[: text.index(MARK_BEGIN)] + body + text[text.index(MARK_END) + len(MARK_END):]
        else:
            text += "\n## Data at scale\n\n" + body + "\n"
        path.write_text(text)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
