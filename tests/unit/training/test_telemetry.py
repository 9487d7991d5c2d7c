"""Training telemetry: the FLOPs-per-token convention, peak FLOP/s defaults, the names Ray
exports, and the Grafana dashboard's queries against them."""

import json
import re

import yaml

from eft.service import metrics as service_metrics
from eft.service.serving import telemetry as serving_telemetry
from eft.planner.architectures import architecture_from_config
from eft.service.runs.entrypoint import model_flops_per_token
from eft.training import telemetry
from tests.helpers.paths import REPO

TINY = REPO / "assets" / "models" / "tiny-llama"


def test_flops_per_token_is_6n_full_and_4n_plus_6p_lora():
    assert telemetry.flops_per_token("full", 1_000, 1_000) == 6_000
    assert telemetry.flops_per_token("lora", 1_000, 10) == 4_000 + 60
    assert telemetry.flops_per_token("qlora", 1_000, 10) == 4_060


def test_model_flops_per_token_reads_the_model_config():
    arch = architecture_from_config(TINY)
    full = model_flops_per_token({"model_path": str(TINY), "method": "full"})
    lora = model_flops_per_token({"model_path": str(TINY), "method": "lora",
                                  "lora": {"r": 4, "target_modules": ["q_proj", "v_proj"]}})
    assert full == 6 * arch.parameters
    assert lora == 4 * arch.parameters + 6 * arch.lora_parameters(4, ("q_proj", "v_proj"))
    assert model_flops_per_token({"model_path": "/nonexistent"}) is None


def test_peak_flops_setting_wins_then_gpu_type_then_cpu_default():
    assert telemetry.peak_flops_per_worker(True, "H100", 100.0) == 100e12
    assert telemetry.peak_flops_per_worker(True, "h100", None) == 989e12
    assert telemetry.peak_flops_per_worker(True, None, None) == telemetry.DEFAULT_GPU_PEAK_TFLOPS * 1e12
    assert telemetry.peak_flops_per_worker(False, "H100", None) == telemetry.CPU_PEAK_TFLOPS * 1e12


def test_exported_names_carry_rays_prefix_and_counter_suffix():
    names = telemetry.exported_names()
    assert "ray_eft_train_loss" in names and "ray_eft_train_restarts_total" in names
    assert "ray_eft_train_loss_total" not in names and "ray_eft_train_restarts" not in names


def _queries(dashboard: dict) -> list[str]:
    exprs = []
    for panel in dashboard["panels"]:
        exprs += [t["expr"] for t in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if isinstance(variable.get("query"), dict):
            exprs.append(variable["query"]["query"])
    return exprs


PROMQL_WORDS = {"sum", "by", "rate", "increase", "histogram_quantile", "max", "le", "label_values",
                "job_id", "job_name", "status", "route", "reason", "memory", "rank", "h", "m", "base_model",
                "model", "tenant"}


def test_every_grafana_query_names_an_exported_metric():
    dashboard = json.loads((REPO / "deploy" / "grafana" / "eft-dashboard.json").read_text())
    exported = telemetry.exported_names() | service_metrics.metric_names() | serving_telemetry.exported_names()
    queries = _queries(dashboard)
    assert len(queries) >= 20
    used = set()
    for expr in queries:
        # Drop label matchers, strings and Grafana variables, then take the identifiers.
        bare = re.sub(r'\{[^}]*\}|"[^"]*"|\$\w+|\[[^\]]*\]', " ", expr)
        names = {w for w in re.findall(r"[a-zA-Z_][a-zA-Z0-9_]*", bare) if w not in PROMQL_WORDS}
        assert names, expr
        unknown = names - exported
        assert not unknown, f"{expr!r} names {unknown}, which nothing exports"
        used |= names
    # Both views are covered: service metrics and training metrics.
    assert {"eft_jobs", "eft_queue_depth", "ray_eft_train_loss", "ray_eft_train_tokens_per_second",
            "ray_eft_train_peak_memory_bytes", "ray_eft_train_restarts_total",
            "ray_eft_serving_generated_tokens_total", "ray_eft_serving_time_to_first_token_seconds_bucket"} <= used


def test_prometheus_config_scrapes_ray_discovery_file_and_the_service():
    config = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = {c["job_name"]: c for c in config["scrape_configs"]}
    assert jobs["ray"]["file_sd_configs"][0]["files"] == ["/tmp/ray/prom_metrics_service_discovery.json"]
    assert jobs["eft-service"]["metrics_path"] == "/metrics"


class FakeMetric:
    def __init__(self):
        self.values: dict[tuple, float] = {}

    def set(self, value, tags):
        self.values[tuple(sorted(tags.items()))] = value

    def inc(self, value, tags):
        key = tuple(sorted(tags.items()))
        self.values[key] = self.values.get(key, 0.0) + value


def _only(metric: FakeMetric, **extra) -> float:
    (value,) = [v for k, v in metric.values.items() if all((name, x) in k for name, x in extra.items())]
    return value


def test_job_telemetry_derives_samples_tokens_and_mfu_from_a_step():
    fakes = {s.name: FakeMetric() for s in telemetry.TRAINING_METRICS}
    t = telemetry.JobTelemetry("ftjob-a", "acme", None, {"global_batch_size": 8, "total_steps": 10},
                               peak_flops=1e9, metrics=fakes)
    t.flops_per_token = 1e5
    t.last_step = 0
    step = {"loss": 2.0, "step_time_s": 0.5, "tokens_per_s": 1000.0, "world_size": 2,
            "peak_memory_gb": 1.5, "host_peak_memory_gb": 2.0}
    assert t.step(2, step) == 1000.0  # 1000 tok/s x 0.5 s x 2 steps
    assert _only(fakes["eft_train_loss"], job_id="ftjob-a", tenant="acme", job_name="") == 2.0
    assert _only(fakes["eft_train_samples_per_second"]) == 16.0
    assert _only(fakes["eft_train_mfu"]) == 1000.0 * 1e5 / (1e9 * 2)
    assert _only(fakes["eft_train_peak_memory_bytes"], memory="host", rank="max") == 2.0e9
    assert _only(fakes["eft_train_total_steps"]) == 10
    t.step(3, {**step, "peak_memory_gb_rank1": 1.25})
    assert _only(fakes["eft_train_tokens"]) == 1500.0
    assert _only(fakes["eft_train_peak_memory_bytes"], memory="accelerator", rank="1") == 1.25e9
    t.counts(restarts=1, lost_steps=0)
    t.checkpoint("final", 0.25, 4096)
    assert _only(fakes["eft_train_restarts"]) == 1 and fakes["eft_train_lost_steps"].values == {}
    assert _only(fakes["eft_train_checkpoints"], reason="final") == 1
    assert _only(fakes["eft_train_checkpoint_size_bytes"]) == 4096
