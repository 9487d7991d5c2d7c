# make setup  - create .venv with torch (CPU wheel pinned first) and this project, build the bundled model
# make demo   - set up if needed, then run a real LoRA job through the running service
# make test   - set up if needed, then run the whole test suite
# make bench  - set up if needed, then the benchmarks: planner vs measured memory, recovery costs (BENCHMARKS.md)

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
STAMP := $(VENV)/.eft-setup-done
MODEL := assets/models/tiny-llama/config.json

.PHONY: setup demo test test-unit clean bench

setup: $(STAMP) $(MODEL)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned: a looser requirement pulled in by another package would fetch a CUDA build.
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

$(MODEL): $(STAMP) training/tiny.py
	$(PY) -m training.tiny --out assets

demo: setup
	$(PY) examples/demo.py

test: setup
	$(PY) -m pytest tests

test-unit: setup
	$(PY) -m pytest tests/unit

clean:
	rm -rf $(VENV) assets/models

bench: setup
	$(PY) bench/memory.py
	$(PY) bench/recovery.py
