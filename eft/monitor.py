"""Terminal views of a running job: the progress line of `eft jobs wait` / `watch` and the
loss-curve PNG of `eft jobs plot`. matplotlib is imported inside `plot_losses` only, so
`import eft` stays light."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from eft.types.jobs import Job, JobMetric


def eta_text(job: Job, now: datetime | None = None) -> str:
    """`ETA 1m05s` from the job's estimated finish, or "" when it has none."""
    if job.estimated_finish is None:
        return ""
    now = now or datetime.now(timezone.utc)
    seconds = max(0, int((job.estimated_finish - now).total_seconds()))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return "ETA " + (f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s")


def progress_text(job: Job, metric: JobMetric | None) -> str:
    """Step, loss, eval loss, tokens/s and ETA, for a progress bar's info column."""
    values = metric.values if metric is not None else {}
    parts = [f"step {job.step}/{job.total_steps}" if job.total_steps else f"step {job.step}"]
    parts += [f"{key} {values[key]:.4f}" for key in ("loss", "eval_loss") if key in values]
    if "tokens_per_s" in values:
        parts.append(f"{values['tokens_per_s']:,.0f} tok/s")
    if eta := eta_text(job):
        parts.append(eta)
    return "  ".join(parts)


def plot_losses(job: Job, metrics: list[JobMetric], path: Path) -> Path:
    """Write a PNG of the training loss (and eval loss, where reported) by step. Returns the
    path. Raises ValueError when the job has reported no loss yet."""
    train = [(m.step, m.values["loss"]) for m in metrics if "loss" in m.values]
    evals = [(m.step, m.values["eval_loss"]) for m in metrics if "eval_loss" in m.values]
    if not train and not evals:
        raise ValueError(f"job {job.id} has reported no loss yet; plot it once it has trained a step")
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    if train:
        ax.plot(*zip(*train), label="loss", color="#1f77b4")
    if evals:
        ax.plot(*zip(*evals), "o-", label="eval loss", color="#d62728")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"{job.name or job.id} ({job.status.value})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path

