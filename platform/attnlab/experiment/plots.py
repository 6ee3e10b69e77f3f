"""The report's PNG plots: quality against parameters, throughput and generation speed, curves."""
from __future__ import annotations

from pathlib import Path

from attnlab.experiment.runs import RunRecord


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    return plt


def quality_metric(records: list[RunRecord], name: str) -> str | None:
    """`test/<name>` where every run has it, else `val/<name>`, else val/nll."""
    for key in (f"test/{name}", f"val/{name}", "val/nll"):
        if all(r.metric(key) is not None for r in records):
            return key
    return None


def write_plots(records: list[RunRecord], output: Path, metric: str) -> list[Path]:
    plt = pyplot()
    written = []
    key = quality_metric(records, metric)
    with_params = [r for r in records if r.summary.get("params")]
    if key and with_params:
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in with_params:
            ax.scatter(r.summary["params"], r.metric(key))
            ax.annotate(r.name, (r.summary["params"], r.metric(key)), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("parameters")
        ax.set_ylabel(key)
        ax.set_title(f"{key} against parameters")
        written.append(_save(fig, output / "quality_vs_params.png", plt))

    from attnlab.experiment.report import generation_speed

    speeds = [("training tokens/s", [r.train_tokens_per_s() for r in records]),
              ("generation tokens/s", [generation_speed(r) for r in records])]
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.4 * len(records) + 1.5))
    for ax, (label, values) in zip(axes, speeds):
        ax.barh([r.name for r in records], [v or 0.0 for v in values])
        ax.set_xlabel(label)
        ax.invert_yaxis()
    axes[1].set_yticklabels([])
    written.append(_save(fig, output / "throughput.png", plt))

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key in zip(axes, ("train/loss", "val/nll")):
        for r in records:
            points = r.series(key)
            if points:
                ax.plot([s for s, _ in points], [v for _, v in points], label=r.name, marker="." if key.startswith("val") else None)
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    written.append(_save(fig, output / "curves.png", plt))
    return written


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
