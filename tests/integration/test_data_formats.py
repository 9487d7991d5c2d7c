"""Datasets as people have them: JSONL, Parquet, CSV and `datasets` directories; OpenAI chat,
prompt/completion, text, Alpaca, ShareGPT and other column names through a mapping. Each goes
through the request checks and the scheduler's validation, and gives the same examples as the
same records in canonical JSONL."""

from __future__ import annotations

import csv
import json

import pyarrow as pa
import pyarrow.parquet as pq

from eft.training.formats import normalize
from tests.helpers.app import validate_pending

N = 6
CHAT = [{"messages": [{"role": "user", "content": f"What is {i} plus one?"},
                      {"role": "assistant", "content": f"It is {i + 1}."}]} for i in range(N)]


def _validate(service, body) -> dict:
    """POST the job, run one validation pass; returns the `queued` event's stats."""
    c, store, settings = service
    r = c.post("/jobs", json={"model": "tiny-qwen2.5", **body})
    assert r.status_code == 201, r.text
    validate_pending(store, settings)
    job = store.get_job(r.json()["id"])
    assert job.status.value == "queued", job.error_message
    return [e for e in store.list_events(job.id)[0] if e.type == "queued"][0].data


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_every_file_kind_gives_the_examples_of_its_jsonl(service, eft_home):
    import datasets

    data = eft_home / "data"
    _jsonl(data / "chat.jsonl", CHAT)
    pq.write_table(pa.Table.from_pylist(CHAT), data / "chat.parquet")
    with open(data / "chat.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["messages"])
        writer.writeheader()
        writer.writerows({"messages": json.dumps(r["messages"])} for r in CHAT)
    datasets.Dataset.from_list(CHAT).save_to_disk(str(data / "chat-arrow"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(CHAT)}).save_to_disk(str(data / "chat-dict"))
    reference = _validate(service, {"training_file": "chat.jsonl"})
    assert reference["train_examples"] == N
    for name in ("chat.parquet", "chat.csv", "chat-arrow", "chat-dict"):
        stats = _validate(service, {"training_file": name})
        assert (stats["train_tokens"], stats["loss_tokens"]) == (reference["train_tokens"], reference["loss_tokens"]), name


def test_alpaca_sharegpt_and_mapped_columns_are_chat_and_pairs(service, eft_home):
    data = eft_home / "data"
    alpaca = [{"instruction": f"What is {i} plus one?", "input": "", "output": f"It is {i + 1}."} for i in range(N)]
    sharegpt = [{"conversations": [{"from": "human", "value": f"What is {i} plus one?"},
                                   {"from": "gpt", "value": f"It is {i + 1}."}]} for i in range(N)]
    _jsonl(data / "chat.jsonl", CHAT)
    _jsonl(data / "alpaca.jsonl", alpaca)
    _jsonl(data / "sharegpt.jsonl", sharegpt)
    reference = _validate(service, {"training_file": "chat.jsonl"})
    for name in ("alpaca.jsonl", "sharegpt.jsonl"):
        stats = _validate(service, {"training_file": name})
        assert (stats["train_tokens"], stats["loss_tokens"]) == (reference["train_tokens"], reference["loss_tokens"]), name
    qa = [{"question": f"What is {i} plus one?", "answer": f" It is {i + 1}."} for i in range(N)]
    pq.write_table(pa.Table.from_pylist(qa), data / "qa.parquet")
    pairs = [{"prompt": r["question"], "completion": r["answer"]} for r in qa]
    _jsonl(data / "pairs.jsonl", pairs)
    mapped = _validate(service, {"training_file": "qa.parquet",
                                 "data": {"columns": {"prompt": "question", "completion": "answer"}}})
    assert mapped["loss_tokens"] == _validate(service, {"training_file": "pairs.jsonl"})["loss_tokens"]


def test_unknown_shapes_and_columns_are_named(service, eft_home):
    c, _, _ = service
    data = eft_home / "data"
    pq.write_table(pa.Table.from_pylist([{"question": "q", "answer": "a"}]), data / "qa.parquet")
    r = c.post("/jobs", json={"model": "tiny-qwen2.5", "training_file": "qa.parquet"})
    problem = r.json()["error"]["errors"][0]
    assert r.status_code == 422 and problem["param"] == "training_file:line 1:record"
    r = c.post("/jobs", json={"model": "tiny-qwen2.5", "training_file": "qa.parquet",
                              "data": {"columns": {"question": "prompt"}}})
    assert r.status_code == 422 and r.json()["error"]["errors"][0]["param"] == "data.columns"
    (data / "broken.parquet").write_bytes(b"PAR1 not really")
    r = c.post("/jobs", json={"model": "tiny-qwen2.5", "training_file": "broken.parquet"})
    problem = r.json()["error"]["errors"][0]
    assert r.status_code == 422 and problem["code"] == "file_unreadable" and "Parquet" in problem["message"]
    (data / "plain-dir").mkdir()
    r = c.post("/jobs", json={"model": "tiny-qwen2.5", "training_file": "plain-dir"})
    assert r.status_code == 422 and r.json()["error"]["errors"][0]["code"] == "not_a_file"


def test_uploads_take_parquet_and_csv(service, tmp_path):
    c, _, _ = service
    path = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist(CHAT), path)
    up = c.post("/files", files={"file": ("chat.parquet", path.read_bytes(), "application/octet-stream")},
                data={"purpose": "fine-tune"})
    assert up.status_code == 201, up.text
    report = c.post(f"/files/{up.json()['id']}/validate", json={"model": "tiny-qwen2.5"}).json()
    assert report["ok"] and report["records"] == N and report["formats"] == {"chat": N}
    stats = _validate(service, {"training_file": up.json()["id"]})
    assert stats["train_examples"] == N


def test_normalize_keeps_weights_tools_and_system():
    record = normalize({"conversations": [
        {"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi"},
        {"from": "gpt", "value": "Hello", "weight": 0}, {"from": "human", "value": "Bye"},
        {"from": "gpt", "value": "Bye"}], "tools": [{"type": "function"}]})
    assert [m["role"] for m in record["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert record["messages"][2]["weight"] == 0 and record["tools"] == [{"type": "function"}]
    alpaca = normalize({"instruction": "Add", "input": "1 and 2", "output": "3", "system": "Math."})
    assert alpaca == {"messages": [{"role": "system", "content": "Math."},
                                   {"role": "user", "content": "Add\n\n1 and 2"},
                                   {"role": "assistant", "content": "3"}]}


def test_a_long_csv_cell_reads_and_one_beyond_the_readers_limit_is_a_4xx(service, eft_home):
    """A document of 200 KB in one CSV cell is data like any other (Python's CSV reader stops at
    128 KiB by default, which made validating the upload a 500); a cell beyond the reader's limit
    is a 422 naming the file, both through a job and through the upload's validation."""
    from eft.training.formats import MOST_CSV_CELL_CHARS

    c, _, _ = service
    long_text = "word " * 40_000
    with open(eft_home / "data" / "long.csv", "w", newline="") as out:
        csv.writer(out).writerows([["text"], [long_text], ["short one"]])
    stats = _validate(service, {"training_file": "long.csv", "hyperparameters": {"max_seq_len": 64}})
    assert stats["train_examples"] == 2, stats
    uploaded = c.post("/files", files={"file": ("long.csv", (eft_home / "data" / "long.csv").read_bytes())},
                      data={"purpose": "fine-tune"}).json()
    report = c.post(f"/files/{uploaded['id']}/validate")
    assert report.status_code == 200 and report.json()["records"] == 2, report.text

    huge = b"text\n" + b"a" * (MOST_CSV_CELL_CHARS + 1) + b"\n"
    uploaded = c.post("/files", files={"file": ("huge.csv", huge)}, data={"purpose": "fine-tune"}).json()
    r = c.post(f"/files/{uploaded['id']}/validate")
    assert r.status_code == 422 and r.json()["error"]["param"] == "file_id", r.text
    assert "field larger than field limit" in r.json()["error"]["message"]
    r = c.post("/jobs", json={"model": "tiny-qwen2.5", "training_file": uploaded["id"]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "training_file", r.text


def test_parquet_that_decodes_to_gigabytes_or_too_many_rows_is_a_4xx(service, eft_home):
    """Before: read whole, however much a few bytes of dictionary or run-length encoding stood
    for (a 619-byte file decoded to 1.1 GB; 5 million empty rows held both scan helpers for
    two minutes). Now its footer's rows and columns are checked before a row is read, and what
    it decodes to is counted as it is read."""
    import time

    import numpy as np

    from eft.training.formats import MOST_PARQUET_ROWS

    client, _, _ = service
    data = eft_home / "data"
    rows = 2_000_000  # the same 2 KB answer, through a dictionary: ~4 GB decoded
    indices = pa.array(np.zeros(rows, dtype=np.int32))
    answer = pa.DictionaryArray.from_arrays(indices, pa.array(["It is sunny. " * 150]))
    prompt = pa.DictionaryArray.from_arrays(indices, pa.array(["Weather?"]))
    pq.write_table(pa.table({"prompt": prompt, "completion": answer}), data / "bomb.parquet")
    assert (data / "bomb.parquet").stat().st_size < 2**20
    many = pa.table({"text": pa.DictionaryArray.from_arrays(pa.array(np.zeros(MOST_PARQUET_ROWS + 1, dtype=np.int8)),
                                                            pa.array(["Hello."]))})
    pq.write_table(many, data / "many.parquet")
    for name, words in (("bomb.parquet", "decodes to more than"), ("many.parquet", "rows, more than")):
        started = time.monotonic()
        refused = client.post("/jobs", json={"model": "tiny-qwen2.5", "training_file": name})
        took = time.monotonic() - started
        assert refused.status_code == 422, refused.text
        (problem,) = refused.json()["error"]["errors"]
        assert problem["param"] == "training_file" and problem["code"] == "file_unreadable", problem
        assert words in problem["message"], problem
        assert took < 30, took  # the bomb stops at 256 MB decoded; the rows are never read
