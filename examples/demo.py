"""The demo: a real LoRA job through the running service, then the adapter loaded back.

Run it with `make demo` (or `.venv/bin/python examples/demo.py [--keep]`). It starts a local
Ray and the service on Ray Serve (unless they already run), submits a 2-worker LoRA job on the
bundled tiny Llama and chat dataset through the Python client, shows a live progress bar, chats
with the fine-tuned model and the base model through the service's /v1/chat/completions, then
loads base + adapter with plain transformers + peft and compares validation loss and a sample
generation. It stops what it started, unless --keep.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from eft import Client

REPO = Path(__file__).resolve().parent.parent
MODEL_DIR = REPO / "assets" / "models" / "tiny-llama"
VALID = REPO / "assets" / "data" / "demo" / "chat_valid.jsonl"
JOB = {
    "model": "tiny-llama",
    "training_file": "demo/chat_train.jsonl",
    "validation_file": "demo/chat_valid.jsonl",
    "name": "demo-chat-lora",
    "method": {"type": "lora", "r": 16, "alpha": 32, "dropout": 0.0},
    "hyperparameters": {"max_steps": 120, "learning_rate": 3e-3, "warmup_steps": 10,
                        "lr_scheduler": "cosine", "global_batch_size": 16,
                        "micro_batch_size": 8, "max_seq_len": 128},
    "scaling": {"min_workers": 2},
    "checkpoint": {"every_steps": 40, "keep": 2},
}
console = Console()


def start_stack(port: int) -> tuple[str, bool]:
    """Returns (service URL, whether this run started it)."""
    from eft.api import local

    url = f"http://127.0.0.1:{port}"
    try:
        local.wait_healthy(url, timeout_s=1)
        console.print(f"[green]service already running[/] at {url}")
        # A key of this machine's service in the user's config, for Client() below.
        local.ensure_local_key(local.get_settings(), url)
        return url, False
    except TimeoutError:
        pass
    with console.status("starting local Ray and the service on Ray Serve..."):
        info = local.up(port=port, num_cpus=8)
    console.print(f"service at {info['service_url']}; Ray dashboard at {info['dashboard_url']}")
    return info["service_url"], True


def run_job(url: str):
    client = Client(base_url=url)
    job = client.jobs.create(**JOB)
    console.print(f"submitted [bold]{job.id}[/] ({job.status.value})")
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("validating", total=JOB["hyperparameters"]["max_steps"], info="")

        def progress(current, metric) -> None:
            info = ""
            if metric is not None and "loss" in metric.values:
                v = metric.values
                info = f"loss {v['loss']:.3f}  {v.get('tokens_per_s', 0):.0f} tok/s"
            bar.update(task, description=current.status.value, completed=current.step,
                       total=current.total_steps or JOB["hyperparameters"]["max_steps"], info=info)

        done = client.jobs.wait(job.id, poll_interval_s=1.0, timeout_s=1200, on_progress=progress)
    return done


def compare(adapter_dir: str) -> dict[str, float]:
    """Validation loss (assistant tokens) and a sample generation, base vs base + adapter,
    using nothing but transformers and peft."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(adapter_dir)
    rows = [json.loads(line) for line in VALID.read_text().splitlines() if line.strip()]

    def loss(model) -> float:
        total, count = 0.0, 0
        for row in rows:
            enc = tokenizer.apply_chat_template(row["messages"], return_dict=True, return_tensors="pt",
                                                return_assistant_tokens_mask=True)
            labels = enc["input_ids"].clone()
            labels[enc["assistant_masks"] == 0] = -100
            with torch.no_grad():
                value = model(input_ids=enc["input_ids"], labels=labels).loss
            n = int((labels[:, 1:] != -100).sum())
            total, count = total + float(value) * n, count + n
        return total / count

    def generate(model, messages) -> str:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=40, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()

    def first_turn(row) -> tuple[list[dict[str, str]], str]:
        messages = row["messages"]
        reply = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        return messages[:reply], messages[reply]["content"]

    samples = [first_turn(row) for row in rows[:3]]
    base = AutoModelForCausalLM.from_pretrained(MODEL_DIR)
    before = loss(base)
    base_replies = [generate(base, prompt) for prompt, _ in samples]
    tuned = PeftModel.from_pretrained(base, adapter_dir)
    after = loss(tuned)
    tuned_replies = [generate(tuned, prompt) for prompt, _ in samples]

    console.print(f"validation loss on {len(rows)} held-out conversations (assistant tokens): "
                  f"base {before:.3f}, base + adapter {after:.3f}")
    table = Table(title="sample replies to held-out prompts (greedy)")
    for column in ("prompt", "reference", "base", "base + adapter"):
        table.add_column(column)
    for (prompt, reference), b, t in zip(samples, base_replies, tuned_replies):
        table.add_row(prompt[-1]["content"], reference, b, t)
    console.print(table)
    return {"before": before, "after": after}


def chat_through_service(url: str, model: str, base: str, count: int = 8) -> None:
    """Ask the service's /v1/chat/completions (streamed) the first held-out prompts, with the
    fine-tuned model id and with the base model: the model servers load the new adapter on
    first use, no restart. Prints the replies and how many start as the reference does."""
    import time

    import httpx

    from eft._config import read_config

    headers = {"Authorization": f"Bearer {read_config()['api_key']}"}
    rows = [json.loads(line) for line in VALID.read_text().splitlines() if line.strip()][:count]

    def ask(name: str, messages: list[dict[str, str]]) -> tuple[str, float]:
        started, first, text = time.monotonic(), None, ""
        body = {"model": name, "messages": messages, "max_tokens": 40, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=300) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    delta = json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                    if delta and first is None:
                        first = time.monotonic() - started
                    text += delta
        return text.strip(), first or 0.0

    def opening(text: str) -> str:  # the reply's first word: "The ...", "28 ...", as the data's replies open
        return (text.split() or [""])[0].lower()

    table = Table(title=f"chat through the service: {model} vs {base}")
    for column in ("prompt", "reference", "base", "fine-tuned"):
        table.add_column(column)
    matches = {"base": 0, "tuned": 0}
    first_token = None
    for row in rows:
        reply = next(i for i, m in enumerate(row["messages"]) if m["role"] == "assistant")
        prompt, reference = row["messages"][:reply], row["messages"][reply]["content"]
        tuned, seconds = ask(model, prompt)
        first_token = seconds if first_token is None else first_token
        plain, _ = ask(base, prompt)
        matches["tuned"] += opening(tuned) == opening(reference)
        matches["base"] += opening(plain) == opening(reference)
        table.add_row(prompt[-1]["content"], reference, plain, tuned)
    console.print(table)
    console.print(f"first chat token from the new model {first_token:.1f} s after the job finished; replies "
                  f"opening with the reference's first word: fine-tuned {matches['tuned']}/{len(rows)}, base "
                  f"{matches['base']}/{len(rows)}")


def main() -> int:
    parser = argparse.ArgumentParser(description="Run the eft demo job.")
    parser.add_argument("--keep", action="store_true", help="leave Ray and the service running")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    url, started = start_stack(args.port)
    try:
        job = run_job(url)
        console.print(f"job {job.id}: [bold]{job.status.value}[/]")
        if job.status.value != "succeeded":
            console.print(f"[red]error:[/] {job.error}")
            return 1
        console.print(f"adapter: {job.artifact_path}")
        chat_through_service(url, job.fine_tuned_model, JOB["model"])
        losses = compare(job.artifact_path)
        console.print(f"validation loss before {losses['before']:.3f} -> after {losses['after']:.3f}")
        return 0 if losses["after"] < losses["before"] else 1
    finally:
        if started and not args.keep:
            from eft.api import local

            local.down()
            console.print("stopped the service and the Ray it started")


if __name__ == "__main__":
    sys.exit(main())
