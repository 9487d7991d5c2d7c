#!/bin/sh
# Install eft into a virtual environment: the one recipe `make setup` (and so CI), the
# Dockerfile and the cluster launcher configs run.
#   sh deploy/install.sh VENV TORCH_VERSION [EXTRAS]
#   e.g. sh deploy/install.sh .venv 2.13.0 server,test
# EXTRAS defaults to `server` (the service and the training workers); the client alone is a plain
# `pip install .`. Every package is pinned by deploy/constraints.txt, the environment CI tests.
# TORCH_INDEX_URL picks the torch build (e.g. https://download.pytorch.org/whl/cu128 for CUDA
# 12.8, .../whl/cpu for CPU); unset, pip's configured index decides.
set -eu
VENV=$1
TORCH_VERSION=$2
EXTRAS=${3:-server}
CONSTRAINTS="$(dirname "$0")/constraints.txt"
PYTHON=${PYTHON:-python3}

test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# torch first, pinned: a looser requirement pulled in by another package would fetch another build.
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    "$VENV/bin/python" -m pip install --quiet "torch==$TORCH_VERSION" --index-url "$TORCH_INDEX_URL"
else
    "$VENV/bin/python" -m pip install --quiet "torch==$TORCH_VERSION"
fi
"$VENV/bin/python" -m pip install --quiet -c "$CONSTRAINTS" -e ".[$EXTRAS]"
# DeepSpeed builds its CPU communication op the first time a ZeRO job starts (about 30 s, in the
# job's first step). Build it here once, into torch's extension cache, so no job waits for it.
# Skipped where there is a GPU (DeepSpeed uses NCCL there) or DeepSpeed is not installed.
"$VENV/bin/python" - <<'PY' || echo "note: DeepSpeed's CPU communication op was not prebuilt; the first ZeRO job builds it"
import importlib.util
import torch
if importlib.util.find_spec("deepspeed") and not torch.cuda.is_available():
    from deepspeed.comm.torch import build_shm_op
    build_shm_op()
PY
