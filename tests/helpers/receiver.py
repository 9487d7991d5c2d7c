"""A webhook receiver: an HTTP server on loopback that records what it is sent."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """An HTTP server on 127.0.0.1 that records every request and answers the queued codes
    (200 once they run out). With `check` set, each request is also checked as it arrives, as a
    real receiver verifies a delivery on receipt: `checked` holds what `check(headers, body)`
    returned, or the exception it raised."""

    def __init__(self, check: Callable[[dict[str, str], bytes], Any] | None = None):
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.paths: list[str] = []
        self.codes: list[int] = []
        self.check = check
        self.checked: list[Any] = []
        self.delay_s = 0.0  # how long it takes to answer (a receiver doing its work)
        self.answered = threading.Event()  # set when an answer has been sent
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.requests.append((headers, body))
                receiver.paths.append(self.path)
                if receiver.check is not None:
                    try:
                        receiver.checked.append(receiver.check(headers, body))
                    except Exception as error:  # noqa: BLE001 - kept for the test to assert on
                        receiver.checked.append(error)
                if receiver.delay_s:
                    threading.Event().wait(receiver.delay_s)
                self.send_response(receiver.codes.pop(0) if receiver.codes else 200)
                self.end_headers()
                receiver.answered.set()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
