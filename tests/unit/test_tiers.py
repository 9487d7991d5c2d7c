"""The tiers' time budgets (tests/helpers/budgets.py) and the runner that takes tiers in order
of cost (tests/tiers.py), on a throwaway test tree run by a real pytest in a subprocess: a tier
within its budget passes, one over it within the tolerance warns, one beyond the tolerance fails
the run although its tests pass, and a failing tier stops the tiers after it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import tiers
from tests.helpers.budgets import judge, speed_factor, tier_of
from tests.helpers.paths import REPO

#: A test that takes half a second: the tier's cost, made on purpose.
SLOW = "import time\n\ndef test_slow():\n    time.sleep(0.5)\n    assert True\n"
FAILING = "def test_broken():\n    assert 1 == 2\n"


def _tree(root: Path, budgets_s: dict[str, float], tests: dict[str, str], tolerance: float = 1.0) -> dict[str, str]:
    """A test tree of tiers under `root` with its own budgets file; returns the environment
    that runs pytest on it with the plugin loaded."""
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p tests.helpers.budgets -p no:cacheprovider\n")
    lines = [f"tolerance = {tolerance}"]
    lines += [f"[tiers.{tier}]\nminutes = {seconds / 60!r}" for tier, seconds in budgets_s.items()]
    (root / "budgets.toml").write_text("\n".join(lines) + "\n")
    for path, text in tests.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFT_TEST_")}
    return {**env, "PYTHONPATH": str(REPO), "EFT_TEST_BUDGETS_FILE": str(root / "budgets.toml")}


def _pytest(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)


def _run_tiers(root: Path, env: dict[str, str], capfd) -> tuple[int, str]:  # noqa: ANN001
    """tests/tiers.py run over every tier of the tree at `root`, in this process: (exit status, output)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        code = tiers.main([], root=root)
    return code, capfd.readouterr().out


def test_a_tier_is_the_directory_of_its_test():
    assert tier_of("tests/unit/service/test_policy.py::test_x[a/b]") == "unit"
    assert tier_of("tests/e2e/test_job.py::test_y") == "e2e"
    assert tier_of("tests/conftest.py") is None and tier_of("other/test_z.py::t") is None


def test_verdicts_against_the_budget_and_its_tolerance():
    budgets = {"unit": 1.0, "e2e": 10.0}
    verdicts = {v.tier: v for v in judge({"unit": 50, "e2e": 700, "extra": 1}, budgets, 0.25)}
    assert list(verdicts) == ["unit", "e2e", "extra"]
    assert verdicts["unit"].state == "ok"
    assert verdicts["e2e"].state == "over" and "OVER BUDGET" in verdicts["e2e"].line()
    assert judge({"e2e": 751}, budgets, 0.25)[0].state == "failed"
    assert verdicts["extra"].state == "failed"  # a tier with no budget line has none


def test_a_slower_machine_gets_proportionally_more_time_up_to_a_limit():
    assert speed_factor(0.29, 0.145, most=2.0) == pytest.approx(2.0)
    assert speed_factor(0.10, 0.145, most=2.0) == 1.0  # never less than the budget
    assert speed_factor(1.45, 0.145, most=2.0) == 2.0  # a machine 10x slower gets twice the time
    slow = judge({"e2e": 751}, {"e2e": 10.0}, 0.25, factor=1.5)[0]
    assert slow.state == "ok" and "x1.50 for this machine's speed" in slow.line()
    assert judge({"e2e": 1126}, {"e2e": 10.0}, 0.25, factor=1.5)[0].state == "failed"


def test_a_tier_within_its_budget_passes_and_prints_its_time(tmp_path):
    env = _tree(tmp_path, {"unit": 30}, {"tests/unit/test_a.py": SLOW})
    run = _pytest(tmp_path, env, "tests")
    assert run.returncode == 0, run.stdout
    assert "tier unit 0.0 min of 0.5" in run.stdout


def test_a_tier_over_its_budget_within_the_tolerance_warns(tmp_path):
    env = _tree(tmp_path, {"unit": 0.4}, {"tests/unit/test_a.py": SLOW}, tolerance=1.0)
    run = _pytest(tmp_path, env, "tests")
    assert run.returncode == 0, run.stdout
    assert "OVER BUDGET (within tolerance" in run.stdout


def test_a_tier_beyond_its_tolerance_fails_the_run_though_its_tests_pass(tmp_path):
    env = _tree(tmp_path, {"unit": 0.1, "e2e": 30}, {"tests/unit/test_a.py": SLOW, "tests/e2e/test_b.py": SLOW},
                tolerance=1.0)
    run = _pytest(tmp_path, env, "tests")
    assert run.returncode == 1, run.stdout
    assert "2 passed" in run.stdout
    assert "tier unit" in run.stdout and "FAILED: over the budget's limit" in run.stdout
    assert "make the new cost cheaper" in run.stdout
    # The markers a tier's tests get from their directory select by cost.
    selected = _pytest(tmp_path, env, "tests", "-m", "not unit")
    assert selected.returncode == 0 and "1 passed, 1 deselected" in selected.stdout, selected.stdout
    # Off for one run: the line stays, the run passes.
    off = _pytest(tmp_path, {**env, "EFT_TEST_BUDGETS": "off"}, "tests")
    assert off.returncode == 0 and "EFT_TEST_BUDGETS=off" in off.stdout, off.stdout


def test_the_runner_stops_at_the_first_failing_tier(tmp_path, capfd):
    env = _tree(tmp_path, {"unit": 30, "integration": 30, "e2e": 30},
                {"tests/unit/test_a.py": FAILING, "tests/integration/test_b.py": SLOW, "tests/e2e/test_c.py": SLOW})
    code, out = _run_tiers(tmp_path, env, capfd)
    assert code == 1
    assert "=== tier unit" in out and "=== tier integration" not in out and "test_b.py" not in out
    assert "FAILED (exit 1)" in out and "not started after the failure: integration, e2e" in out


def test_the_runner_runs_every_tier_in_order_and_sums_them_up(tmp_path, capfd):
    env = _tree(tmp_path, {"unit": 30, "integration": 30},
                {"tests/unit/test_a.py": SLOW, "tests/integration/test_b.py": SLOW})
    code, out = _run_tiers(tmp_path, env, capfd)
    assert code == 0
    assert out.index("=== tier unit") < out.index("=== tier integration")
    summary = out[out.index("=== time per tier"):]
    assert "unit" in summary and "integration" in summary and summary.count("passed") == 2
    assert tiers.main(["nonsense"], root=tmp_path) == 2


def test_deadlines_stretch_with_the_machines_measured_slowness(monkeypatch, tmp_path):
    """A machine that ran the calibration 2.5 times slower than the budgets' machine waits 2.5
    times longer for a job or a node before a test gives up (and says so), up to `most`."""
    from tests.helpers import budgets
    from tests.helpers.jobs import until

    path = tmp_path / "budgets.toml"
    path.write_text("tolerance = 0.25\n[calibration]\nreference_s = 0.1\nmost = 3.0\n[tiers.unit]\nminutes = 1\n")
    monkeypatch.setenv("EFT_TEST_BUDGETS_FILE", str(path))
    monkeypatch.setattr(budgets, "_MACHINE_CALIBRATION", [0.25])
    assert budgets.machine_factor() == pytest.approx(2.5)
    with pytest.raises(pytest.fail.Exception, match=r"waiting for nothing \(0.01s x2.50 for this machine's speed\)"):
        until("nothing", lambda: None, timeout_s=0.01)
    monkeypatch.setattr(budgets, "_MACHINE_CALIBRATION", [10.0])
    assert budgets.machine_factor() == pytest.approx(3.0)  # at most `most`
    monkeypatch.setattr(budgets, "_MACHINE_CALIBRATION", [0.05])
    assert budgets.machine_factor() == 1.0  # a faster machine keeps the deadlines as written


def test_each_kind_of_machine_is_compared_with_itself_quiet():
    """The loop's reference is the one of the CPU model the run is on; a model not listed is
    compared with the fastest listed (the most lenient); a single number is every machine's."""
    from tests.helpers.budgets import reference_for

    references = {"AMD EPYC": 0.093, "Intel(R) Xeon": 0.145}
    assert reference_for(references, "AMD EPYC 9B45") == 0.093
    assert reference_for(references, "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz") == 0.145
    assert reference_for(references, "Apple M3") == 0.093
    assert reference_for(0.12, "anything") == 0.12
    assert reference_for({}, "anything") == 0.0  # no reference: budgets are not scaled
