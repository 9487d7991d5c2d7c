"""Headless Chromium (Debian's package; `make test` installs it) reading the service's pages: the
DOM once scripts ran, a screenshot, or the page once a script condition holds."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

from tests.helpers.budgets import machine_factor
from tests.helpers.service_api import api, free_port

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1280,1500"]


def chromium_when(url: str, condition: str, timeout_s: float = 180) -> str:
    """The page's HTML once the JavaScript `condition` holds, read over the DevTools protocol."""
    from websockets.sync.client import connect

    port = free_port()
    # Chromium's helper processes may still be writing the profile as the browser exits: the
    # whole process group is stopped, and a file they leave behind does not fail the test.
    with tempfile.TemporaryDirectory(prefix="eft-chromium-", ignore_cleanup_errors=True) as profile:
        browser = subprocess.Popen([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                    f"--remote-debugging-port={port}", "--remote-allow-origins=*", url],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout_s * machine_factor()
            pages = []
            while not pages:
                assert time.monotonic() < deadline, "chromium never listed the page"
                try:
                    pages = [t for t in api.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
                             if t["type"] == "page"]
                except Exception:  # noqa: BLE001 - not listening yet
                    time.sleep(0.2)
            with connect(pages[0]["webSocketDebuggerUrl"], max_size=None) as ws:
                calls = iter(range(1, 1_000_000))

                def evaluate(expression: str):  # noqa: ANN202
                    n = next(calls)
                    ws.send(json.dumps({"id": n, "method": "Runtime.evaluate",
                                        "params": {"expression": expression, "returnByValue": True}}))
                    while (reply := json.loads(ws.recv(timeout=timeout_s))).get("id") != n:
                        pass
                    return reply["result"]["result"].get("value")

                while not evaluate(f"Boolean(document.readyState === 'complete' && ({condition}))"):
                    assert time.monotonic() < deadline, f"the page never got to: {condition}"
                    time.sleep(0.2)
                return evaluate("document.documentElement.outerHTML")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(browser.pid, signal.SIGTERM)
            browser.wait(timeout=30)


def chromium(*args: str) -> str:
    with tempfile.TemporaryDirectory(prefix="eft-chromium-", ignore_cleanup_errors=True) as profile:
        result = subprocess.run(
            [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=15000", *args],
            capture_output=True, text=True, timeout=120,
        )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout
