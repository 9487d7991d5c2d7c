"""Run test tiers in order of cost, each in its own pytest process, stopping at the first that
fails; print every tier's time against its budget at the end (tests/budgets.toml).

    .venv/bin/python tests/tiers.py                       # every tier: what `make test` runs
    .venv/bin/python tests/tiers.py unit integration      # `make check`, the inner loop
    .venv/bin/python tests/tiers.py e2e -- -x -k journey  # arguments after -- go to pytest

A tier fails when one of its tests fails or when it takes more than its budget allows; the tiers
after it do not start, so a broken unit test is reported in a minute, not after the e2e tier.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.budgets import TIMES_ENV, budgets_path, judge, load_budgets  # noqa: E402


def main(argv: list[str], root: Path = REPO) -> int:
    """Runs the tiers named in `argv` (all when none) under `root`; returns the first failing
    tier's exit status, or 0."""
    tiers, pytest_args = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    budgets_min, tolerance = load_budgets(budgets_path())
    unknown = [t for t in tiers if t not in budgets_min]
    if unknown:
        print(f"unknown tier(s) {unknown}: the tiers are {list(budgets_min)} (tests/budgets.toml)", file=sys.stderr)
        return 2
    tiers = tiers or list(budgets_min)
    ran: list[tuple[str, int, float]] = []
    with tempfile.NamedTemporaryFile("r", suffix=".times") as times:
        env = {**os.environ, TIMES_ENV: times.name}
        for tier in tiers:
            print(f"\n=== tier {tier} (budget {budgets_min[tier]:g} min): tests/{tier}", flush=True)
            started = time.monotonic()
            code = subprocess.call([sys.executable, "-m", "pytest", f"tests/{tier}", *pytest_args], cwd=root, env=env)
            ran.append((tier, code, time.monotonic() - started))
            if code != 0:
                break
        verdicts = {}
        for line in times.read().splitlines():
            tier, value, factor = line.split()
            verdicts[tier] = judge({tier: float(value)}, budgets_min, tolerance, float(factor))[0]
    print("\n=== time per tier (tests/budgets.toml; test time, and the process's wall time)")
    for tier, code, wall_s in ran:
        verdict = verdicts[tier].line() if tier in verdicts else "no test ran"
        print(f"  {tier:<12} {'passed' if code == 0 else f'FAILED (exit {code})':<16} {verdict}; "
              f"wall {wall_s / 60:.1f} min")
    print(f"  {'all':<12} {'':<16} wall {sum(w for _, _, w in ran) / 60:.1f} min")
    not_run = tiers[len(ran):]
    if not_run:
        print(f"  not started after the failure: {', '.join(not_run)}")
    return next((code for _, code, _ in ran if code != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
