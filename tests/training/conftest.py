"""The training tier runs each attempt's driver in the test process: it gets the Ray Train
settings a job's Ray Job gets from the service (service/settings.py:driver_environment), so that
its controller polls its workers as often as a deployed job's does (Ray's own default is 2 s:
each run would wait up to that long for its start, each checkpoint and its end)."""

from __future__ import annotations

import pytest

from eft.service.settings import Settings


@pytest.fixture(scope="session", autouse=True)
def ray_train_settings():
    env = {k: v for k, v in Settings().driver_environment().items() if k.startswith("RAY_TRAIN_")}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        yield env
