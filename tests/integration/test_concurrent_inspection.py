"""The first requests a fresh replica serves come at once: many threads inspect the same
not-yet-inspected model and load its tokenizer while transformers is still being imported.
transformers' lazy module does not support importing from several threads at once (a thread
saw `transformers.LlamaForCausalLM` missing: a 500 under 50 concurrent clients); inspection
and tokenizer loading run one at a time per process.

Each case runs in a fresh interpreter, where nothing of transformers is imported yet.
"""

import subprocess
import sys

from tests.helpers.paths import REPO

MODELS = REPO / "assets" / "models"

CODE = """
import sys, threading
from eft.service.requests.model_support import inspect_model
from eft.service.requests.templates import tokenizer_problem
paths = sys.argv[1:]
results, errors = [], []
barrier = threading.Barrier(16)

def work(i):
    barrier.wait()
    try:
        path = paths[i % len(paths)]
        results.append((path, inspect_model(path).architecture, tokenizer_problem(path)))
    except Exception as exc:
        errors.append(repr(exc))

threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
for t in threads: t.start()
for t in threads: t.join()
print(len(results), len(errors), errors[:1], sorted({r[1] for r in results}), {r[2] for r in results})
"""


def test_a_fresh_process_inspects_models_from_many_threads_at_once():
    paths = [str(MODELS / "tiny-llama"), str(MODELS / "tiny-qwen2.5"), str(MODELS / "tiny-gemma-2")]
    out = subprocess.run([sys.executable, "-c", CODE, *paths], capture_output=True, text=True, check=True,
                         timeout=300, cwd=REPO).stdout.strip().splitlines()[-1]
    assert out.startswith("16 0 []"), out
    assert "{None}" in out  # every tokenizer loaded
