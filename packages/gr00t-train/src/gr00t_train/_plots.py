"""End-of-run PNGs: the loss curve, and where the step time went."""

from __future__ import annotations

from pathlib import Path

from ._metrics import RunSummary, StepRecord


def write_plots(records: list[StepRecord], summary: RunSummary, out_dir: str | Path) -> list[Path]:
    """Write loss.png and step_time.png into `out_dir`; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = [r.step for r in records]

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [r.loss for r in records], lw=1, label="loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    if all(r.loss > 0 for r in records):
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    lr_ax = ax.twinx()
    lr_ax.plot(steps, [r.lr for r in records], color="tab:orange", lw=1, alpha=0.6, label="lr")
    lr_ax.set_ylabel("learning rate")
    ax.set_title(f"loss {summary.first_loss:.4f} -> {summary.final_loss:.4f}")
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
