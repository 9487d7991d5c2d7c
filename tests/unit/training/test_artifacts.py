"""The artifact: manifest contents and the atomic publish."""

import json

from eft.training.artifacts import COMMIT_MARKER, MANIFEST, build_manifest, download, is_committed, publish
from eft.training.config import LoraSpec, TrainConfig


def _config(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "hi"}\n')
    return TrainConfig(job_id="ftjob-x", model_path=str(tmp_path / "missing-model"), training_file=str(data),
                       validation_file=None, method="lora", lora=LoraSpec(), total_steps=3,
                       num_train_examples=1, strategy="zero2", predicted_memory_gb=1.5)


def test_manifest_records_memory_per_worker_and_options(tmp_path):
    metrics = {"step": 3, "world_size": 2, "eval_loss": 1.0, "peak_memory_gb": 0.7,
               "peak_memory_gb_rank1": 0.6, "peak_memory_gb_rank0": 0.7}
    manifest = build_manifest(_config(tmp_path), metrics, attempt=1)
    assert manifest["memory_gb"] == {"predicted_per_worker": 1.5, "measured_peak_per_worker": [0.7, 0.6]}
    assert manifest["strategy"] == "zero2" and manifest["optimizations"]["precision"] == "fp32"
    assert len(manifest["datasets"]["training_file"]["sha256"]) == 64


def test_publish_replaces_a_previous_artifact_whole(tmp_path):
    first, second = tmp_path / "a1", tmp_path / "a2"
    for d, text in ((first, "one"), (second, "two")):
        d.mkdir()
        (d / "adapter_config.json").write_text(text)
    (first / "stale.bin").write_text("x")
    dest = tmp_path / "artifacts" / "ftjob-x"
    publish(first, dest, {"n": 1})
    publish(second, dest, {"n": 2})
    assert sorted(p.name for p in dest.iterdir()) == ["adapter_config.json", COMMIT_MARKER, MANIFEST]
    assert json.loads((dest / MANIFEST).read_text()) == {"n": 2}
    assert [p.name for p in dest.parent.iterdir()] == ["ftjob-x"]  # no staging left behind


def test_a_published_artifact_downloads_only_once_committed(tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    dest = tmp_path / "artifacts" / "ftjob-y"
    assert not is_committed(dest)
    assert publish(adapter, dest, {"n": 1}) == str(dest)
    assert is_committed(dest)
    out = download(dest, tmp_path / "copy")
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", MANIFEST]
    (dest / COMMIT_MARKER).unlink()
    try:
        download(dest, tmp_path / "again")
    except FileNotFoundError as exc:
        assert "no committed artifact" in str(exc)
    else:
        raise AssertionError("an uncommitted artifact was downloaded")
