"""Test tiers and their time budgets (tests/budgets.toml), as a pytest plugin.

The directory is the tier: a test under tests/<tier>/ gets the marker <tier>, so `-m "not e2e"`
selects by cost. Each test's setup, call and teardown time is added to its tier; at the end of the
run every tier that ran prints its time against its budget, and a tier over its budget by more
than the file's tolerance fails the run (exit status 1) even when every test passed.

Loaded by tests/conftest.py; `EFT_TEST_BUDGETS=off` turns the check off for one run.
"""

from __future__ import annotations

import collections
import os
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

BUDGETS_FILE = Path(__file__).resolve().parents[1] / "budgets.toml"
#: Where the time of each tier goes, for `tests/tiers.py` to sum up a run of several processes.
TIMES_ENV = "EFT_TEST_TIMES_FILE"


#: How many cores the calibration loads at once: the smallest machine the suite runs on has two,
#: and its tiers keep both busy.
CALIBRATION_CORES = 2


def _loop_s() -> float:
    """The fixed piece of single-threaded Python work, timed: the median of three."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        sum(i * i for i in range(3_000_000))
        times.append(time.perf_counter() - started)
    return sorted(times)[1]


def calibration_s() -> float:
    """Seconds this machine takes now for a fixed piece of single-threaded Python work, run on
    CALIBRATION_CORES cores at once (the slowest of them): the kind of work most test time is,
    on as many cores as the tiers keep busy, so that a machine whose second core is taken by a
    neighbour reads as slow as it is. The budgets file gives what a quiet machine of its kind
    took."""
    children = []
    for _ in range(CALIBRATION_CORES - 1):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: time the loop, hand the reading over, and leave at once
            os.close(read)
            try:
                os.write(write, repr(_loop_s()).encode())
            finally:
                os._exit(0)
        os.close(write)
        children.append((pid, read))
    readings = [_loop_s()]
    for pid, read in children:
        with os.fdopen(read) as pipe:
            text = pipe.read()
        os.waitpid(pid, 0)
        if text:
            readings.append(float(text))
    return max(readings)


_MACHINE_CALIBRATION: list[float] = []


def machine_factor() -> float:
    """How much slower than a quiet machine of its kind this one ran the calibration when the run began
    (from 1 up to the budgets file's `most`): what the tiers' budgets are scaled by, and what
    the tests' deadlines for a job or a node (tests/helpers/jobs.py:until) are stretched by, so
    that a machine twice as slow waits twice as long instead of failing a check that holds."""
    reference_s, most = load_calibration(budgets_path())
    if not reference_s:
        return 1.0
    if not _MACHINE_CALIBRATION:
        _MACHINE_CALIBRATION.append(calibration_s())
    return speed_factor(_MACHINE_CALIBRATION[0], reference_s, most)


def speed_factor(measured_s: float, reference_s: float, most: float) -> float:
    """How much slower this machine ran the calibration than a quiet one of its kind: budgets are
    scaled by it, from 1 (never below the budget) up to `most` (a machine slower than that is
    not a reason to pass a tier that is slower still)."""
    return min(max(measured_s / reference_s, 1.0), most)


@dataclass(frozen=True)
class Verdict:
    """One tier's time against its budget (scaled to the machine): `state` is ok, over (a
    warning) or failed."""

    tier: str
    seconds: float
    budget_s: float
    limit_s: float
    factor: float = 1.0

    @property
    def state(self) -> str:
        if self.seconds > self.limit_s:
            return "failed"
        return "over" if self.seconds > self.budget_s else "ok"

    def line(self) -> str:
        share = self.seconds / self.budget_s if self.budget_s else float("inf")
        scaled = f" (x{self.factor:.2f} for this machine's speed)" if self.factor >= 1.005 else ""
        text = (f"{self.tier} {self.seconds / 60:.1f} min of {self.budget_s / 60:.3g}{scaled} "
                f"({share:.0%})")
        if self.state == "over":
            text += " OVER BUDGET (within tolerance: a slow machine?)"
        elif self.state == "failed":
            text += f" FAILED: over the budget's limit of {self.limit_s / 60:.1f} min"
        return text


def budgets_path() -> Path:
    """tests/budgets.toml, or the file EFT_TEST_BUDGETS_FILE names (the plugin's own tests)."""
    return Path(os.environ.get("EFT_TEST_BUDGETS_FILE", BUDGETS_FILE))


def load_budgets(path: Path = BUDGETS_FILE) -> tuple[dict[str, float], float]:
    """(minutes per tier in run order, tolerance) from the budgets file."""
    data = tomllib.loads(path.read_text())
    return {name: float(tier["minutes"]) for name, tier in data["tiers"].items()}, float(data["tolerance"])


def cpu_model() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it ("" where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def reference_for(references: float | dict[str, float], model: str) -> float:
    """The calibration's seconds on a quiet machine of this CPU model: the budgets file gives one
    per kind of machine the budgets were measured on, keyed by a part of the model name (a CPU
    fast at the calibration's loop is not always as fast at the tests: each kind is compared with
    itself quiet). A model not listed is compared with the fastest listed, the most lenient."""
    if not isinstance(references, dict):
        return float(references)
    for part, seconds in references.items():
        if part.lower() in model.lower():
            return float(seconds)
    return min((float(v) for v in references.values()), default=0.0)


def load_calibration(path: Path = BUDGETS_FILE, model: str | None = None) -> tuple[float, float]:
    """(the calibration's seconds on a quiet machine like this one, the most budgets are scaled by)."""
    data = tomllib.loads(path.read_text()).get("calibration", {})
    reference = reference_for(data.get("reference_s", 0.0), cpu_model() if model is None else model)
    return reference, float(data.get("most", 1.0))


def judge(seconds_by_tier: dict[str, float], budgets_min: dict[str, float], tolerance: float,
          factor: float = 1.0) -> list[Verdict]:
    """The verdict of every tier that ran, in the budgets file's order, its budget scaled by
    `factor`. A tier with no budget line has a budget of zero: it fails, naming itself, as soon
    as it takes any time."""
    order = [*budgets_min, *sorted(set(seconds_by_tier) - set(budgets_min))]
    return [Verdict(tier, seconds_by_tier[tier], budgets_min.get(tier, 0.0) * 60 * factor,
                    budgets_min.get(tier, 0.0) * 60 * factor * (1 + tolerance), factor)
            for tier in order if tier in seconds_by_tier]


def tier_of(nodeid: str) -> str | None:
    """`tests/<tier>/...` -> <tier>; None for anything else (a conftest-level report)."""
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else None


class TierBudgets:
    def __init__(self, config: pytest.Config):
        self.config = config
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.started = time.monotonic()
        self.budgets_min, self.tolerance = load_budgets(budgets_path())
        self.enforce = os.environ.get("EFT_TEST_BUDGETS", "on").lower() not in ("off", "0", "false", "no")
        self.reference_s, self.most = load_calibration(budgets_path())
        # The machine's speed at the start and (pytest_sessionfinish) at the end of the run: a
        # machine slow or busy throughout gets budgets scaled by the faster of the two, the reading
        # least disturbed (the end's can catch the tier's own cluster still shutting down).
        self.calibrations = [calibration_s()] if self.reference_s else []
        _MACHINE_CALIBRATION[:] = self.calibrations[:1]
        self.factor = 1.0

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            tier = tier_of(item.nodeid)
            if tier is not None:
                item.add_marker(getattr(pytest.mark, tier))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        tier = tier_of(report.nodeid)
        if tier is not None:
            self.seconds[tier] += report.duration

    def verdicts(self) -> list[Verdict]:
        return judge(dict(self.seconds), self.budgets_min, self.tolerance, self.factor)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.calibrations and self.seconds:
            self.calibrations.append(calibration_s())
            self.factor = speed_factor(min(self.calibrations), self.reference_s, self.most)
        failed = [v for v in self.verdicts() if v.state == "failed"]
        if times_file := os.environ.get(TIMES_ENV):
            with open(times_file, "a") as out:
                out.writelines(f"{v.tier} {v.seconds:.1f} {v.factor:.3f}\n" for v in self.verdicts())
        if failed and self.enforce and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:  # noqa: ANN001
        verdicts = self.verdicts()
        if not verdicts:
            return
        wall = (time.monotonic() - self.started) / 60
        terminalreporter.write_sep("-", "time per tier (tests/budgets.toml)")
        if self.calibrations:
            terminalreporter.write_line(
                f"machine speed: calibration {min(self.calibrations):.3f} s against {self.reference_s:.3f} s on "
                f"a quiet {cpu_model() or 'machine'}: budgets x{self.factor:.2f} (at most x{self.most:g})")
        for verdict in verdicts:
            markup = {"ok": {}, "over": {"yellow": True}, "failed": {"red": True, "bold": True}}[verdict.state]
            terminalreporter.write_line(f"tier {verdict.line()}", **markup)
        terminalreporter.write_line(f"suite time: {wall:.1f} min in this process")
        if any(v.state == "failed" for v in verdicts):
            if self.enforce:
                terminalreporter.write_line(
                    "a tier took more than its budget allows: make the new cost cheaper, or raise the "
                    "budget as tests/budgets.toml says", red=True, bold=True)
            else:
                terminalreporter.write_line("EFT_TEST_BUDGETS=off: over-budget tiers do not fail this run")


def pytest_configure(config: pytest.Config) -> None:
    budgets_min, _ = load_budgets(budgets_path())
    for tier in budgets_min:
        config.addinivalue_line("markers", f"{tier}: a test of the {tier} tier (tests/{tier}/, tests/budgets.toml)")
    config.pluginmanager.register(TierBudgets(config), "eft-tier-budgets")
