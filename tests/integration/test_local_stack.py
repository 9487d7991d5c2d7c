"""`eft up` right after a previous local stack stopped: it waits for the old head's GCS port
instead of joining a GCS that is shutting down (Ray's "session name does not match")."""

import socket
import threading
import time

import pytest

from eft.api import local

pytestmark = pytest.mark.integration


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
