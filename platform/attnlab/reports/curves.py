"""Learning curves of a report: validation loss against training epochs and FLOPs, and where a
non-autoregressive point's curve first drops below an autoregressive one's.

In a data-constrained comparison the same unique text repeats for many epochs: an AR model
overfits as the epochs pile up, masked diffusion (Prabhudesai et al. 2025; Ni et al. 2025) keeps
improving, unless the AR model is regularised (Gao et al. 2025). `val/nll` is what both log: the NLL per token for DecoderOnly, the
NELBO bound per token for BlockDiffusion (an upper bound on its NLL).

Each validation row of a fit's metrics.csv is placed at the training epochs and FLOPs the budget
ledger had spent at its step (`budget/epochs`, `budget/flops`, logged on the training rows, which
share `step` with the validation rows; between logged steps, interpolated). Its value is the best
so far (the lowest val/nll up to that validation: what the run's best checkpoint holds then), so a
curve never rewards a contender for the other's overfitting. A point's curve is the mean over its
seeds at each evaluation, with a band from the lowest to the highest seed. When the points differ in
a facet key (`--facet`, by default data.init_args.train_tokens, else run.budget, where the sweep sets
it), each value gets its own panel and its own crossover lines. A crossover in compute is read off
the compute frontier (compute_frontier), separate runs per budget, not off these curves.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.reports.stats import summarize

LOSS = "val/nll"
FACETS = ("data.init_args.train_tokens", "run.budget")  # faceted by default by the first the points differ in


@dataclass
class Curve:
    """A point's validation curve: per evaluation step, the mean over seeds of epochs, FLOPs and
    the best loss so far, and the lowest and highest seed's; `per_seed`: seed -> [(FLOPs, epochs, loss)]."""

    name: str
    family: str
    ar: bool
    facet: object
    epochs: list[float] = field(default_factory=list)
    flops: list[float] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    low: list[float] = field(default_factory=list)
    high: list[float] = field(default_factory=list)
    per_seed: dict = field(default_factory=dict)
    bests: dict = field(default_factory=dict)  # seed -> the lowest validation loss
    bound: bool = False  # val/nll is a bound (drawn dashed), not the NLL


def is_ar(record) -> bool:
    """Autoregressive: each token predicted from the ones before it, as the run's family says
    (`RunRecord.trait`); a run whose family cannot be found counts as non-AR."""
    return record.trait("autoregressive")


def nll_is_bound(record) -> bool:
    """Whether the run's val/nll is an upper bound on its NLL (a NELBO): its family says."""
    return record.trait("nll_is_bound")


def _interpolate(step: float, known: list[tuple[float, float]]) -> float:
    """Linear interpolation in (step, value) pairs sorted by step; clamped at both ends."""
    if step <= known[0][0]:
        return known[0][1]
    for (s0, v0), (s1, v1) in zip(known, known[1:]):
        if step <= s1:
            return v0 + (v1 - v0) * (step - s0) / (s1 - s0)
    return known[-1][1]


def ledger_at(record, key: str) -> list[tuple[float, float]] | None:
    """(step, value) of a ledger total (budget/epochs or budget/flops): its logged values, what was
    spent before the first step at -1 (0, or what a run.init_from network had cost), and the
    summary's total at the last step; None without it. Steps are the run's own (as logged); the
    summary's count includes the inherited ones."""
    logged = dict(record.series(f"budget/{key}"))
    if not logged:
        return None
    inherited = (record.summary.get("ledger") or {}).get("inherited") or {}
    steps, total = record.summary.get("steps"), record.ledger(key)
    if steps and total is not None:
        logged.setdefault(int(steps) - inherited.get("steps", 0) - 1, float(total))
    logged.setdefault(-1, _inherited(record, inherited, key))
    return sorted(logged.items())


def _inherited(record, inherited: dict, key: str) -> float:
    """What the network a run started from had spent: its FLOPs, or its tokens over the run's
    unique tokens for epochs (the ledger's definition of an epoch); 0 for a fresh start."""
    if key != "epochs":
        return float(inherited.get(key, 0.0))
    unique = record.ledger("unique_tokens")
    return inherited.get("tokens", 0) / unique if unique else 0.0


def evaluations(record) -> list[tuple[int, float, float, float]]:
    """(step, epochs, FLOPs, best loss so far) of each validation of a fit with the ledger; [] without it."""
    epochs, flops = ledger_at(record, "epochs"), ledger_at(record, "flops")
    if epochs is None or flops is None:
        return []
    by_step = dict(record.series(LOSS))  # a resumed run may log a step twice: the last one counts
    out, best = [], math.inf
    for step, value in sorted(by_step.items()):
        best = min(best, value)
        out.append((step, _interpolate(step, epochs), _interpolate(step, flops), best))
    return out


def facet_key(points, requested: str | None = None) -> str | None:
    """The swept key to facet by: `requested`, else the first of FACETS the points take more than
    one value of; None: one panel."""
    def values(key: str) -> set:
        return {repr(r.swept.get(key)) for p in points for r in p.records if key in r.swept}

    if requested:
        if not values(requested):
            from attnlab.errors import AttnlabError

            swept = sorted({k for p in points for r in p.records for k in r.swept})
            raise AttnlabError(f"--facet {requested}: no run sweeps that key; swept keys: {', '.join(swept) or 'none'}")
        return requested
    return next((key for key in FACETS if len(values(key)) > 1), None)


def build_curves(points, facet: str | None) -> list[Curve]:
    """One Curve per point whose fits logged the ledger and validated; in report order."""
    curves = []
    for point in points:
        first = point.first
        curve = Curve(point.name, first.family, is_ar(first), _facet_value(first.swept.get(facet)) if facet else None,
                      bound=nll_is_bound(first))
        by_step: dict[int, list[tuple[float, float, float]]] = {}
        for record in point.records:
            seen = evaluations(record)
            if not seen:
                continue
            seed = record.seed
            curve.per_seed[seed] = [(f, e, v) for _, e, f, v in seen]
            curve.bests[seed] = seen[-1][3]
            for step, epochs, flops, value in seen:
                by_step.setdefault(step, []).append((epochs, flops, value))
        if not by_step:
            continue
        for step in sorted(by_step):
            rows = by_step[step]
            curve.epochs.append(statistics.fmean(e for e, _, _ in rows))
            curve.flops.append(statistics.fmean(f for _, f, _ in rows))
            values = [v for *_, v in rows]
            curve.mean.append(statistics.fmean(values))
            curve.low.append(min(values))
            curve.high.append(max(values))
        curves.append(curve)
    return curves


def crossover(x: list[float], y: list[float], ref_x: list[float], ref_y: list[float]) -> float | None:
    """The first evaluated x from which y stays below the reference curve (linearly interpolated
    between its evaluations) at every later evaluation, or None when it is not below at its last
    evaluation. Evaluations outside the reference's evaluated range are skipped, never
    extrapolated; an early dip that does not last (a bound that starts low at initialisation) is
    not a crossover."""
    known = sorted(zip(ref_x, ref_y))
    if not known:
        return None
    common = [(xi, yi) for xi, yi in sorted(zip(x, y)) if known[0][0] <= xi <= known[-1][0]]
    at = None
    for xi, yi in common:
        if yi < _interpolate(xi, known):
            at = xi if at is None else at
        else:
            at = None
    return at


def _interval(values: list[float]) -> str:
    s = summarize(values)
    if s is None:
        return "—"
    if s.low is None:
        return f"{s.mean:.4f} (one seed)"
    return f"{s.mean:.4f} [{s.low:.4f}, {s.high:.4f}]"


def _facets(curves: list[Curve]) -> list:
    return list(dict.fromkeys(c.facet for c in curves))


def _epoch_at(curve: Curve, flops: float) -> float:
    return _interpolate(flops, sorted(zip(curve.flops, curve.epochs)))


def crossover_text(curves: list[Curve], facet: str | None) -> list[str]:
    """The report's words: per facet, each point's best val/nll with a 95 % t interval over seeds, and
    for each non-AR point against each AR point where its best-so-far val/nll goes below the AR's for
    good within one run (on the FLOPs axis; per seed too), and the paired difference of the bests."""
    if not any(c.ar for c in curves) or all(c.ar for c in curves):
        return []
    lines = ["## Learning curves", "",
             f"The best {LOSS} so far at each validation (what the run's best checkpoint holds then) against the "
             "training epochs (budget/epochs) and FLOPs spent by then (learning_curves.png: mean over seeds, band "
             f"from the lowest to the highest seed). {LOSS} is the NLL per token for the autoregressive families "
             "(DecoderOnly, EncoderDecoder) and the NELBO bound per token (an upper bound on the NLL) for "
             "BlockDiffusion. Within one run: where a non-AR point's mean best-so-far stays below the AR point's "
             "(interpolated between the AR point's validations) up to the end of training; never: not below at the "
             "last validation both reached. In brackets, each seed against the same seed; then the paired difference "
             "of the best validation (non-AR minus AR; negative: the bound is lower), 95 % t interval over seeds. "
             "A crossover in compute is read off separate runs per budget (the compute frontier), not off one run.", ""]
    for value in _facets(curves):
        group = [c for c in curves if c.facet == value]
        if facet is not None:
            lines += [f"### {_facet_title(facet, value)}", ""]
        lines += [f"| point | family | n | epochs | best {LOSS} |", "|---|---|---|---|---|"]
        for c in group:
            lines.append(f"| {c.name} | {c.family} | {len(c.bests)} | {c.epochs[-1]:.1f} | "
                         f"{_interval(list(c.bests.values()))} |")
        lines.append("")
        for c in (c for c in group if not c.ar):
            for ref in (r for r in group if r.ar):
                lines.append(_comparison(c, ref))
        lines.append("")
    return lines


def _facet_value(value):
    """A facet's value, hashable: a budget by its words (`flops 4.0e11`)."""
    if isinstance(value, dict):
        from attnlab.training.budget import parse_budget

        return parse_budget(value).describe()
    return value


def _facet_title(facet: str, value) -> str:
    if facet == "run.budget":
        return str(value)
    return f"{facet.rsplit('.', 1)[-1]} = {f'{value:,}' if isinstance(value, int) else value}"


def _comparison(c: Curve, ref: Curve) -> str:
    at = crossover(c.flops, c.mean, ref.flops, ref.mean)
    where = (f"below from {at:.3g} FLOPs on (epoch {_epoch_at(c, at):.1f})" if at is not None
             else "never below for good within the run")
    seeds = [s for s in c.per_seed if s in ref.per_seed]
    each = []
    for s in seeds:
        (x, _, y), (rx, _, ry) = zip(*c.per_seed[s]), zip(*ref.per_seed[s])
        f = crossover(list(x), list(y), list(rx), list(ry))
        each.append(f"seed {s}: " + ("never" if f is None else f"{f:.3g}"))
    words = f"- {c.name} against {ref.name}: {where}" + (f" ({'; '.join(each)})" if each else "")
    diff = [c.bests[s] - ref.bests[s] for s in seeds]
    if diff:
        words += f"; best difference {_interval(diff).replace(' (one seed)', '')}"
    return words + "."


def _label(name: str, facet: str | None) -> str:
    """The point's name without its facet part (the panel's title says it; a budget's part is named
    by its kind, `flops=4.0e11`)."""
    if facet is None:
        return name
    prefixes = tuple(f"{kind}=" for kind in ("flops", "tokens", "epochs", "time")) if facet == "run.budget" else \
        (f"{facet.rsplit('.', 1)[-1]}=",)
    return ",".join(part for part in name.split(",") if not part.startswith(prefixes)) or name


def write_curves(curves: list[Curve], output: Path, facet: str | None) -> list[Path]:
    """learning_curves.png: val/nll against epochs (top row) and FLOPs (bottom), a panel per facet."""
    from attnlab.reports.plots import pyplot, save_figure

    if not curves:
        return []
    plt = pyplot()
    facets = _facets(curves)
    fig, axes = plt.subplots(2, len(facets), figsize=(4.5 * len(facets) + 1, 7), squeeze=False)
    colors: dict[int, str] = {}
    for column, value in enumerate(facets):
        group = [c for c in curves if c.facet == value]
        for place, c in enumerate(group):  # the same place in each facet, the same colour
            for row, x in enumerate((c.epochs, c.flops)):
                ax = axes[row][column]
                line, = ax.plot(x, c.mean, marker=".", label=_label(c.name, facet), linestyle="--" if c.bound else "-",
                                color=colors.get(place))
                colors.setdefault(place, line.get_color())
                if len(c.bests) > 1:
                    ax.fill_between(x, c.low, c.high, alpha=0.2, color=line.get_color())
        axes[0][column].set_title(_facet_title(facet, value) if facet else "", fontsize=9)
        axes[0][column].set_xlabel("training epochs")
        axes[1][column].set_xlabel("training FLOPs")
        axes[0][column].legend(fontsize=7)
    for row in axes:
        row[0].set_ylabel(f"{LOSS} (mean; band: min–max over seeds)")
    fig.suptitle(f"{LOSS} (NLL solid; NELBO bound, dashed) against epochs and FLOPs", fontsize=10)
    return [save_figure(fig, output / "learning_curves.png", plt)]
