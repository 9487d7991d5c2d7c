"""Speed benchmark: useful tokens/s against `transformers.Trainer` + PEFT, service overhead,
start latency, and API latency under 50 concurrent clients.

Run from the repository root (starts its own local Ray cluster: hold the machine's Ray lock
where several people share it):

    .venv/bin/python bench/speed.py                    # writes its section of BENCHMARKS.md
    .venv/bin/python bench/speed.py --repeats 1 --steps 6 --output /tmp/b.md

Workload: a Llama built from config (hidden 256, 6 layers, the bundled tokenizer), LoRA r=8 on
all linear layers, prompt/completion data whose lengths follow a log-normal spread (16 to 512
tokens, median about 100), global batch 16 in micro-batches of 4, max_seq_len 512, fp32 on CPU.

1. Throughput, interleaved A,B,A,B over `--repeats` rounds, medians reported: the product's
   job through `POST /jobs` (1 and 2 DDP workers, packing on, and 1 worker with packing off)
   against three baselines (1 process, and 2 under torchrun): `bench/baselines/hf_trainer.py`
   with transformers' defaults and with length-grouped sampling, and `bench/baselines/trl_sft.py`
   (TRL's SFTTrainer, packing padding-free). Useful tokens/s = the
   non-padding tokens of steps 2..N over the time of those steps (step 1 is warm-up on both
   sides): from the job's per-step metrics, from the baseline's step-end callback and collator.
2. Service overhead: the same job's training config run by `bench/baselines/plain_loop.py` (the
   same loop in one process, Ray Train local mode), tokens/s measured the same way, over steps
   2..N and over the second half of the steps (steady state, once Ray Train's helper actors
   have started); every run starts once the cores are quiet, the plain script after its job in
   odd rounds and before the next job in even ones, and the idle cluster's own CPU is sampled.
3. Start latency of the 1-worker jobs: created -> validated -> dispatched -> first optimizer step
   -> succeeded, from the job's events and metrics.
4. API: 50 concurrent clients (aiohttp, one connection each) on loopback: `POST /jobs` back to
   back (the create throughput), then `GET /jobs/{id}` at 25, 50 and 100/s offered in Poisson
   arrivals for 15 s each (latency percentiles, measured from when each request was due), then
   back to back (the read throughput). The service is redeployed with dispatching paused for this part: jobs are
   validated and queued, none trains.

`--variants p1` (and so on) measures a subset and prints it, without touching BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.report import replace_section  # noqa: E402

SECTION = "## Speed: useful tokens/s, service overhead, start latency, API"
PY = sys.executable
GLOBAL_BATCH, MICRO_BATCH, MAX_SEQ_LEN = 16, 4, 512
VARIANTS = ("p1", "hf1", "hfg1", "trl1", "p2", "hf2", "hfg2", "trl2", "p1_nopack", "api")
#: The baselines: (label, script, extra arguments).
BASELINES = {
    "hf": ("Trainer + PEFT, defaults", "bench/baselines/hf_trainer.py", []),
    "hfg": ("Trainer + PEFT, `group_by_length`", "bench/baselines/hf_trainer.py", ["--sampling", "group_by_length"]),
    "trl": ("TRL `SFTTrainer`, packing (bfd, padding-free)", "bench/baselines/trl_sft.py", []),
}
# What `measure` collects besides the tokens/s series (lists of one rate per run).
NOT_RATES = ("starts", "api", "idle_busy", "niceness", "p1_steps", "plain_steps", "bare_start")


def _free_port() -> int:
    """A port for a server to bind soon, where no outbound connection takes it first."""
    from eft.api.local import listen_ports

    return listen_ports(1)[0]


def machine() -> str:
    import platform

    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    ram = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal"))) / 1024**2
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{cpu}, {os.cpu_count()} cores, {ram:.0f} GiB RAM, {gpu}; Python {platform.python_version()}, "
            f"torch {torch.__version__}")


def busy_fraction(window_s: float) -> float:
    """How busy the machine's cores were over the next `window_s` seconds (0..1, /proc/stat)."""
    def busy_total() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields) - fields[3] - fields[4], sum(fields)  # less idle and iowait

    busy0, total0 = busy_total()
    time.sleep(window_s)
    busy1, total1 = busy_total()
    return (busy1 - busy0) / max(1, total1 - total0)


def wait_quiet(busy_below: float = 0.15, window_s: float = 1.0, timeout_s: float = 90.0) -> float:
    """Wait until the machine's cores are at most `busy_below` busy over two windows in a row:
    the processes of the previous run (a job's driver and actors exiting, the plain script's
    interpreter) finish before the next timed run starts, whichever side goes first. Returns
    the seconds waited (the timeout ends the wait; the run then goes on regardless)."""
    started = time.monotonic()
    quiet = 0
    while quiet < 2 and time.monotonic() - started < timeout_s:
        quiet = quiet + 1 if busy_fraction(window_s) < busy_below else 0
    return time.monotonic() - started


def build_model(home: Path) -> str:
    """A Llama from config with the bundled tokenizer, saved under the service's model root."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    target = home / "models" / "bench-llama"
    tokenizer = AutoTokenizer.from_pretrained(ROOT / "assets" / "models" / "tiny-llama")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=688,
                         num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=1024, tie_word_embeddings=False,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return "bench-llama"


def build_data(home: Path, n: int = 600) -> str:
    """Prompt/completion records of log-normally spread length, as real SFT sets are."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ROOT / "assets" / "models" / "tiny-llama")
    # Whole words that are one token each (byte-level BPE marks a leading space with "Ġ"), so
    # a record's length in tokens is its length in words.
    words = sorted(w[1:] for w in tokenizer.get_vocab() if w.startswith("Ġ") and w[1:].isalpha())
    rng = random.Random(7)
    path = home / "data" / "bench.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for _ in range(n):
            total = int(min(480, max(16, rng.lognormvariate(4.6, 0.7))))
            prompt = max(4, int(total * rng.uniform(0.2, 0.6)))
            out.write(json.dumps({"prompt": " ".join(rng.choices(words, k=prompt)),
                                  "completion": " ".join(rng.choices(words, k=total - prompt))}) + "\n")
    return "bench.jsonl"


def job_body(model: str, data: str, workers: int, steps: int, packing: bool = True,
             log_every: int = 1) -> dict[str, Any]:
    return {
        "name": f"speed-{workers}w{'' if packing else '-nopack'}", "model": model, "training_file": data,
        "method": {"type": "lora", "r": 8, "alpha": 16},  # the service's default dropout (0), as the baselines
        "hyperparameters": {"max_steps": steps, "global_batch_size": GLOBAL_BATCH,
                            "micro_batch_size": MICRO_BATCH, "max_seq_len": MAX_SEQ_LEN, "log_every_steps": log_every},
        "scaling": {"min_workers": workers, "cpus_per_worker": 2 / workers},
        "strategy": "ddp", "optimizations": {"packing": packing, "precision": "fp32"},
        "checkpoint": {"every_steps": 100_000},
    }


def useful_tokens_per_s(rows: list[dict[str, Any]], after_step: int = 1) -> float:
    """Non-padding tokens over time for steps after_step+1..N (2..N by default). Each metrics
    row covers the steps since the previous row (step 1 always has a row of its own):
    `tokens_per_s` is the window's rate and `step_time_s` its mean step time."""
    rows = sorted((r for r in rows if "tokens_per_s" in r["values"]), key=lambda r: r["step"])
    tokens = seconds = 0.0
    for before, row in zip(rows, rows[1:]):
        if before["step"] < after_step:
            continue
        window_s = row["values"]["step_time_s"] * (row["step"] - before["step"])
        tokens += row["values"]["tokens_per_s"] * window_s
        seconds += window_s
    return tokens / seconds


def step_times(rows: list[dict[str, Any]]) -> dict[int, float]:
    """Mean step time of each metrics row after step 1 (warm-up), keyed by the row's step."""
    return {r["step"]: r["values"]["step_time_s"] for r in rows if r["step"] > 1 and "step_time_s" in r["values"]}


def paired_step_ratios(job: dict[int, float], plain: dict[int, float]) -> list[float]:
    """plain / job step time for every step both measured. Both ran the same config and seed, so
    step k trained the same batch on both sides: each ratio is a tokens/s ratio on equal work,
    and a burst of outside load spoils a few steps instead of a whole run."""
    return [plain[k] / job[k] for k in sorted(job.keys() & plain.keys())]


def paired_runs(out: dict[str, Any]) -> list[list[float]]:
    """The step ratios of each 1-worker job against the plain run of its round."""
    return [paired_step_ratios(job, plain) for job, plain in zip(out["p1_steps"], out["plain_steps"])]


def _ts(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


class Service:
    def __init__(self, url: str, home: Path, api_key: str, poll_s: float):
        self.http = httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {api_key}"})
        self.home, self.poll_s = home, poll_s

    def get(self, path: str) -> Any:
        return self.http.get(path).raise_for_status().json()

    def run_job(self, body: dict[str, Any]) -> dict[str, Any]:
        job = self.http.post("/jobs", json=body).raise_for_status().json()
        deadline = time.monotonic() + 900
        while job["status"] not in ("succeeded", "failed", "cancelled"):
            if time.monotonic() > deadline:
                raise TimeoutError(job["id"])
            # Every poll is a request the service serves on the cores the job trains on (the
            # observer's cost, not the job's): `--poll-s` apart. Latencies come from the job's
            # timestamps, not from when a poll saw them.
            time.sleep(self.poll_s)
            job = self.get(f"/jobs/{job['id']}")
        if job["status"] != "succeeded":
            raise RuntimeError(f"{job['id']} {job['status']}: {job.get('error')}")
        metrics = self.get(f"/jobs/{job['id']}/metrics")["data"]
        events = self.get(f"/jobs/{job['id']}/events?limit=100")["data"]
        return {"job": job, "metrics": metrics, "events": events, "tps": useful_tokens_per_s(metrics),
                "step_times": step_times(metrics),
                "steady": useful_tokens_per_s(metrics, after_step=body["hyperparameters"]["max_steps"] // 2)}

    def config_of(self, job_id: str) -> dict[str, Any]:
        from eft.service.store.store import Store

        return Store(f"sqlite:///{self.home / 'eft.db'}").get_job(job_id).config


def start_latency(run: dict[str, Any]) -> dict[str, float]:
    job, events = run["job"], run["events"]
    created = _ts(job["created_at"])
    at = {e["type"]: _ts(e["created_at"]) - created for e in reversed(events)}
    first_step = min(_ts(m["created_at"]) for m in run["metrics"]) - created
    return {"validated": at.get("queued", float("nan")), "dispatched": at.get("dispatched", float("nan")),
            "driver": at.get("training_started", float("nan")),
            "first_step": first_step, "succeeded": _ts(job["finished_at"]) - created}


def run_hf(model_dir: Path, data: Path, workers: int, steps: int, baseline: str = "hf") -> float:
    _, script, extra = BASELINES[baseline]
    out = Path(tempfile.mkdtemp(prefix="eft-hf-")) / "r.json"
    args = [script, "--model", str(model_dir), "--data", str(data), "--out", str(out),
            "--steps", str(steps), "--global-batch", str(GLOBAL_BATCH), "--max-seq-len", str(MAX_SEQ_LEN), *extra]
    if baseline != "trl":
        args += ["--micro-batch", str(MICRO_BATCH)]
    for attempt in range(3):
        # A port free when chosen can be taken before torchrun binds it (the local Ray cluster
        # opens ports all the time): then the run fails at once, and runs again on another.
        cmd = [PY, *args] if workers == 1 else [
            str(Path(PY).with_name("torchrun")), f"--nproc-per-node={workers}", f"--master-port={_free_port()}", *args]
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": str(2 // workers)})
        if run.returncode == 0:
            break
        print(f"{baseline}{workers} failed (attempt {attempt + 1}): {run.stderr[-2000:]}", flush=True)
    else:
        raise RuntimeError(f"baseline {baseline} with {workers} workers failed 3 times")
    ranks = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(workers)]
    return sum(r["tokens"] for r in ranks) / max(r["seconds"] for r in ranks)


def run_bare(config: dict[str, Any]) -> float:
    """Seconds from launching `bench/baselines/bare_trainer.py` (a bare TorchTrainer script with
    the same loop and config) to its first optimizer step."""
    directory = Path(tempfile.mkdtemp(prefix="eft-bare-"))
    (directory / "cfg.json").write_text(json.dumps(config))
    launched = time.time()
    subprocess.run([PY, "bench/baselines/bare_trainer.py", "--config", str(directory / "cfg.json"),
                    "--out", str(directory / "first.json")], check=True, cwd=ROOT, capture_output=True)
    return json.loads((directory / "first.json").read_text())["first_step_at"] - launched


def run_plain(config: dict[str, Any]) -> tuple[float, float, dict[int, float]]:
    """Useful tokens/s of the plain script over steps 2..N and over the second half, and its
    step times."""
    directory = Path(tempfile.mkdtemp(prefix="eft-plain-"))
    (directory / "cfg.json").write_text(json.dumps(config))
    subprocess.run([PY, "bench/baselines/plain_loop.py", "--config", str(directory / "cfg.json"),
                    "--out", str(directory / "m.json")], check=True, cwd=ROOT, capture_output=True)
    rows = json.loads((directory / "m.json").read_text())
    return (useful_tokens_per_s(rows), useful_tokens_per_s(rows, after_step=config["total_steps"] // 2),
            step_times(rows))


#: The API part: `API_CLIENTS` clients (one connection each) on loopback.
API_CLIENTS = 50
#: Jobs each client creates, back to back (closed loop): the create throughput (600 creates, a
#: few seconds: long enough that one stall of the shared cores does not set the rate).
API_POSTS_PER_CLIENT = 12
#: Reads of those jobs: `GET /jobs/{id}` from every client at random (Poisson) times, together
#: each of `API_GET_RATES` per second for `API_GET_SECONDS` (open loop), then as fast as they can.
API_GET_RATES = (25, 50, 100)
API_GET_SECONDS = 15.0
API_GETS_PER_CLIENT = 20


async def _api_load(url: str, api_key: str, body: dict[str, Any]) -> dict[str, Any]:
    """The three phases on `API_CLIENTS` aiohttp sessions (a load generator several times
    lighter than httpx: what it takes from the two cores, the service does not get)."""
    import aiohttp

    headers = {"Authorization": f"Bearer {api_key}"}
    connector = lambda: aiohttp.TCPConnector(limit=1)  # noqa: E731 - one connection per client
    sessions = [aiohttp.ClientSession(url, headers=headers, connector=connector()) for _ in range(API_CLIENTS)]
    out: dict[str, Any] = {"post_ms": [], "get_closed_ms": [], "ids": []}
    try:
        async def create(k: int, http: aiohttp.ClientSession) -> None:
            for i in range(API_POSTS_PER_CLIENT):
                t = time.perf_counter()
                async with http.post("/jobs", json={**body, "name": f"api-{k}-{i}"}) as r:
                    job = await r.json()
                    if r.status != 201:
                        raise RuntimeError(f"POST /jobs answered {r.status}: {job}")
                out["post_ms"].append((time.perf_counter() - t) * 1000)
                out["ids"].append(job["id"])

        # One create first, untimed: the replica's first look at this model and file (its model
        # helper answering once, then remembered) is not what a steady stream of creates costs.
        async with sessions[0].post("/jobs", json={**body, "name": "api-warm-up"}) as r:
            out["ids"].append((await r.json())["id"])
        # The replica's helper processes start with it (each an interpreter importing torch and
        # transformers: seconds of CPU on both cores); the load starts once they are up and that
        # first job is validated, so it measures a running service, not one still starting.
        await _until_validated(sessions[0], 1)
        wait_quiet()
        started = time.perf_counter()
        await asyncio.gather(*(create(k, http) for k, http in enumerate(sessions)))
        out["post_wall_s"] = time.perf_counter() - started
        ids = out["ids"]

        async def read(http: aiohttp.ClientSession, job_id: str) -> None:
            async with http.get(f"/jobs/{job_id}") as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"GET /jobs/{job_id} answered {r.status}")

        for http in sessions:  # connections open and the validations of the creates finished
            await read(http, ids[0])
        await _until_validated(sessions[0], len(ids))

        async def reader(k: int, http: aiohttp.ClientSession, rate: float, first: float, end: float,
                         latencies: list[float]) -> None:
            rng = random.Random(k)
            due = first + rng.expovariate(rate / API_CLIENTS)
            while due < end:
                if due > time.perf_counter():
                    await asyncio.sleep(due - time.perf_counter())
                await read(http, rng.choice(ids))
                # From when the request was due, not when it was sent: a slow answer delays this
                # client's next request, and that wait counts (no coordinated omission).
                latencies.append((time.perf_counter() - due) * 1000)
                due += rng.expovariate(rate / API_CLIENTS)

        out["get_open"] = {}
        for rate in API_GET_RATES:
            latencies: list[float] = []
            first = time.perf_counter()
            await asyncio.gather(*(reader(k, http, rate, first, first + API_GET_SECONDS, latencies)
                                   for k, http in enumerate(sessions)))
            out["get_open"][rate] = {"ms": latencies, "wall_s": time.perf_counter() - first}

        async def flood(k: int, http: aiohttp.ClientSession) -> None:
            for i in range(API_GETS_PER_CLIENT):
                t = time.perf_counter()
                await read(http, ids[(k * 7 + i) % len(ids)])
                out["get_closed_ms"].append((time.perf_counter() - t) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(flood(k, http) for k, http in enumerate(sessions)))
        out["get_closed_wall_s"] = time.perf_counter() - started
    finally:
        await asyncio.gather(*(http.close() for http in sessions))
    return out


async def _until_validated(http: Any, jobs: int, timeout_s: float = 300.0) -> None:
    """Wait until the service's scheduler has validated every created job (all are queued, with
    dispatching paused), so that the reads are measured against the service at rest."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        async with http.get("/jobs", params={"status": "queued", "limit": 100}) as r:
            page = await r.json()
        queued = len(page["data"])
        cursor = page.get("next_cursor")
        while page.get("has_more"):
            async with http.get("/jobs", params={"status": "queued", "limit": 100, "after": cursor}) as r:
                page = await r.json()
            queued += len(page["data"])
            cursor = page.get("next_cursor")
        if queued >= jobs:
            return
        await asyncio.sleep(1.0)
    raise RuntimeError(f"the service validated fewer than {jobs} jobs in {timeout_s:.0f} s")


def api_benchmark(url: str, api_key: str, service: Service) -> dict[str, Any]:
    """Jobs on the bundled data, created and read by `API_CLIENTS` clients at once. The service
    runs with dispatching paused (`EFT_DISPATCH_PAUSED`): every job is checked, stored,
    validated (tokenised, planned) and queued by the service, but none starts training, whose
    processes would otherwise take this machine's two cores from the API being measured."""
    body = {"model": "tiny-llama", "training_file": "demo/chat_train.jsonl", "hyperparameters": {"max_steps": 1}}
    result = asyncio.run(_api_load(url, api_key, body))
    for job_id in result["ids"]:
        service.http.post(f"/jobs/{job_id}/cancel").raise_for_status()
    return result


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import serve

    from eft.api.local import deploy_app, listen_ports, ray_node_env, wait_healthy

    home = Path(tempfile.mkdtemp(prefix="eft-bench-speed-"))
    model, data = build_model(home), build_data(home)
    port, dash_port = listen_ports(2)
    # The local cluster's nodes start as `eft up` starts them (training workers at niceness 0).
    os.environ.update(ray_node_env(os.environ))
    if args.worker_niceness is not None:
        os.environ["RAY_worker_niceness"] = str(args.worker_niceness)
    ray.init(address="local", num_cpus=8, include_dashboard=True, dashboard_host="127.0.0.1",
             dashboard_port=dash_port, log_to_driver=False, configure_logging=False)
    out: dict[str, Any] = {k: [] for k in ("p1", "p2", "p1_nopack", "hf1", "hf2", "hfg1", "hfg2", "trl1", "trl2",
                                           "plain", "p1_steady", "plain_steady", "starts", "p1_steps", "plain_steps",
                                           "bare_start")}
    wanted = set(args.variants.split(","))
    api_key = "eft-bench-" + secrets.token_urlsafe(16)
    env = {"EFT_HOME": str(home), "EFT_RAY_DASHBOARD_URL": f"http://127.0.0.1:{dash_port}",
           "EFT_ADMIN_API_KEY": api_key}
    try:
        deploy_app(env, port)
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url)
        service = Service(url, home, api_key, poll_s=args.poll_s)
        model_dir, data_path = home / "models" / model, home / "data" / data
        # Interleaved rounds: background load on the shared cores falls on every variant alike.
        plain_config: dict[str, Any] | None = None

        def plain_run(config: dict[str, Any]) -> None:
            wait_quiet()
            whole, steady, steps = run_plain(config)
            out["plain"].append(whole)
            out["plain_steady"].append(steady)
            out["plain_steps"].append(steps)

        for round_ in range(args.repeats):
            if "p1" in wanted:
                # The plain script next to the job it copies, first after it in odd rounds and
                # before it (with the first round's config) in even ones: neither side always
                # follows the other.
                if round_ % 2 == 1 and plain_config is not None:
                    plain_run(plain_config)
                wait_quiet()
                p1 = service.run_job(job_body(model, data, 1, args.steps, log_every=args.log_every))
                out["p1"].append(p1["tps"])
                out["p1_steady"].append(p1["steady"])
                out["p1_steps"].append(p1["step_times"])
                out["starts"].append(start_latency(p1))
                if round_ % 2 == 0 or plain_config is None:
                    plain_config = service.config_of(p1["job"]["id"])
                    plain_run(plain_config)
                wait_quiet()
                out["bare_start"].append(run_bare(plain_config))
            for baseline in BASELINES:
                if f"{baseline}1" in wanted:
                    wait_quiet()
                    out[f"{baseline}1"].append(run_hf(model_dir, data_path, 1, args.steps, baseline))
            if "p2" in wanted:
                wait_quiet()
                p2 = service.run_job(job_body(model, data, 2, args.steps, log_every=args.log_every))
                out["p2"].append(p2["tps"])
            for baseline in BASELINES:
                if f"{baseline}2" in wanted:
                    wait_quiet()
                    out[f"{baseline}2"].append(run_hf(model_dir, data_path, 2, args.steps, baseline))
            if "p1_nopack" in wanted:
                nopack = job_body(model, data, 1, args.steps, packing=False, log_every=args.log_every)
                wait_quiet()
                out["p1_nopack"].append(service.run_job(nopack)["tps"])
            print(f"round {round_ + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in out.items()
                                                      if k not in NOT_RATES and v), flush=True)
        wait_quiet()
        out["idle_busy"] = busy_fraction(10.0)  # the idle cluster's own CPU over 10 s
        out["niceness"] = int(os.environ["RAY_worker_niceness"])
        if "api" in wanted:
            # The service's capacity, not a tenant's limits: quotas and rate limits off.
            deploy_app({**env, "EFT_DISPATCH_PAUSED": "true", "EFT_MAX_ACTIVE_JOBS_PER_TENANT": "100000",
                        "EFT_MAX_CPUS_PER_TENANT": "1000000", "EFT_REQUESTS_PER_S_PER_TENANT": "1000000",
                        "EFT_REQUEST_BURST_PER_TENANT": "1000000"})
            wait_healthy(url)
            out["api"] = api_benchmark(url, api_key, service)
    finally:
        serve.shutdown()
        ray.shutdown()
    return out


def api_figures(api: dict[str, Any]) -> dict[str, Any]:
    posts, flood = api["post_ms"], api["get_closed_ms"]
    return {
        "posts_per_s": len(posts) / api["post_wall_s"], "post_p50_ms": pct(posts, 50), "post_p99_ms": pct(posts, 99),
        "get_open": {rate: {"per_s": len(r["ms"]) / r["wall_s"], "p50_ms": pct(r["ms"], 50),
                            "p95_ms": pct(r["ms"], 95), "p99_ms": pct(r["ms"], 99)}
                     for rate, r in api["get_open"].items()},
        "get_closed_per_s": len(flood) / api["get_closed_wall_s"], "get_closed_p50_ms": pct(flood, 50),
        "get_closed_p99_ms": pct(flood, 99),
    }


def api_lines(api: dict[str, Any]) -> list[str]:
    f = api_figures(api)
    return [
        f"### API: {API_CLIENTS} concurrent clients on loopback", "",
        "| phase | requests | rate | p50 ms | p95 ms | p99 ms |", "|---|---:|---:|---:|---:|---:|",
        f"| `POST /jobs`, each client creating {API_POSTS_PER_CLIENT} jobs back to back | {len(api['post_ms'])} | "
        f"**{f['posts_per_s']:.0f}/s** | {f['post_p50_ms']:.0f} | {pct(api['post_ms'], 95):.0f} | "
        f"{f['post_p99_ms']:.0f} |",
        *(f"| `GET /jobs/{{id}}`, {rate}/s offered for {API_GET_SECONDS:g} s (Poisson arrivals spread over the "
          f"clients) | {len(api['get_open'][rate]['ms'])} | {g['per_s']:.0f}/s | {g['p50_ms']:.0f} | "
          f"{g['p95_ms']:.0f} | **{g['p99_ms']:.0f}** |" for rate, g in f["get_open"].items()),
        f"| `GET /jobs/{{id}}`, each client reading {API_GETS_PER_CLIENT} jobs back to back | "
        f"{len(api['get_closed_ms'])} | {f['get_closed_per_s']:.0f}/s | {f['get_closed_p50_ms']:.0f} | "
        f"{pct(api['get_closed_ms'], 95):.0f} | {f['get_closed_p99_ms']:.0f} |", "",
        f"The service runs as one Serve replica {ingress_words()}, with the throughput settings `eft up` "
        "gives a node (`api/local.py:SERVE_NODE_ENV`), its scheduler validating, tokenising and planning every created "
        "job meanwhile, with dispatching paused (`EFT_DISPATCH_PAUSED`) so that no training takes the two "
        "cores from the API. The clients are aiohttp sessions in one process on the same two cores. "
        "Read latency is measured from when each request was due (open loop), after every create was "
        "validated; back to back, 50 clients keep 50 requests in the service at all times, so each "
        "waits behind the other 49 and latency is 50 / throughput (Little's law): that row shows the "
        "service's capacity, the open-loop rows its latency at a given load.", "",
    ]


def haproxy_ingress() -> bool:
    return os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1"


def ingress_words() -> str:
    """How requests reached the replica in this run (api/local.py:ingress_env decides)."""
    if haproxy_ingress():
        return ("behind HAProxy on the service's port (Ray Serve's HAProxy ingress, "
                "`api/local.py:INGRESS_ENV`: each request goes straight to the replica's own HTTP server)")
    return "behind Serve's proxy (HAProxy off or not installed: each request reaches the replica over gRPC)"


def render(out: dict[str, Any], args: argparse.Namespace, wall_s: float, load_at_start: float) -> str:
    med = {k: statistics.median(v) for k, v in out.items() if k not in NOT_RATES}
    pairs = paired_runs(out)
    paired = statistics.median(r for run in pairs for r in run)
    per_run = " / ".join(f"{statistics.median(run):.3f}" for run in pairs)
    runs = lambda k: " / ".join(f"{v:.0f}" for v in out[k])  # noqa: E731
    starts = {k: statistics.median(s[k] for s in out["starts"]) for k in out["starts"][0]}
    lines = [
        SECTION, "",
        f"Written by `bench/speed.py --repeats {args.repeats} --steps {args.steps}` (`make bench`) on "
        f"{datetime.now():%Y-%m-%d %H:%M} UTC in {wall_s:.0f} s. Machine: {machine()}; 1-minute load "
        f"average {load_at_start:.1f} at the start (what ran before it; each run below waits "
        "for the cores to go quiet first).", "",
        f"Workload: a Llama built from config (hidden 256, 6 layers, 8 heads, vocabulary of the bundled "
        f"tokenizer), LoRA r=8 on all linear layers, fp32 on CPU; prompt/completion data with log-normally "
        f"spread lengths (16-480 words, median ~100 tokens); global batch {GLOBAL_BATCH} in micro-batches of "
        f"{MICRO_BATCH}, max_seq_len {MAX_SEQ_LEN}, {args.steps} optimizer steps; 2 CPU cores in total for "
        f"either side (1 worker x 2 threads, or 2 workers x 1 thread). Every variant ran {args.repeats} times, "
        f"interleaved (A,B,A,B), so load from other work on the shared cores fell on each alike; "
        f"figures are medians, single runs after the colon.", "",
        "### Useful (non-padding) tokens/s: this product vs the baselines", "",
        "Baselines (same model, data, tokens, LoRA config, global batch and steps): "
        "`bench/baselines/hf_trainer.py` (transformers' `Trainer` + PEFT, padding each micro-batch to its "
        "longest example; with its defaults, and with `train_sampling_strategy=\"group_by_length\"`, "
        "which groups examples of similar length into micro-batches) and `bench/baselines/trl_sft.py` "
        "(TRL's `SFTTrainer` with packing, best-fit decreasing, padding-free rows; about as many tokens per "
        "step as the product's batch). The ratio is the product's tokens/s over the baseline's.", "",
        "| workers | eft job (packing) | " + " | ".join(BASELINES[b][0] for b in BASELINES) + " |",
        "|---:|---:|" + "---:|" * len(BASELINES),
        *(f"| {w} | {med[f'p{w}']:.0f} ({runs(f'p{w}')}) | " + " | ".join(
            f"{med[f'{b}{w}']:.0f} ({runs(f'{b}{w}')}): **{med[f'p{w}'] / med[f'{b}{w}']:.2f}x**" for b in BASELINES) + " |"
          for w in (1, 2)),
        "",
        f"The same eft job with `optimizations.packing: false` (padding each micro-batch to its longest "
        f"example, as the baseline does): {med['p1_nopack']:.0f} tokens/s ({runs('p1_nopack')}), so packing "
        f"alone is worth {med['p1'] / med['p1_nopack']:.2f}x here. Tokens/s counts only real tokens of steps "
        "2..N over their time (step 1 is warm-up on both sides); padding computed by either side is not "
        "useful and is not counted.", "",
        "### Service overhead", "",
        f"| useful tokens/s | steps 2..{args.steps} | steady state: steps {args.steps // 2 + 1}..{args.steps} |",
        "|---|---:|---:|",
        f"| eft job through the service (1 worker) | {med['p1']:.0f} ({runs('p1')}) | "
        f"{med['p1_steady']:.0f} ({runs('p1_steady')}) |",
        f"| the same training config as a plain script (`bench/baselines/plain_loop.py`) | "
        f"{med['plain']:.0f} ({runs('plain')}) | {med['plain_steady']:.0f} ({runs('plain_steady')}) |",
        f"| **service / plain** | {med['p1'] / med['plain']:.3f} | **{med['p1_steady'] / med['plain_steady']:.3f}** |",
        f"| service / plain, step by step: median of plain / job step time over the {sum(map(len, pairs))} "
        f"steps both timed, each job paired with the plain run beside it | **{paired:.3f}** ({per_run}) | |",
        "",
        "Step by step, each ratio compares the same batch trained on both sides (the plain script runs "
        "the job's stored config, seed included), so a burst of outside load spoils a few steps of one "
        "side rather than a whole run's average.", "",
        "The steady-state column leaves out the first half of each run on both sides, to tell the start "
        "of a job (Ray Train's controller and helper actors start, each a process importing its modules, "
        "beside the first steps) from its steady rate: "
        + ("the job's ratio is higher there, so part of the gap over steps 2..N is start-up, counted once "
           "in the start latency below." if med['p1_steady'] / med['plain_steady'] > med['p1'] / med['plain']
           else "here it is no higher than over steps 2..N, so the gap is in every step, not in the "
           "start-up."), "",
        f"Both ran on the same machine with the local Ray cluster and the service up: the plain script "
        f"alone in its process at niceness 0, the job's Ray Train worker at niceness {out['niceness']} "
        f"(`RAY_worker_niceness`, which `eft up` and the deploy files set to 0; Ray's own default is 15, "
        f"below its daemons). Each run started once the cores had gone quiet after the one before, the "
        f"plain script after its job in odd rounds and before the next one in even rounds. While a job ran "
        f"the bench read its status every {args.poll_s:g} s (each read is work for the service on the same "
        f"cores). With no job "
        f"running, the cluster and the service (GCS, raylet, dashboard and its agent, log monitor, Serve "
        f"controller, {'HAProxy' if haproxy_ingress() else 'proxy'} and replica) kept {out['idle_busy'] * 100:.1f}% of the two cores busy: a fixed "
        f"cost on this machine that the plain script paid too, so the ratio is what a job adds on top "
        f"of it (its driver, Ray Job supervisor, Train controller and helper actors, progress reports).", "",
        "### Start latency (1-worker job, median)", "",
        "| from `POST /jobs` to | seconds |", "|---|---:|",
        *(f"| {label} | {starts[key]:.2f} |" for key, label in (
            ("validated", "validated (dataset scanned and tokenised, planned)"),
            ("dispatched", "dispatched (Ray Job running)"),
            ("driver", "the job's driver running (its Ray Job's process started, the driver imported)"),
            ("first_step", "first optimizer step (metrics of step 1 stored)"),
            ("succeeded", "succeeded (adapter and manifest written)"))),
        f"| a bare TorchTrainer script with the same loop and config (`bench/baselines/bare_trainer.py`): "
        f"launch to first optimizer step | {statistics.median(out['bare_start']):.2f} "
        f"({' / '.join(f'{v:.1f}' for v in out['bare_start'])}) |",
        f"| **service / bare script, to the first step** | "
        f"**{starts['first_step'] / statistics.median(out['bare_start']):.2f}** |",
        "",
        *api_lines(out["api"]),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4,
                        help="rounds; even, so the plain script runs first in half of them")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--worker-niceness", type=int, default=None,
                        help="RAY_worker_niceness for the local cluster (the service's: 0, Ray's own default: 15)")
    parser.add_argument("--poll-s", type=float, default=5.0,
                        help="seconds between the bench's GET /jobs/{id} polls while a job runs")
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--log-every", type=int, default=1,
                        help="the product jobs' log_every_steps (1: a metrics row per step)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="a subset to measure, for a quick look (BENCHMARKS.md needs them all)")
    args = parser.parse_args(argv)
    started, load_at_start = time.perf_counter(), os.getloadavg()[0]
    out = measure(args)
    if set(args.variants.split(",")) != set(VARIANTS):
        summary = {k: v for k, v in out.items() if k not in ("api", "p1_steps", "plain_steps") and v}
        if out["p1_steps"] and out["plain_steps"]:
            summary["paired_step_ratio"] = [round(statistics.median(run), 3) for run in paired_runs(out)]
        if "api" in out:
            summary["api"] = api_figures(out["api"])
        print(json.dumps(summary, indent=1))
        return 0
    section = render(out, args, time.perf_counter() - started, load_at_start)
    print(section)
    replace_section(args.output, SECTION, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
