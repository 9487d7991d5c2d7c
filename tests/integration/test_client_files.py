"""`Client.files`, `AsyncClient.files` and `eft files` against the real app and store."""

import asyncio
import json

import httpx
from typer.testing import CliRunner

from eft import AsyncClient, Client
from eft.cli import main as cli_module
from eft.cli import output as cli_output

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def test_sync_and_async_clients_upload_list_validate_delete(client, tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(CHAT) + "\n" + json.dumps(CHAT) + "\n")
    key = client.headers["Authorization"].removeprefix("Bearer ")
    sync = Client(base_url="http://testserver", api_key=key, http_client=client)
    f = sync.files.create(path)
    assert f.filename == "train.jsonl" and f.bytes == path.stat().st_size
    assert [x.id for x in sync.files.list().data] == [f.id]
    report = sync.files.validate(f.id, model="tiny-llama", max_seq_len=64)
    assert report.ok and report.tokens.loss_tokens > 0 and report.warnings[0].code == "duplicate"

    async def run():
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport) as http:
            aclient = AsyncClient(base_url="http://testserver", api_key=key, http_client=http)
            g = await aclient.files.create(b'{"text": "x"}\n', filename="t.jsonl")
            assert (await aclient.files.retrieve(g.id)).sha256 == g.sha256
            assert (await aclient.files.delete(g.id)).deleted
            return [x.id for x in (await aclient.files.list()).data]

    assert asyncio.run(run()) == [f.id]


def test_eft_files_upload_list_validate(client, tmp_path, monkeypatch):
    key = client.headers["Authorization"].removeprefix("Bearer ")
    monkeypatch.setattr(cli_output, "make_client",
                        lambda base_url, api_key: Client(base_url="http://testserver", api_key=key,
                                                         http_client=client))
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text(json.dumps(CHAT) + "\n")
    bad.write_text(json.dumps(CHAT) + "\n{oops\n")
    runner = CliRunner()
    uploaded = json.loads(runner.invoke(cli_module.app, ["files", "upload", str(good), "--json"]).output)
    bad_id = json.loads(runner.invoke(cli_module.app, ["files", "upload", str(bad), "--json"]).output)["id"]
    listed = runner.invoke(cli_module.app, ["files", "list"])
    assert uploaded["id"] in listed.output and bad_id in listed.output
    assert runner.invoke(cli_module.app, ["files", "validate", uploaded["id"]]).exit_code == 0
    result = runner.invoke(cli_module.app, ["files", "validate", bad_id])
    assert result.exit_code == 1 and "line 2" in result.output
