"""Intervals and paired significance in `attnlab report`, against independent references: the
`sacrebleu` command's own paired bootstrap, an exhaustive sign-flip enumeration, Student's t by hand.
(The bootstrap over seeds and Holm's correction: test_seed_significance.py.)"""
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

from attnlab.experiment.stats import paired_permutation_p, summarize

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
    from attnlab.experiment.report import report_main

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


def test_bleu_and_chrf_p_values_of_one_seed_equal_the_sacrebleu_command(tmp_path):
    """Two rows of one seed: the mark's test is sacreBLEU's paired bootstrap on that seed's outputs,
    its p (before Holm's correction over the report's 5 comparisons) as the sacrebleu command prints it."""
    root = tmp_path / "runs" / "one"
    good, worse = _corrupt(REFERENCES, 0.3, seed=10), _corrupt(REFERENCES, 0.45, seed=20)
    _write_run(root, "good", 0, 0, good, [5.0] * len(REFERENCES))
    _write_run(root, "worse", 0, 1, worse, [5.0] * len(REFERENCES))
    rows = {row["run"]: row for row in _report(root)}
    expected = _cli_p_values(tmp_path, REFERENCES, good, worse)
    for metric in ("bleu", "chrf"):
        entry = rows["worse"][f"test {metric}"]
        assert rows["good"][f"test {metric}"]["reference"] and entry["test"] == "sacrebleu"
        assert entry["p_raw"] == pytest.approx(expected[metric], abs=5e-5) and entry["pooled_p_raw"] == entry["p_raw"]
    assert 0.001 < expected["bleu"] < 0.9  # a p-value that could have come out otherwise
    text = (root / "report" / "report.md").read_text()
    assert "The rows share one seed with the reference, so the test uses that seed's test examples alone" in text
    assert "Holm-adjusted over the report's 5 comparisons" in text


def test_pooled_bleu_and_chrf_p_values_equal_the_sacrebleu_command(tmp_path):
    """Two rows of two seeds: the marks come from the bootstrap over seeds; the pooled example-level
    test beside it (seed k with seed k) is sacreBLEU's paired bootstrap on the concatenated outputs,
    as the sacrebleu command prints it."""
    root = tmp_path / "runs" / "cmp"
    good = {s: _corrupt(REFERENCES, 0.3, seed=10 + s) for s in (0, 1)}
    worse = {s: _corrupt(REFERENCES, 0.45, seed=20 + s) for s in (0, 1)}
    for seed in (0, 1):
        _write_run(root, "good", seed, 0, good[seed], [5.0] * len(REFERENCES))
        _write_run(root, "worse", seed, 1, worse[seed], [5.0] * len(REFERENCES))
    rows = {row["run"]: row for row in _report(root)}
    expected = _cli_p_values(tmp_path, REFERENCES * 2, good[0] + good[1], worse[0] + worse[1])
    assert rows["good"]["test bleu"]["reference"] and rows["good"]["test chrf"]["reference"]
    assert rows["worse"]["test bleu"]["test"] == "seeds"
    assert rows["worse"]["test bleu"]["pooled_p_raw"] == pytest.approx(expected["bleu"], abs=5e-5)
    assert rows["worse"]["test chrf"]["pooled_p_raw"] == pytest.approx(expected["chrf"], abs=5e-5)
    assert 0.001 < expected["bleu"] < 0.9  # a p-value that could have come out otherwise


def test_without_a_declared_reference_the_first_row_is_it_even_when_worse(tmp_path):
    """The reference is chosen before any number is seen: the sweep's first point, not the best row."""
    root = tmp_path / "runs" / "order"
    for seed in (0, 1):
        _write_run(root, "worse", seed, 0, _corrupt(REFERENCES, 0.6, seed=20 + seed), [6.0] * len(REFERENCES))
        _write_run(root, "good", seed, 1, _corrupt(REFERENCES, 0.1, seed=10 + seed), [4.0] * len(REFERENCES))
    rows = {row["run"]: row for row in _report(root)}
    for column in ("test bleu", "test chrf", "test nll", "test exact_match"):
        assert rows["worse"][column]["reference"] and rows["worse"][column]["p"] is None, column
        assert rows["good"][column]["p"] < 0.05 and rows["good"][column]["test"] == "seeds", column
    assert rows["good"]["test bleu"]["mean"] > rows["worse"]["test bleu"]["mean"]
    text = (root / "report" / "report.md").read_text()
    assert "Bold: the reference row, worse, which every other row is tested against (the first row" in text


def test_a_sweeps_reference_row_is_what_every_row_is_tested_against(tmp_path):
    """An ablation asks "does this change hurt the base?": with `reference: worse` (not the first
    point) the better row is tested against the worse one (its pooled test as the sacrebleu command
    with that baseline says), and the reference is the marked row of every column."""
    root = tmp_path / "runs" / "ablation"
    good = {s: _corrupt(REFERENCES, 0.3, seed=10 + s) for s in (0, 1)}
    worse = {s: _corrupt(REFERENCES, 0.45, seed=20 + s) for s in (0, 1)}
    for seed in (0, 1):
        _write_run(root, "good", seed, 0, good[seed], [4.0] * len(REFERENCES), reference="worse")
        _write_run(root, "worse", seed, 1, worse[seed], [5.0] * len(REFERENCES), reference="worse")
    rows = {row["run"]: row for row in _report(root)}
    expected = _cli_p_values(tmp_path, REFERENCES * 2, worse[0] + worse[1], good[0] + good[1])
    for column in ("test bleu", "test chrf", "test nll"):
        assert rows["worse"][column]["reference"] and not rows["good"][column]["reference"], column
    assert rows["good"]["test bleu"]["mean"] > rows["worse"]["test bleu"]["mean"]
    assert rows["good"]["test bleu"]["pooled_p_raw"] == pytest.approx(expected["bleu"], abs=5e-5)
    assert rows["good"]["test chrf"]["pooled_p_raw"] == pytest.approx(expected["chrf"], abs=5e-5)
    text = (root / "report" / "report.md").read_text()
    assert "Bold: the reference row, worse" in text and "**test bleu**: reference worse" in text


def test_rows_with_other_seeds_are_paired_on_the_seeds_they_share_with_the_reference(tmp_path):
    """Reference row seeds 0-2, one row 0-1, one row 1-2: each is tested against the reference's
    outputs of its own seeds (for the pooled test a baseline per seed set, as the sacrebleu command
    on those seeds says); a seedless run next to seeded ones stays a row of its own."""
    root = tmp_path / "runs" / "mixed"
    outputs = {(name, seed): _corrupt(REFERENCES, share, seed=10 * i + seed)
               for i, (name, share) in enumerate((("best", 0.3), ("early", 0.45), ("late", 0.4)))
               for seed in (0, 1, 2)}
    for (name, seed), hypotheses in outputs.items():
        if (name, seed) not in (("early", 2), ("late", 0)):
            _write_run(root, name, seed, ("best", "early", "late").index(name), hypotheses, [5.0] * len(REFERENCES))
    rows = {row["run"]: row for row in _report(root)}
    for name, seeds in (("early", (0, 1)), ("late", (1, 2))):
        expected = _cli_p_values(tmp_path, REFERENCES * 2, sum((outputs["best", s] for s in seeds), []),
                                 sum((outputs[name, s] for s in seeds), []))
        assert rows[name]["test bleu"]["pooled_p_raw"] == pytest.approx(expected["bleu"], abs=5e-5), name
        assert rows[name]["test bleu"]["test"] == "seeds", name
    from attnlab.experiment.report import group_points
    from attnlab.experiment.runs import RunRecord

    records = [RunRecord("p", root, "f", [], seed=s) for s in (None, 0, 1)]
    assert [(p.name, p.seeds) for p in group_points(records)] == [("p (no seed)", [None]), ("p", [0, 1])]


def test_two_identical_systems_are_not_significantly_different(tmp_path):
    root = tmp_path / "runs" / "same"
    hypotheses = _corrupt(REFERENCES, 0.4, seed=1)
    nll = [random.Random(i).uniform(1, 9) for i in range(len(REFERENCES))]
    for seed in (0, 1, 2):
        _write_run(root, "a", seed, 0, hypotheses, nll)
        _write_run(root, "b", seed, 1, hypotheses, nll)
    rows = {row["run"]: row for row in _report(root)}
    for column in ("test bleu", "test chrf", "test exact_match", "test nll", "test bpb"):
        assert rows["b"][column]["p"] == 1.0, column
    text = (root / "report" / "report.md").read_text()
    assert not re.search(r" \* \|", text.split("95 % intervals")[0])  # no cell marked significant
    assert "no row significantly different" in text


def test_a_system_with_the_baselines_outputs_gets_p_one_beside_others():
    """sacreBLEU alone would answer 1 / 1001 for it; a different system in the same call keeps its
    own p, the one it gets when tested alone."""
    from attnlab.experiment.stats import sacrebleu_paired_p

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
        _write_run(root, "weak", seed, 1, _corrupt(REFERENCES, 0.8, seed=seed), [6.0 + 0.1 * seed] * len(REFERENCES))
    rows = {row["run"]: row for row in _report(root)}
    for column in ("test bleu", "test chrf", "test exact_match", "test nll", "test bpb"):
        assert rows["strong"][column]["reference"], column
        assert rows["weak"][column]["p"] < 0.01, column  # Holm-adjusted over the 5 comparisons
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
