"""Intervals and paired significance in `attnlab report`, against independent references: the
`sacrebleu` command's own paired bootstrap, an exhaustive sign-flip enumeration, Student's t by hand.
(The paired t-test over seeds and Holm's correction: test_seed_significance.py.)"""
from __future__ import annotations

import csv
import itertools
import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.reports.stats import paired_permutation_p, summarize

REFERENCES = [f"Der {a} Hund sieht {b} Katze im {c} Garten." for a, b, c in
              itertools.product(("kleine", "alte", "müde", "große"), ("die", "keine", "eine"), ("grünen", "alten", "neuen", "kalten"))]


def _corrupt(sentences: list[str], share: float, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [s.replace("Hund", "Hunde").replace("Katze", "Katzen") if rng.random() < share else s for s in sentences]


def _write_run(root: Path, point: str, seed: int, index: int, hypotheses: list[str], nll: list[float],
               reference: str | None = None) -> None:
    """A finished sweep run as `attnlab sweep` leaves it: fit metrics, a test folder with its examples."""
    import sacrebleu

    folder = root / point / f"seed{seed}"
    (folder / "fit").mkdir(parents=True)
    with (folder / "fit" / "metrics.csv").open("w", newline="") as f:
        csv.writer(f).writerows([["epoch", "step", "train/loss", "val/nll"], [0, 1, 1.0, ""], [0, 1, "", 0.5]])
    examples = [{"index": i, "source": "s", "reference": r, "hypothesis": h, "nll": n, "tokens": 10,
                 "bytes": len(r.encode()), "bits": n / math.log(2), "exact": h == r}
                for i, (r, h, n) in enumerate(zip(REFERENCES, hypotheses, nll))]
    (folder / "test").mkdir()
    (folder / "test" / "examples.jsonl").write_text("".join(json.dumps(e) + "\n" for e in examples))
    test = {"test/bleu": sacrebleu.corpus_bleu(hypotheses, [REFERENCES]).score,
            "test/chrf": sacrebleu.corpus_chrf(hypotheses, [REFERENCES]).score,
            "test/exact_match": 100 * sum(e["exact"] for e in examples) / len(examples),
            "test/nll": sum(nll) / (10 * len(nll)),
            "test/bpb": sum(e["bits"] for e in examples) / sum(e["bytes"] for e in examples)}
    with (folder / "test" / "metrics.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(test))
        writer.writeheader()
        writer.writerow(test)
    done = {"point": point, "index": index, "seed": seed, "swept": {}}
    (folder / "done.json").write_text(json.dumps({**done, "reference": reference} if reference else done))


def _report(root: Path) -> list[dict]:
    from attnlab.reports.report import report_main

    assert report_main([str(root), "--wandb", "disabled"]) == 0
    return json.loads((root / "report" / "report.json").read_text())["rows"]


def _cli_p_values(tmp_path: Path, references, baseline, system) -> dict[str, float]:
    """p of `system` against `baseline` printed by the sacrebleu command (--paired-bs, its defaults)."""
    files = {}
    for name, lines in (("ref", references), ("baseline", baseline), ("system", system)):
        files[name] = tmp_path / f"{name}.txt"
        files[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "sacrebleu", str(files["ref"]), "-i", str(files["baseline"]),
                          str(files["system"]), "-m", "bleu", "chrf", "--paired-bs", "-f", "text"],
                         capture_output=True, text=True, check=True).stdout
    bleu, chrf = (float(p) for p in re.findall(r"\(p = ([\d.]+)\)", out))
    return {"bleu": bleu, "chrf": chrf}


def _t_p(a: list[float], b: list[float]) -> float:
    """Student's paired t by hand: the reference the seed-level p is checked against."""
    from scipy import stats

    d = [x - y for x, y in zip(a, b)]
    n, mean = len(d), sum(d) / len(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    return 2 * stats.t.sf(abs(mean / (sd / math.sqrt(n))), n - 1)


def test_bleu_and_chrf_p_values_of_one_seed_equal_the_sacrebleu_command(tmp_path):
    """Two rows of one seed are two single systems: the mark is `†`, the example-level test sacreBLEU's
    paired bootstrap on that seed's outputs, its p (before Holm's correction) as the sacrebleu command
    prints it; never `*`."""
    root = tmp_path / "runs" / "one"
    good, worse = _corrupt(REFERENCES, 0.3, seed=10), _corrupt(REFERENCES, 0.45, seed=20)
    _write_run(root, "good", 0, 0, good, [5.0] * len(REFERENCES))
    _write_run(root, "worse", 0, 1, worse, [5.0] * len(REFERENCES))
    rows = {row["run"]: row for row in _report(root)}
    expected = _cli_p_values(tmp_path, REFERENCES, good, worse)
    for metric in ("bleu", "chrf"):
        entry = rows["worse"][f"test {metric} (best)"]
        assert rows["worse"]["reference"] == rows["good"]["reference"] == "good"
        assert entry["test"] == "examples" and entry["shared"] == 1
        assert entry["p_raw"] == pytest.approx(expected[metric], abs=5e-5)
    assert 0.001 < expected["bleu"] < 0.9  # a p-value that could have come out otherwise
    text = (root / "report" / "report.md").read_text()
    assert "`†`: one shared seed, so two single systems" in text and "`*`: significant" not in text
    assert " * |" not in text.split("95 % intervals")[0]


def test_two_shared_seeds_are_not_tested_and_the_words_say_why(tmp_path):
    """With two seeds a t-test has one degree of freedom: no mark at all, however the examples differ."""
    root = tmp_path / "runs" / "cmp"
    for seed in (0, 1):
        _write_run(root, "good", seed, 0, _corrupt(REFERENCES, 0.1, seed=10 + seed), [4.0] * len(REFERENCES))
        _write_run(root, "worse", seed, 1, _corrupt(REFERENCES, 0.9, seed=20 + seed), [6.0] * len(REFERENCES))
    rows = {row["run"]: row for row in _report(root)}
    for column in ("test bleu (best)", "test chrf (best)", "test nll (best)", "test exact_match (best)"):
        entry = rows["worse"][column]
        assert entry["test"] == "none" and entry["shared"] == 2 and "p" not in entry, column
    text = (root / "report" / "report.md").read_text()
    table = text.split("95 % intervals")[0]
    assert " * |" not in table and " † |" not in table
    assert "reference good (0.4000): not tested: worse +0.2000 (2 shared seeds; a test over training runs needs 3)." in text
    assert "get no `*`: with two, t(0.975, 1) = 12.7" in text


def test_without_a_declared_reference_the_first_row_is_it_even_when_worse(tmp_path):
    """The reference is chosen before any number is seen: the sweep's first point, not the best row."""
    root = tmp_path / "runs" / "order"
    for seed in (0, 1, 2):
        _write_run(root, "worse", seed, 0, _corrupt(REFERENCES, 0.9, seed=20 + seed), [6.0 + 0.1 * seed] * len(REFERENCES))
        _write_run(root, "good", seed, 1, _corrupt(REFERENCES, 0.1, seed=10 + seed), [4.0] * len(REFERENCES))
    rows = {row["run"]: row for row in _report(root)}
    for column in ("test bleu (best)", "test chrf (best)", "test nll (best)", "test exact_match (best)"):
        assert rows["worse"]["reference"] == rows["good"]["reference"] == "worse" and "p" not in rows["worse"][column]
        assert rows["good"][column]["p"] < 0.05 and rows["good"][column]["test"] == "seeds", column
    assert rows["good"]["test bleu (best)"]["mean"] > rows["worse"]["test bleu (best)"]["mean"]
    text = (root / "report" / "report.md").read_text()
    assert "**test bleu (best)**, reference worse" in text and "| **" in text.split("| good |")[0]


def test_a_sweeps_reference_row_is_what_every_row_is_tested_against(tmp_path):
    """An ablation asks "does this change hurt the base?": with `reference: worse` (not the first point)
    the better row is tested against the worse one, by Student's paired t on the per-seed corpus
    metrics (checked by hand), Holm-adjusted over the report's hypotheses (nll and bpb are one)."""
    root = tmp_path / "runs" / "ablation"
    good = {s: _corrupt(REFERENCES, 0.3, seed=10 + s) for s in (0, 1, 2)}
    worse = {s: _corrupt(REFERENCES, 0.45, seed=20 + s) for s in (0, 1, 2)}
    for seed in (0, 1, 2):
        _write_run(root, "good", seed, 0, good[seed], [4.0 + 0.3 * seed ** 2] * len(REFERENCES), reference="worse")
        _write_run(root, "worse", seed, 1, worse[seed], [5.0 + 0.2 * seed] * len(REFERENCES), reference="worse")
    rows = {row["run"]: row for row in _report(root)}
    assert rows["good"]["reference"] == "worse"
    hypotheses = {"nll": ("test nll (best)", "test bpb (best)"), "bleu": ("test bleu (best)",), "chrf": ("test chrf (best)",),
                  "exact_match": ("test exact_match (best)",)}
    raw = {}
    for family, columns in hypotheses.items():
        for column in columns:
            mine, theirs = rows["good"][column]["values"], rows["worse"][column]["values"]
            assert rows["good"][column]["p_raw"] == pytest.approx(_t_p(mine, theirs), rel=1e-9), column
            assert rows["good"][column]["difference"] == pytest.approx(sum(mine) / 3 - sum(theirs) / 3)
        raw[family] = max(rows["good"][c]["p_raw"] for c in columns)
    order = sorted(raw, key=raw.get)  # Holm by hand over the 4 hypotheses
    adjusted, running = {}, 0.0
    for rank, family in enumerate(order):
        running = max(running, min(1.0, (4 - rank) * raw[family]))
        adjusted[family] = running
    for family, columns in hypotheses.items():
        for column in columns:
            assert rows["good"][column]["p"] == pytest.approx(adjusted[family]), column
    text = (root / "report" / "report.md").read_text()
    assert "**test bleu (best)**, reference worse" in text and "over the report's 4 hypotheses" in text


def test_rows_with_other_seeds_are_paired_on_the_seeds_they_share_with_the_reference(tmp_path):
    """Reference row seeds 0-3, one row 0-2, one row 1-3: each is tested against the reference's values
    of the seeds it shares (Student's t by hand), while the table shows each row's own seeds; a
    seedless run next to seeded ones stays a row of its own."""
    root = tmp_path / "runs" / "mixed"
    seeds = {"best": (0, 1, 2, 3), "early": (0, 1, 2), "late": (1, 2, 3)}
    for i, (name, share) in enumerate((("best", 0.3), ("early", 0.45), ("late", 0.4))):
        for seed in seeds[name]:
            _write_run(root, name, seed, i, _corrupt(REFERENCES, share, seed=10 * i + seed),
                       [5.0 + i + 0.1 * seed * i] * len(REFERENCES))
    rows = {row["run"]: row for row in _report(root)}
    for name in ("early", "late"):
        for column in ("test bleu (best)", "test nll (best)"):
            ref = dict(zip(rows["best"]["seeds"], rows["best"][column]["values"]))
            mine = rows[name][column]["values"]
            assert rows[name][column]["shared"] == 3 and rows[name][column]["test"] == "seeds"
            assert rows[name][column]["p_raw"] == pytest.approx(_t_p(mine, [ref[s] for s in seeds[name]]), rel=1e-9)
        assert rows[name]["test bleu (best)"]["n"] == 3 and rows["best"]["test bleu (best)"]["n"] == 4
    from attnlab.reports.report import group_points
    from attnlab.reports.runs import RunRecord

    records = [RunRecord("p", root, "f", [], seed=s) for s in (None, 0, 1)]
    assert [(p.name, p.seeds) for p in group_points(records)] == [("p (no seed)", [None]), ("p", [0, 1])]


def test_two_identical_systems_are_not_significantly_different(tmp_path):
    root = tmp_path / "runs" / "same"
    nll = [random.Random(i).uniform(1, 9) for i in range(len(REFERENCES))]
    for seed in (0, 1, 2):
        hypotheses = _corrupt(REFERENCES, 0.4, seed=seed)
        _write_run(root, "a", seed, 0, hypotheses, nll)
        _write_run(root, "b", seed, 1, hypotheses, nll)
    rows = {row["run"]: row for row in _report(root)}
    for column in ("test bleu (best)", "test chrf (best)", "test exact_match (best)", "test nll (best)", "test bpb (best)"):
        assert rows["b"][column]["p"] == 1.0 and rows["b"][column]["difference"] == 0.0, column
    text = (root / "report" / "report.md").read_text()
    assert not re.search(r" \* \|", text.split("95 % intervals")[0])  # no cell marked significant
    assert ("): not significantly different: b +0.00 [+0.00, +0.00] (p = 1; no spread between its seeds' differences "
            "to size an effect against).") in text


def test_a_system_with_the_baselines_outputs_gets_p_one_beside_others():
    """sacreBLEU alone would answer 1 / 1001 for it; a different system in the same call keeps its
    own p, the one it gets when tested alone."""
    from attnlab.reports.stats import sacrebleu_paired_p

    baseline, other = _corrupt(REFERENCES, 0.2, seed=3), _corrupt(REFERENCES, 0.7, seed=4)
    for metric in ("bleu", "chrf"):
        alone = sacrebleu_paired_p(metric, REFERENCES, baseline, {"other": other})["other"]
        mixed = sacrebleu_paired_p(metric, REFERENCES, baseline, {"same": list(baseline), "other": other})
        assert mixed == {"same": 1.0, "other": alone}, metric
        assert alone < 0.05, metric


def test_two_clearly_different_systems_are(tmp_path):
    root = tmp_path / "runs" / "apart"
    for seed in (0, 1, 2):
        _write_run(root, "strong", seed, 0, _corrupt(REFERENCES, 0.1, seed=seed), [2.0 + 0.1 * seed] * len(REFERENCES))
        _write_run(root, "weak", seed, 1, _corrupt(REFERENCES, 0.8, seed=seed), [6.0 + 0.12 * seed] * len(REFERENCES))
    rows = {row["run"]: row for row in _report(root)}
    for column in ("test bleu (best)", "test chrf (best)", "test exact_match (best)", "test nll (best)", "test bpb (best)"):
        assert rows["strong"]["reference"] == "strong" and "p" not in rows["strong"][column], column
        assert rows["weak"][column]["p"] < 0.05 and rows["weak"][column]["test"] == "seeds", column
    text = (root / "report" / "report.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("| weak |")][0]
    assert len(re.findall(r" \* \|", table)) == 5  # every tested test column of the weak row is marked
    assert "significantly different: weak" in text
    # mean ± std over the 3 seeds, and a 95 % interval row for each point
    assert "±" in table and re.search(r"^\| weak \| 3 \| \[", text, re.M)


def test_permutation_p_equals_an_exhaustive_sign_flip_enumeration():
    """With 10 pairs scipy enumerates all 2^10 sign patterns; so does this naive loop."""
    a = [3.1, 2.0, 5.5, 4.2, 1.0, 2.2, 3.3, 4.0, 6.1, 2.9]
    b = [2.0, 2.5, 4.0, 3.0, 1.5, 1.0, 3.0, 2.0, 5.0, 3.5]
    d = [x - y for x, y in zip(a, b)]
    observed = abs(sum(d) / len(d))
    patterns = list(itertools.product((1, -1), repeat=len(d)))
    extreme = sum(abs(sum(s * x for s, x in zip(signs, d)) / len(d)) >= observed - 1e-12 for signs in patterns)
    assert paired_permutation_p(a, b) == pytest.approx(extreme / len(patterns))
    assert paired_permutation_p(a, a) == 1.0


@pytest.mark.parametrize("shift", [0.0, 0.03, 0.08])
def test_permutation_p_agrees_with_scipys_on_many_pairs(shift):
    """3,000 pairs (random sign patterns, not every one): the p-value is scipy's permutation_test's
    to within Monte Carlo error (both draw 9,999 patterns; the standard error is at most 0.005)."""
    import numpy as np
    from scipy import stats

    rng = np.random.default_rng(1)
    a = rng.normal(size=3000)
    b = a + rng.normal(scale=1.0, size=3000) - shift
    d = a - b
    reference = stats.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=9999,
                                       vectorized=True, alternative="two-sided", random_state=0).pvalue
    assert paired_permutation_p(list(a), list(b)) == pytest.approx(reference, abs=0.02)


def test_interval_is_students_t_by_hand():
    summary = summarize([1.0, 2.0, 3.0, 6.0])
    mean, std = 3.0, math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + 0 + (6 - 3) ** 2) / 3)
    half = 3.182446305284263 * std / math.sqrt(4)  # t(0.975, 3 degrees of freedom), from a table
    assert (summary.mean, summary.std, summary.n) == (pytest.approx(mean), pytest.approx(std), 4)
    assert (summary.low, summary.high) == (pytest.approx(mean - half), pytest.approx(mean + half))
    one = summarize([2.5])
    assert (one.mean, one.std, one.n, one.low) == (2.5, 0.0, 1, None)
