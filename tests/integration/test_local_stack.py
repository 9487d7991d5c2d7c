"""`eft up` right after a previous local stack stopped: it waits for the old head's GCS port
instead of joining a GCS that is shutting down (Ray's "session name does not match")."""

import http.server
import socket
import threading
import time

import pytest

from eft.api import local


def _listening() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def test_up_waits_for_a_stopping_head_to_release_its_port():
    old_gcs = _listening()
    port = old_gcs.getsockname()[1]
    released = threading.Event()

    def shut_down_slowly():  # the previous head's GCS takes a moment to exit
        released.wait(timeout=30)
        old_gcs.close()

    closer = threading.Thread(target=shut_down_slowly)
    closer.start()
    waiter = threading.Thread(target=local.wait_for_previous_head, args=(port, 30))
    waiter.start()
    waiter.join(timeout=1.5)
    assert waiter.is_alive(), "started while the old head still held its port"
    released.set()
    waiter.join(timeout=30)
    closer.join()
    assert not waiter.is_alive()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1)


def test_a_port_that_stays_taken_is_a_clear_error():
    squatter = _listening()
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="stop --force"):
            local.wait_for_previous_head(squatter.getsockname()[1], timeout_s=1)
        assert time.monotonic() - started >= 1
    finally:
        squatter.close()


class _Answer(http.server.BaseHTTPRequestHandler):
    body = b'{"detail": "Not Found"}'

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200 if self.body.startswith(b'{"status"') else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def _http_server(body: bytes) -> http.server.ThreadingHTTPServer:
    handler = type("Answer", (_Answer,), {"body": body})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", local.listen_ports(1)[0]), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_port_another_program_holds_is_named_before_ray_starts(monkeypatch):
    other = _http_server(b'{"detail": "Not Found"}')  # another web server on the port
    port = other.server_address[1]
    try:
        with pytest.raises(local.PortTaken) as taken:
            local.check_port("127.0.0.1", port)
        assert f"port {port}" in str(taken.value) and "--port" in str(taken.value) and "EFT_PORT" in str(taken.value)

        # `eft up` on that port: exit code 2 and the reason, and no Ray started for nothing.
        from typer.testing import CliRunner

        from eft.cli.main import app

        monkeypatch.setattr(local, "ray_is_running", lambda: False)
        monkeypatch.setattr(local, "start_ray_head", lambda *a: pytest.fail("started Ray for a port it cannot use"))
        result = CliRunner().invoke(app, ["up", "--port", str(port)])
        assert result.exit_code == 2, result.output
        assert f"port {port}" in result.output and "--port" in result.output
    finally:
        other.shutdown()
        other.server_close()


def test_a_free_port_or_this_services_own_passes():
    local.check_port("127.0.0.1", local.listen_ports(1)[0])
    ours = _http_server(b'{"status": "ok", "version": "0", "database": true}')  # a running eft answers /healthz
    try:
        local.check_port("127.0.0.1", ours.server_address[1])  # a redeploy on its own port
    finally:
        ours.shutdown()
        ours.server_close()
