"""Where the repository and its bundled assets are, for every test whatever its directory."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "assets" / "models"
TINY_LLAMA = MODELS / "tiny-llama"
DEMO_DATA = REPO / "assets" / "data" / "demo"
