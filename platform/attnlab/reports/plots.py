"""The report's PNG plots: quality against parameters, throughput and generation speed, curves.

A row run with several seeds is drawn at its mean with its 95 % interval (error bars; a band
around the mean curve), so overlapping intervals show at a glance.
"""
from __future__ import annotations

from pathlib import Path

from attnlab.reports.stats import Summary, summarize


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    return plt


def quality_metric(records, name: str) -> str | None:
    """`test/<name>` where every run has it, else `val/<name>`, else val/nll."""
    for key in (f"test/{name}", f"val/{name}", "val/nll"):
        if all(r.metric(key) is not None for r in records):
            return key
    return None


def half_width(summary: Summary | None) -> float:
    return 0.0 if summary is None or summary.low is None else (summary.high - summary.low) / 2


def write_plots(points, output: Path, metric: str) -> list[Path]:

    plt = pyplot()
    written = []
    records = [r for p in points for r in p.records]
    key = quality_metric(records, metric)
    with_params = [p for p in points if p.first.summary.get("params")]
    if key and with_params:
        fig, ax = plt.subplots(figsize=(6, 4))
        for p in with_params:
            quality = summarize([r.metric(key) for r in p.records])
            x = p.first.summary["params"]
            ax.errorbar(x, quality.mean, yerr=half_width(quality), fmt="o", capsize=3)
            ax.annotate(p.name, (x, quality.mean), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("parameters")
        ax.set_ylabel(key + (" (mean, 95% interval over seeds)" if any(len(p.records) > 1 for p in points) else ""))
        ax.set_title(f"{key} against parameters")
        written.append(save_figure(fig, output / "quality_vs_params.png", plt))

    speeds = [("training tokens/s", lambda r: r.train_tokens_per_s()), ("generation tokens/s", lambda r: r.gen_tokens_per_s())]
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.4 * len(points) + 1.5))
    for ax, (label, value) in zip(axes, speeds):
        summaries = [summarize([value(r) for r in p.records]) for p in points]
        ax.barh([p.name for p in points], [s.mean if s else 0.0 for s in summaries],
                xerr=[half_width(s) for s in summaries], capsize=3)
        ax.set_xlabel(label)
        ax.invert_yaxis()
    axes[1].set_yticklabels([])
    written.append(save_figure(fig, output / "throughput.png", plt))

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key in zip(axes, ("train/loss", "val/nll")):
        for p in points:
            by_step: dict[int, list[float]] = {}
            for r in p.records:
                for step, v in r.series(key):
                    by_step.setdefault(step, []).append(v)
            if not by_step:
                continue
            steps = sorted(by_step)
            summaries = [summarize(by_step[s]) for s in steps]
            means = [s.mean for s in summaries]
            if key.startswith("val"):  # a few evaluations: points with error bars
                ax.errorbar(steps, means, yerr=[half_width(s) for s in summaries], label=p.name, marker=".", capsize=3)
                continue
            line, = ax.plot(steps, means, label=p.name)
            if any(s.low is not None for s in summaries):  # the 95 % band over seeds
                ax.fill_between(steps, [s.low if s.low is not None else s.mean for s in summaries],
                                [s.high if s.high is not None else s.mean for s in summaries], alpha=0.2, color=line.get_color())
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.set_yscale("log")
    if axes[0].get_legend_handles_labels()[0]:  # no curve drawn (no run logged these keys): no legend
        axes[0].legend(fontsize=7)
    written.append(save_figure(fig, output / "curves.png", plt))
    return written


def save_figure(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
