"""A Hugging Face Hub on loopback for reads: the repository listing (`repo_info`, with file
sizes) and file downloads that `huggingface_hub`'s `snapshot_download` makes, for repositories
made of local directories. A private repository answers only to its token (as the Hub does:
404 `RepoNotFound` otherwise); every request is recorded with the token it carried."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from pathlib import Path


class FakeHub:
    def __init__(self, token: str = "hf_operator_token"):
        self.token = token
        self.repos: dict[str, dict] = {}  # "models/acme/x" -> {"files": {name: bytes}, "private", "sizes"}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Authorization)
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _send(self, status, body=b"", headers=None, head=False):
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _route(self, head: bool):
                hub.requests.append((self.command, self.path, self.headers.get("Authorization")))
                path = self.path.split("?")[0]
                parts = path.strip("/").split("/")
                if parts[0] == "api":  # /api/{models|datasets}/{org}/{name}/revision/{rev}
                    kind, repo = parts[1], f"{parts[2]}/{parts[3]}"
                else:  # /{org}/{name}/resolve/{rev}/{file} or /datasets/{org}/{name}/resolve/...
                    kind = "datasets" if parts[0] == "datasets" else "models"
                    parts = parts[1:] if kind == "datasets" else parts
                    repo = f"{parts[0]}/{parts[1]}"
                entry = hub.repos.get(f"{kind}/{repo}")
                allowed = entry is not None and (not entry["private"]
                                                 or self.headers.get("Authorization") == f"Bearer {hub.token}")
                if not allowed:
                    return self._send(404, b'{"error": "Repository not found"}',
                                      {"X-Error-Code": "RepoNotFound", "Content-Type": "application/json"}, head)
                sha = entry["sha"]
                if self.path.startswith("/api/") and "tree" in parts:  # /api/models/{org}/{name}/tree/{rev}
                    body = json.dumps([{"type": "file", "path": name, "oid": hashlib.sha1(data).hexdigest(),
                                        "size": len(data)} for name, data in entry["files"].items()]).encode()
                    return self._send(200, body, {"Content-Type": "application/json"}, head)
                if self.path.startswith("/api/"):
                    siblings = [{"rfilename": name, "size": entry["sizes"].get(name, len(data))}
                                for name, data in entry["files"].items()]
                    body = json.dumps({"id": repo, "sha": sha, "private": entry["private"],
                                       "siblings": siblings}).encode()
                    return self._send(200, body, {"Content-Type": "application/json"}, head)
                name = "/".join(parts[4:])
                data = entry["files"].get(name)
                if data is None:
                    return self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, head)
                return self._send(200, data, {"X-Repo-Commit": sha, "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
                                              "Content-Type": "application/octet-stream"}, head)

            def do_GET(self):  # noqa: N802
                self._route(head=False)

            def do_HEAD(self):  # noqa: N802
                self._route(head=True)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, repo: str, directory: Path, private: bool = False, kind: str = "models",
            sizes: dict[str, int] | None = None) -> None:
        files = {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}
        self.repos[f"{kind}/{repo}"] = {"files": files, "private": private, "sizes": sizes or {},
                                        "sha": hashlib.sha1(repo.encode()).hexdigest()}

    def sent_token(self) -> bool:
        return any(auth for _, _, auth in self.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def cached_model(cache: Path, repo_id: str, source: Path, commit: str) -> Path:
    """`repo_id` at `commit` (main pointing there) in a Hugging Face cache at `cache`, laid out
    as huggingface_hub writes it, holding a copy of the model directory `source`. Returns the
    snapshot directory."""
    import shutil

    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(source, snapshot)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot
