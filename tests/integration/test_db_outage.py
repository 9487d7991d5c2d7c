"""A database outage mid-job: the service's scheduler and a job's reporter reach PostgreSQL
through a TCP proxy that the test cuts (every open connection reset, new ones refused) and
restores. The scheduler's passes fail and go on, the reporter's writes wait the outage out
(the checkpoint callbacks' patience), and the job still ends exactly once with every step's
metrics and a complete event history; no Ray Job is left running unwatched."""

from __future__ import annotations

import socket
import threading

import pytest

from eft.service.runs.launcher import RayJobState
from eft.service.runs.reporter import StoreReporter
from eft.service.scheduling.scheduler import Scheduler
from eft.service.settings import Settings
from eft.service.store.store import Store
from eft.training import controller
from eft.training.reporting import RunSpec
from eft.types.jobs import JobStatus

from tests.helpers.databases import POSTGRES_URL, postgres_schema_url
from tests.helpers.fakes import RecordingLauncher, unknown_capacity, validate_ok

pytestmark = pytest.mark.postgres


class Proxy:
    """A TCP proxy to PostgreSQL on loopback that can be cut and restored."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.up = threading.Event()
        self.up.set()
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up.is_set():
                client.close()  # the database is unreachable
                continue
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        self.up.clear()
        with self.lock:
            for s in self.sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.sockets.clear()

    def restore(self) -> None:
        self.up.set()

    def close(self) -> None:
        self.cut()
        self.listener.close()


@pytest.fixture
def proxied_url():
    import sqlalchemy as sa

    real = sa.engine.make_url(POSTGRES_URL)
    proxy = Proxy((real.host or "127.0.0.1", real.port or 5432))
    with postgres_schema_url("eft_outage") as url:
        yield url.replace(f"{real.host}:{real.port or 5432}", f"127.0.0.1:{proxy.port}", 1), proxy
    proxy.close()


def test_a_database_outage_mid_job_loses_nothing_and_ends_the_job_once(proxied_url):
    url, proxy = proxied_url
    store = Store(url)
    launcher = RecordingLauncher()
    scheduler = Scheduler(store, launcher, Settings(dispatch_grace_s=3600), validate_ok, nodes=unknown_capacity)
    job = store.create_job(tenant="t", request={"model": "tiny-llama", "training_file": "t.jsonl"})
    scheduler.tick()
    job = store.get_job(job.id)
    assert job.status is JobStatus.running and launcher.state(job.submission_id) == RayJobState.RUNNING

    # The job's driver: its reporter writes through the same proxy; its callbacks' reports
    # are patient (controller._Reporting.report).
    reporter = StoreReporter(url, job.id, job.attempt)
    callbacks = controller._Reporting(reporter, RunSpec(job_id=job.id, attempt=job.attempt, tenant="t", name=None), {})
    for step in (1, 2):
        assert reporter.step(step, 1)
        reporter.metrics(step, {"loss": 3.0 - step})

    proxy.cut()
    scheduler.tick()  # every phase fails on the database; the pass itself survives
    outcome: list[object] = []
    writer = threading.Thread(target=lambda: outcome.append(callbacks.report(
        "metrics", lambda: reporter.metrics(3, {"loss": 0.5}) or "recorded")))
    writer.start()
    writer.join(timeout=2)
    assert writer.is_alive(), "the report gave up at once instead of waiting the outage out"
    proxy.restore()
    writer.join(timeout=60)
    assert not writer.is_alive() and outcome == ["recorded"]

    assert reporter.succeeded("/artifacts/x", {"loss": 0.5}, 3)
    launcher.states[job.submission_id] = RayJobState.SUCCEEDED
    scheduler.tick()
    done = store.get_job(job.id)
    assert done.status is JobStatus.succeeded and done.attempt == 1
    assert [m["step"] for m in store.list_metrics(job.id)] == [1, 2, 3]
    types = [e.type for e in store.list_events(job.id)[0]]
    assert types == ["created", "queued", "dispatched", "submitted", "succeeded"], types
    assert launcher.submitted == [job.submission_id]  # one Ray Job, never a second one
    assert [s for s, state in launcher.states.items() if state == RayJobState.RUNNING] == []
    store.close()
