"""Where the repository and its bundled assets are, for every test whatever its directory."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "assets" / "models"
TINY_LLAMA = MODELS / "tiny-llama"
DEMO_DATA = REPO / "assets" / "data" / "demo"
#: The model servers' Python (vLLM's environment): .venv-serve, or EFT_SERVING_PYTHON (`make
#: gpu-check` points it at a CUDA build of vLLM).
SERVE_PYTHON = Path(os.environ.get("EFT_SERVING_PYTHON") or REPO / ".venv-serve" / "bin" / "python")
