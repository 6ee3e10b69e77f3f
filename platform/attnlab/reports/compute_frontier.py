"""The compute frontier: each contender's best validation loss against its training compute, from a
separate run per budget.

A sweep whose points differ in their budget (a grid over `budget:`, as experiments/lm/data_constrained.yaml)
trains each contender (a base with its other grid values) once per budget and seed. Each run is
scored at its best validation checkpoint (the lowest val/nll it reached, the loss early stopping
keeps) and by the test evaluation of that checkpoint; a contender's frontier is those scores
against the budget (and the epochs its runs trained), mean with a 95 % t interval over seeds. This,
not one run's learning curve, is how Prabhudesai et al. 2025 read the data-constrained crossover: a
curve read against an overfitting AR's last checkpoint measures AR's overfitting, not diffusion.

Crossover, for each non-AR contender against each AR one: the budget from which the non-AR frontier
stays below the AR's up to the largest budget, interpolated between budgets linearly in log
compute; per seed (seed k against seed k) too, and from those a 95 % t interval (in log compute)
when every seed crosses. Each budget's difference is tested over seeds (significance's paired t),
Holm-adjusted over the section's comparisons.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.reports.curves import LOSS, is_ar
from attnlab.reports.significance import MARKS
from attnlab.reports.stats import ALPHA, MIN_SEEDS, holm, paired_t, summarize

BUDGET = "run.budget"
TEST = "test/nll"


@dataclass
class Rung:
    """One budget of one contender: per seed its best val/nll, its test nll, and the epochs it trained."""

    budget: float
    seeds: list
    best: list
    test: list
    epochs: list


@dataclass
class Contender:
    name: str
    family: str
    ar: bool
    rungs: list[Rung] = field(default_factory=list)


def contender_name(point_name: str, kind: str) -> str:
    """A grid point's name without its budget part (`mdlm,flops=4.0e11` -> `mdlm`)."""
    return ",".join(part for part in point_name.split(",") if not part.startswith(f"{kind}=")) or point_name


def _value(row: dict | None, key: str):
    return None if row is None else row.get(key)


@dataclass
class ComputeFrontier:
    kind: str  # what the budgets count: flops, tokens or epochs
    contenders: list[Contender]

    # ---- from runs, to and from JSON ------------------------------------------------------------------
    @classmethod
    def from_points(cls, points) -> ComputeFrontier | None:
        """The frontier of a report's points, or None when no contender ran at more than one budget."""
        budgets = {}
        for point in points:
            raw = point.first.swept.get(BUDGET)
            if isinstance(raw, dict) and len(raw) == 1 and "time" not in raw:
                budgets[point.name] = next(iter(raw.items()))
        kinds = {kind for kind, _ in budgets.values()}
        if len(kinds) != 1:
            return None
        (kind,) = kinds
        contenders: dict[str, Contender] = {}
        for point in points:
            if point.name not in budgets:
                continue
            first = point.first
            contender = contenders.setdefault(contender_name(point.name, kind),
                                              Contender(contender_name(point.name, kind), first.family, is_ar(first)))
            contender.rungs.append(Rung(float(budgets[point.name][1]), point.seeds,
                                        [_value(r.best_validation(), LOSS) for r in point.records],
                                        [r.evaluations.get("test", {}).get(TEST) for r in point.records],
                                        [r.ledger("epochs") for r in point.records]))
        for contender in contenders.values():
            contender.rungs.sort(key=lambda rung: rung.budget)
        if not any(len(c.rungs) > 1 for c in contenders.values()):
            return None
        return cls(kind, list(contenders.values()))

    def as_json(self) -> dict:
        return {"kind": self.kind, "contenders": [
            {"name": c.name, "family": c.family, "ar": c.ar, "rungs": [vars(r) for r in c.rungs]} for c in self.contenders]}

    @classmethod
    def from_json(cls, data: dict) -> ComputeFrontier:
        return cls(data["kind"], [Contender(c["name"], c["family"], c["ar"], [Rung(**r) for r in c["rungs"]])
                                  for c in data["contenders"]])

    # ---- the comparisons ----------------------------------------------------------------------------
    def pairs(self) -> list[tuple[Contender, Contender]]:
        """Every non-AR contender against every AR one."""
        return [(c, ref) for c in self.contenders if not c.ar for ref in self.contenders if ref.ar]

    def comparisons(self) -> list[dict]:
        """Per pair and shared budget: the paired difference of best val/nll over the seeds both ran
        (tested from MIN_SEEDS seeds), p Holm-adjusted over the section's tests."""
        out = []
        for c, ref in self.pairs():
            theirs = {rung.budget: rung for rung in ref.rungs}
            for rung in c.rungs:
                if rung.budget not in theirs:
                    continue
                a, b = _paired(rung, theirs[rung.budget], "best")
                entry = {"contender": c.name, "against": ref.name, "budget": rung.budget, "shared": len(a)}
                if len(a) >= MIN_SEEDS:
                    t = paired_t(a, b)
                    entry.update(difference=t.difference, low=t.low, high=t.high, p_raw=t.p)
                elif a:
                    entry["difference"] = sum(x - y for x, y in zip(a, b)) / len(a)
                out.append(entry)
        tested = [e for e in out if "p_raw" in e]
        for entry, p in zip(tested, holm([e["p_raw"] for e in tested])):
            entry["p"] = p
        return out

    def crossover(self, c: Contender, ref: Contender) -> dict:
        """Where c's best val/nll drops below ref's for good: on the means, per seed, and an interval."""
        theirs = {rung.budget: rung for rung in ref.rungs}
        shared = [rung for rung in c.rungs if rung.budget in theirs]
        budgets = [rung.budget for rung in shared]
        mean = [_mean_difference(rung, theirs[rung.budget]) for rung in shared]
        seeds = sorted({s for rung in shared for s in rung.seeds}, key=str)
        per_seed = {}
        for seed in seeds:
            pairs = [(rung.budget, _seed_difference(rung, theirs[rung.budget], seed)) for rung in shared]
            pairs = [(b, d) for b, d in pairs if d is not None]
            if len(pairs) == len(shared):
                per_seed[seed] = crossing([b for b, _ in pairs], [d for _, d in pairs])
        entry = {"at": crossing(budgets, mean), "seeds": per_seed, "range": [budgets[0], budgets[-1]] if budgets else None}
        # An interval where at least MIN_SEEDS seeds all cross inside the range: a seed below at every
        # budget crosses somewhere below the smallest (censored), one never below somewhere above it.
        inside = [x for x in per_seed.values() if x is not None and x > budgets[0]]
        if len(inside) >= MIN_SEEDS and len(inside) == len(per_seed):
            s = summarize([math.log10(x) for x in inside])
            entry["interval"] = [10 ** s.low, 10 ** s.high]
        return entry

    # ---- the section ----------------------------------------------------------------------------------
    def lines(self) -> list[str]:
        comparisons = self.comparisons()
        tested = sum("p" in e for e in comparisons)
        unit = {"flops": "FLOPs", "tokens": "tokens", "epochs": "epochs"}[self.kind]
        out = ["## Compute frontier", "",
               f"Each contender trained a separate run per budget ({self.kind}) and seed; each run is scored by the {LOSS} "
               "of its best validation checkpoint (chosen by run.monitor, val/nll unless a sweep says otherwise: the loss "
               f"early stopping keeps) and by the {TEST} of its evaluation named test (the best checkpoint unless the "
               "sweep says otherwise). Mean ± std over seeds and the 95 % t interval; epochs: what the runs of that "
               "budget trained "
               f"(mean). {LOSS} is the NLL for autoregressive contenders and the NELBO bound (an upper bound on the "
               "NLL) for diffusion ones. compute_frontier.png draws them against the budget and the epochs.", ""]
        header = ["contender", "family", f"budget ({unit})", "n", "epochs", f"best {LOSS}", "95 % interval", f"{TEST} (best)"]
        out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for c in self.contenders:
            for rung in c.rungs:
                best, test, epochs = summarize(rung.best), summarize(rung.test), summarize(rung.epochs)
                out.append(f"| {c.name} | {c.family} | {rung.budget:.3g} | {len(rung.seeds)} | "
                           f"{'—' if epochs is None else f'{epochs.mean:.1f}'} | {_shown(best)} | {_span(best)} | "
                           f"{_shown(test)} |")
        if not self.pairs():
            return out + [""]
        out += ["", f"Differences of best {LOSS} (non-AR minus AR, seed k against seed k; negative: the non-AR bound "
                    f"is lower) at each budget, with the 95 % t interval over the shared seeds. `{MARKS['seeds']}`: "
                    f"significant, a paired t-test over at least {MIN_SEEDS} seeds, p < {ALPHA} after Holm's correction "
                    f"over this section's {tested} tests; fewer shared seeds are not tested.", ""]
        out += [f"| contender | against | budget ({unit}) | n | difference | p |", "|---|---|---|---|---|---|"]
        for e in comparisons:
            difference = "—" if "difference" not in e else f"{e['difference']:+.4f}"
            if "low" in e:
                difference += f" [{e['low']:+.4f}, {e['high']:+.4f}]"
            mark = f" {MARKS['seeds']}" if e.get("p", 1.0) < ALPHA else ""
            p = f"{e['p']:.3g}" if "p" in e else f"not tested ({e['shared']} shared seeds)"
            out.append(f"| {e['contender']} | {e['against']} | {e['budget']:.3g} | {e['shared']} | {difference}{mark} | {p} |")
        out += ["", "Crossover: the budget from which a non-AR contender's mean best "
                    f"{LOSS} stays below the AR's up to the largest budget (interpolated in log {unit}); in brackets "
                    "each seed's (≤: below already at the smallest budget), and a 95 % t interval (in log compute) where "
                    f"{MIN_SEEDS} or more seeds all cross inside the range.", ""]
        for c, ref in self.pairs():
            out.append(self._crossover_words(c, ref, unit))
        return out + [""]

    def _crossover_words(self, c: Contender, ref: Contender, unit: str) -> str:
        entry = self.crossover(c, ref)
        if entry["range"] is None:
            return f"- {c.name} against {ref.name}: no budget in common."
        low, high = entry["range"]
        if entry["at"] is None:
            where = f"none in the range ({low:.3g}–{high:.3g} {unit}): not below at the largest budget"
        elif entry["at"] <= low:
            where = f"below at every budget, from the smallest ({low:.3g} {unit}) on"
        else:
            where = f"below from {entry['at']:.3g} {unit} on"
        seeds = "; ".join(f"seed {s}: " + ("none" if x is None else f"≤ {x:.3g}" if x <= low else f"{x:.3g}")
                          for s, x in entry["seeds"].items())
        interval = (f", 95 % interval [{entry['interval'][0]:.3g}, {entry['interval'][1]:.3g}]" if "interval" in entry
                    else f", no interval: it needs {MIN_SEEDS} or more seeds that all cross inside the range"
                    if entry["seeds"] else "")
        return f"- {c.name} against {ref.name}: {where}" + (f" ({seeds}{interval})" if seeds else "") + "."

    def plot(self, output: Path) -> Path:
        from attnlab.reports.plots import half_width, pyplot, save_figure

        plt = pyplot()
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
        views = ((0, "budget", "best", f"best {LOSS}"), (1, "epochs", "best", f"best {LOSS}"),
                 (2, "budget", "test", f"{TEST} at the best checkpoint"))
        for c in self.contenders:
            colour = None
            for index, x_key, y_key, label in views:
                ax = axes[index]
                x = [rung.budget if x_key == "budget" else summarize(rung.epochs).mean for rung in c.rungs]
                ys = [summarize(getattr(rung, y_key)) for rung in c.rungs]
                keep = [(xi, y) for xi, y in zip(x, ys) if y is not None]
                if not keep:
                    continue
                bars = ax.errorbar([k[0] for k in keep], [k[1].mean for k in keep], yerr=[half_width(k[1]) for k in keep],
                                   marker="o", capsize=3, linestyle="-" if c.ar else "--", label=c.name, color=colour)
                colour = bars[0].get_color()
                ax.set_xscale("log")
                ax.set_ylabel(label)
                ax.set_xlabel(f"training {self.kind} (budget)" if x_key == "budget" else "training epochs")
        axes[0].legend(fontsize=8)
        fig.suptitle(f"Compute frontier: a run per budget, each at its best validation checkpoint (mean, 95 % t "
                     "interval over seeds; AR solid, diffusion dashed)", fontsize=10)
        return save_figure(fig, output / "compute_frontier.png", plt)

    def write(self, output: Path) -> tuple[list[str], list[Path]]:
        return self.lines(), [self.plot(output)]


def _paired(rung: Rung, other: Rung, key: str) -> tuple[list[float], list[float]]:
    mine, theirs = dict(zip(rung.seeds, getattr(rung, key))), dict(zip(other.seeds, getattr(other, key)))
    shared = [s for s in rung.seeds if mine.get(s) is not None and theirs.get(s) is not None]
    return [mine[s] for s in shared], [theirs[s] for s in shared]


def _mean_difference(rung: Rung, other: Rung) -> float | None:
    a, b = _paired(rung, other, "best")
    return sum(x - y for x, y in zip(a, b)) / len(a) if a else None


def _seed_difference(rung: Rung, other: Rung, seed) -> float | None:
    mine, theirs = dict(zip(rung.seeds, rung.best)), dict(zip(other.seeds, other.best))
    if mine.get(seed) is None or theirs.get(seed) is None:
        return None
    return mine[seed] - theirs[seed]


def crossing(budgets: list[float], differences: list[float | None]) -> float | None:
    """The budget from which `differences` (non-AR minus AR, by increasing budget) stay below 0 up to
    the last one, interpolated linearly in log budget between the last budget at or above 0 and the
    next; the first budget when below at all of them; None when not below at the last."""
    known = [(b, d) for b, d in zip(budgets, differences) if d is not None]
    if not known or known[-1][1] >= 0:
        return None
    start = len(known) - 1
    while start > 0 and known[start - 1][1] < 0:
        start -= 1
    if start == 0:
        return known[0][0]
    (b0, d0), (b1, d1) = known[start - 1], known[start]
    share = d0 / (d0 - d1)
    return 10 ** (math.log10(b0) + share * (math.log10(b1) - math.log10(b0)))


def _shown(summary) -> str:
    if summary is None:
        return "—"
    return f"{summary.mean:.4f}" + (f" ± {summary.std:.4f}" if summary.n > 1 else "")


def _span(summary) -> str:
    return "" if summary is None or summary.low is None else f"[{summary.low:.4f}, {summary.high:.4f}]"
