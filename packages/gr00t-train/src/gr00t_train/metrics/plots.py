"""End-of-run PNGs: the loss curve (with validation below it when the run validated), and where the step
time went."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .records import RunSummary, StepRecord


def write_plots(
    records: list[StepRecord],
    summary: RunSummary,
    out_dir: str | Path,
    validation: list[dict[str, Any]] | None = None,
) -> list[Path]:
    """Write loss.png and step_time.png into `out_dir`; returns their paths. With `validation` records
    (metrics.jsonl's val lines), loss.png gets a second panel: validation MSE and the mean baseline."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = [r.step for r in records]

    if validation:
        fig, (ax, val_ax) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True, height_ratios=(3, 2))
    else:
        fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [r.loss for r in records], lw=1, label="loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    _scale(ax, [r.loss for r in records])
    ax.grid(alpha=0.3)
    lr_ax = ax.twinx()
    lr_ax.plot(steps, [r.lr for r in records], color="tab:orange", lw=1, alpha=0.6, label="lr")
    lr_ax.set_ylabel("learning rate")
    ax.set_title(f"loss {summary.first_loss:.4f} -> {summary.final_loss:.4f}")
    handles = ax.get_legend_handles_labels()[0] + lr_ax.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="best", fontsize=8)
    if validation:
        _validation_panel(val_ax, validation)
    fig.tight_layout()
    loss_png = out_dir / "loss.png"
    fig.savefig(loss_png, dpi=110)
    plt.close(fig)

    names = list(summary.breakdown_s)
    values = [1000 * summary.breakdown_s[n] for n in names]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    left = 0.0
    for name, value in zip(names, values):
        ax.barh([0], [value], left=left, label=f"{name} {value:.1f} ms")
        left += value
    ax.set_yticks([])
    ax.set_xlabel("milliseconds per step")
    ax.set_title(
        f"where step time went ({summary.samples_per_s:.1f} samples/s; "
        f"h2d {1000 * summary.h2d_s:.1f} ms on the copy thread)"
    )
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    time_png = out_dir / "step_time.png"
    fig.savefig(time_png, dpi=110)
    plt.close(fig)
    return [loss_png, time_png]


def _validation_panel(ax, validation: list[dict[str, Any]]) -> None:
    """Validation MSE of the model and of predicting the mean action, over steps (normalized scale)."""
    steps = [v["step"] for v in validation]
    ax.plot(steps, [v["mse"] for v in validation], "o-", ms=3, lw=1.2, label="validation MSE (model)")
    ax.plot(steps, [v["baseline"] for v in validation], "s--", ms=3, lw=1, color="tab:gray",
            label="predicting the mean action")  # fmt: skip
    _scale(ax, [x for v in validation for x in (v["mse"], v["baseline"])])
    ax.set_xlabel("step")
    ax.set_ylabel("action MSE (normalized)")
    last = validation[-1]
    ax.set_title(
        f"held-out episodes: MSE / mean baseline = {last['ratio']:.3g} at step {last['step']}", fontsize=10
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)


def _scale(ax, values: list[float]) -> None:
    """A log axis where the values span more than a decade (every tick labelled in plain numbers), else
    linear: a log axis over a narrow range shows one or two labels."""
    import matplotlib.ticker as ticker

    finite = [v for v in values if v == v and abs(v) != float("inf")]
    if not finite or min(finite) <= 0 or max(finite) / min(finite) < 10:
        return
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
