"""A training worker imports what its job uses: a LoRA job loads its model without bitsandbytes
(PEFT imports it whenever it is installed, ~3 s of every worker's start); a QLoRA job keeps it.

Each case runs in a fresh interpreter, as a worker starts.
"""

import subprocess
import sys
from tests.helpers.paths import REPO

TINY = REPO / "assets" / "models" / "tiny-llama"


def _loaded_after_loading(method: str) -> tuple[bool, str]:
    code = (
        "import sys\n"
        "from eft.training.config import LoraSpec, TrainConfig\n"
        "from eft.training.model import load_trainable_model, skip_unused_quantization\n"
        f"cfg = TrainConfig(job_id='j', model_path={str(TINY)!r}, training_file='', validation_file=None,\n"
        f"                  method={method!r}, lora=LoraSpec(), total_steps=1, num_train_examples=1)\n"
        "skip_unused_quantization(cfg)\n"
        "import peft\n"
        "model = load_trainable_model(cfg) if cfg.method == 'lora' else None\n"
        "print('bitsandbytes' in sys.modules and sys.modules['bitsandbytes'] is not None, type(model).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=300, cwd=REPO).stdout.split()
    return out[0] == "True", out[1]


def test_a_lora_worker_never_imports_bitsandbytes():
    loaded, model = _loaded_after_loading("lora")
    assert not loaded and model == "PeftModelForCausalLM"


def test_a_qlora_worker_keeps_bitsandbytes():
    loaded, _ = _loaded_after_loading("qlora")
    assert loaded  # PEFT found and imported it, as QLoRA needs
