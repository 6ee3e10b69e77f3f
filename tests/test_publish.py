"""Results pages (`attnlab report --publish`): made from report.json alone, equal to the committed
fixture page, with a history line per publication that says whether the quality numbers matched."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from test_significance import REFERENCES, _corrupt, _write_run

FIXTURE = Path(__file__).parent / "fixtures" / "results_page"
META = {"command": "attnlab sweep experiments/demo.yaml", "date": "2026-12-05 04:00 UTC",
        "machine": "2 cores of a test CPU, no GPU", "commit": "abc1234", "torch": "2.13.0+cpu",
        "name": "demo", "question": "Does a model that corrupts a fifth of its outputs score worse?"}


def _sweep(root: Path, share: float = 0.2) -> Path:
    """A finished two-point, three-seed sweep with its sweep.json, as `attnlab sweep` leaves it."""
    sweep = root / "runs" / "demo"
    for seed in (0, 1, 2):
        _write_run(sweep, "clean", seed, 0, list(REFERENCES), [1.0] * len(REFERENCES))
        _write_run(sweep, "noisy", seed, 1, _corrupt(REFERENCES, share, seed), [1.5 + 0.1 * seed] * len(REFERENCES))
    for fit in sweep.glob("*/seed*/fit"):
        (fit / "summary.json").write_text(json.dumps({"family": "DecoderOnly", "params": 850_000, "fit_seconds": 36.0,
                                                      "epochs": 1, "steps": 625}))
    (sweep / "sweep.json").write_text(json.dumps(META))
    return sweep


def _publish(sweep: Path, page: Path) -> None:
    """Report and publish from the current folder, with relative paths as a user types them."""
    from attnlab.reports.report import report_main

    assert report_main([os.path.relpath(sweep), "--wandb", "disabled", "--publish", os.path.relpath(page)]) == 0


def test_a_page_rendered_from_the_fixture_json_equals_the_committed_page():
    from attnlab.reports.publish import render_page

    report = json.loads((FIXTURE / "demo.json").read_text(encoding="utf-8"))
    assert render_page(report, "demo") == (FIXTURE / "demo.md").read_text(encoding="utf-8")


def test_publishing_the_fixture_sweep_regenerates_the_committed_page(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = _sweep(tmp_path)
    page = tmp_path / "docs" / "results" / "demo.md"
    _publish(sweep, page)
    assert page.read_text(encoding="utf-8") == (FIXTURE / "demo.md").read_text(encoding="utf-8")
    text = page.read_text(encoding="utf-8")
    for fact in (META["command"], META["date"], META["machine"], META["commit"], META["question"],
                 "every run trained 625 optimizer steps (1 epoch); seeds 0, 1, 2 for every row",
                 "Wall time: 3:36 of training in all"):  # 6 fits of 36 s
        assert fact in text
    plots = json.loads(page.with_suffix(".json").read_text())["plots"]
    assert plots and all((page.parent / "demo" / name).read_bytes()[:4] == b"\x89PNG" for name in plots)


def test_a_rerun_adds_one_history_line_saying_whether_quality_matched(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    page = tmp_path / "demo.md"
    _publish(_sweep(tmp_path / "a"), page)
    _publish(_sweep(tmp_path / "b"), page)  # the same runs again
    _publish(_sweep(tmp_path / "c", share=0.5), page)  # a run whose outputs differ
    history = json.loads(page.with_suffix(".json").read_text())["history"]
    assert [h["matched"].split(":")[0] for h in history] == ["first run", "all matched", history[2]["matched"].split(":")[0]]
    assert history[2]["matched"].startswith(tuple(f"{n} differ" for n in range(1, 20)))
    assert "noisy test bleu" in history[2]["matched"]
    rows = [line for line in page.read_text().splitlines() if line.startswith(f"| {META['date']} |")]
    assert len(rows) == 3


def test_publishing_rewrites_the_readme_copy_of_the_table_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    readme = tmp_path / "README.md"
    before, after = "# demo\n\nintro\n\n", "\n\nmore text\n<!-- table: docs/other.md -->\nold\n<!-- /table -->\n"
    readme.write_text(before + "<!-- table: docs/results/demo.md -->\nstale table\n<!-- /table -->" + after)
    _publish(_sweep(tmp_path), tmp_path / "docs" / "results" / "demo.md")
    table = json.loads((tmp_path / "docs" / "results" / "demo.json").read_text())["markdown"]["table"]
    assert readme.read_text() == before + f"<!-- table: docs/results/demo.md -->\n{table}\n<!-- /table -->" + after


def test_a_page_path_without_md_is_one_clear_error(tmp_path, cli):
    sweep = _sweep(tmp_path)
    result = cli("report", sweep, "--wandb", "disabled", "--publish", tmp_path / "page.html")
    assert result.code == 2 and "ending in .md" in result.err


def test_the_committed_results_pages_are_their_json_rendered():
    """Every generated page under docs/results/ is still exactly what its JSON renders (nobody edited it)."""
    from attnlab.reports.publish import render_page

    results = Path(__file__).parents[1] / "docs" / "results"
    generated = [p for p in sorted(results.glob("*.json")) if (p.with_suffix(".md")).is_file()]
    for path in generated:
        assert render_page(json.loads(path.read_text(encoding="utf-8")), path.stem) == \
            path.with_suffix(".md").read_text(encoding="utf-8"), path


def test_the_readme_copies_of_tables_equal_their_pages():
    """A table the README copies from a results page (between its markers) is the page's own."""
    import re

    root = Path(__file__).parents[1]
    blocks = re.findall(r"<!-- table: (\S+) -->\n(.*?)\n<!-- /table -->", (root / "README.md").read_text(), re.S)
    assert blocks, "the README shows the main job's table"
    for page, table in blocks:
        assert table == json.loads((root / page).with_suffix(".json").read_text())["markdown"]["table"], page


def _marked_cells(table: str, mark: str = "*") -> dict[tuple[str, str], bool]:
    """(row, column header) -> whether the table's cell carries `mark`."""
    lines = table.splitlines()
    headers = [h.strip() for h in lines[0].strip("|").split("|")]
    out = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        row = cells[0].removesuffix(" (tuned)").removesuffix(" (untuned)")
        out.update({(row, header): cell.endswith(f" {mark}") for header, cell in zip(headers, cells)})
    return out


def _holm(raw: dict) -> dict:
    """Holm's step-down adjustment, written out again: the reference the pages are checked against."""
    adjusted, running = {}, 0.0
    for rank, key in enumerate(sorted(raw, key=raw.get)):
        running = max(running, min(1.0, (len(raw) - rank) * raw[key]))
        adjusted[key] = running
    return adjusted


def _t_p(a: list[float], b: list[float]) -> float:
    from scipy import stats

    d = [x - y for x, y in zip(a, b)]
    if len(set(d)) == 1:  # no spread: the t statistic's limit
        return 1.0 if d[0] == 0 else 0.0
    return float(stats.ttest_rel(a, b).pvalue)


def test_every_mark_on_a_committed_results_page_holds_over_seeds():
    """Recomputed from each committed page's JSON, independently of attnlab's tests: Student's paired t
    (scipy) on the per-seed values of the seeds a row shares with its reference (3 or more), Holm over
    one hypothesis per row, evaluation and metric family (nll with bpb, whose p is the larger); a
    column the reference has no value in is not tested, but for another decoding of the test data
    (`against`: the main job's verify), tested against the reference's test values. A cell carries `*`
    exactly where that p is below 0.05; the compute frontier's differences likewise."""
    results = Path(__file__).parents[1] / "docs" / "results"
    family = {"nll": "likelihood", "bpb": "likelihood"}
    pages = sorted(results.glob("*.json"))
    assert pages
    for path in pages:
        report = json.loads(path.read_text(encoding="utf-8"))
        assert report["format"] >= 4, f"{path}: re-mark it (attnlab report --remark {path.with_suffix('.md')})"
        rows = {row["run"]: row for row in report["rows"]}
        raw: dict[tuple[str, str], float] = {}
        for column in (c for c in report["columns"] if c.get("metric")):
            for row in rows.values():
                reference = rows.get(row["reference"])
                if reference is None or reference is row or not isinstance(row.get(column["header"]), dict):
                    continue
                mine = dict(zip(row["seeds"], row[column["header"]]["values"]))
                theirs = dict(zip(reference["seeds"], (reference.get(column["header"]) or {}).get("values") or []))
                if column.get("against") and all(v is None for v in theirs.values()):  # another decoding (verify)
                    (stand_in,) = [c for c in report["columns"]
                                   if c.get("evaluation") == column["against"] and c.get("metric") == column["metric"]]
                    theirs = dict(zip(reference["seeds"], reference[stand_in["header"]]["values"]))
                shared = [s for s in row["seeds"] if mine.get(s) is not None and theirs.get(s) is not None]
                if len(shared) >= 3 and row.get("tuned") == reference.get("tuned"):
                    key = (row["run"], column.get("evaluation"), family.get(column["metric"], column["metric"]))
                    raw[key] = max(raw.get(key, 0.0), _t_p([mine[s] for s in shared], [theirs[s] for s in shared]))
        adjusted = _holm(raw)
        marked, daggers = _marked_cells(report["markdown"]["table"]), _marked_cells(report["markdown"]["table"], "†")
        for column in (c for c in report["columns"] if c.get("metric")):
            for name in rows:
                p = adjusted.get((name, column.get("evaluation"), family.get(column["metric"], column["metric"])))
                assert marked[name, column["header"]] == (p is not None and p < 0.05), (path.name, name, column["header"], p)
                cell = rows[name].get(column["header"]) or {}  # `†`: one shared seed, tested on its examples
                assert daggers[name, column["header"]] == (cell.get("test") == "examples" and cell["shared"] == 1
                                                           and cell["p"] < 0.05), (path.name, name, column["header"])
        frontier = report.get("compute_frontier")
        if frontier:
            _check_frontier_marks(path, frontier, report["markdown"]["compute_frontier"])


def _check_frontier_marks(path: Path, frontier: dict, lines: list[str]) -> None:
    """The compute frontier's differences: `*` exactly where the paired t over 3 or more shared seeds,
    Holm-adjusted over the section's tests, is below 0.05."""
    contenders = {c["name"]: c for c in frontier["contenders"]}
    raw, compared = {}, set()
    for c in (c for c in contenders.values() if not c["ar"]):
        for ref in (r for r in contenders.values() if r["ar"]):
            theirs = {rung["budget"]: rung for rung in ref["rungs"]}
            for rung in (r for r in c["rungs"] if r["budget"] in theirs):
                key = (c["name"], ref["name"], f"{rung['budget']:.3g}")
                compared.add(key)
                mine, other = dict(zip(rung["seeds"], rung["best"])), dict(zip(theirs[rung["budget"]]["seeds"],
                                                                               theirs[rung["budget"]]["best"]))
                shared = [s for s in rung["seeds"] if mine.get(s) is not None and other.get(s) is not None]
                if len(shared) >= 3:
                    raw[key] = _t_p([mine[s] for s in shared], [other[s] for s in shared])
    adjusted = _holm(raw)
    table = {}
    for line in lines:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 6 and (cells[0], cells[1], cells[2]) in compared:
            table[cells[0], cells[1], cells[2]] = cells[4]
    assert set(table) == compared, path
    for key, difference in table.items():
        p = adjusted.get(key)
        assert difference.endswith(" *") == (p is not None and p < 0.05), (path.name, key, p)


def test_remark_recomputes_a_pages_marks_and_words_from_its_json_alone(tmp_path, monkeypatch):
    """A page whose marks were made by an older test (here: a `*` on a BLEU cell, as a bootstrap over
    three seeds gave it) gets today's marks from its per-seed values, with no run at hand; so does
    a page in the format before report.json listed its columns, whose columns are then named for
    the checkpoint they show; each gains one history line saying so."""
    from attnlab.reports.publish import remark

    monkeypatch.chdir(tmp_path)
    page = tmp_path / "demo.md"
    _publish(_sweep(tmp_path), page)
    shutil.rmtree(tmp_path / "runs")  # nothing but the page and its JSON from here on
    fresh = json.loads(page.with_suffix(".json").read_text())
    stale = json.loads(json.dumps(fresh))
    for row in stale["rows"]:
        if row["run"] == "noisy":
            row["test bleu (best)"].update(p=0.001, p_raw=0.0002, test="seeds")
    stale["markdown"]["table"] = stale["markdown"]["table"].replace("90.90 ± 3.84 |", "90.90 ± 3.84 * |")
    page.with_suffix(".json").write_text(json.dumps(stale))
    remark(page)
    again = json.loads(page.with_suffix(".json").read_text())
    assert again["markdown"]["table"] == fresh["markdown"]["table"] and again["rows"] == fresh["rows"]
    assert again["history"][-1]["matched"].startswith("marks and words recomputed from the per-seed values")
    assert len(again["history"]) == 2 and "(attnlab report --remark; no run repeated)" in page.read_text()
    # the format before: headers without the checkpoint, the reference flagged in its cells, old test fields
    legacy = json.loads(json.dumps(fresh))
    legacy["format"] = 3
    legacy.pop("columns")
    for row in legacy["rows"]:
        for header in [h for h in row if h.endswith(" (best)")]:
            cell = row.pop(header)
            for key in ("test", "shared", "difference", "low", "high", "p_raw", "p", "spread", "detectable", "why"):
                cell.pop(key, None)
            cell.update(reference=row["run"] == "clean", p=None if row["run"] == "clean" else 0.002, pooled_p=0.002)
            row[header.removesuffix(" (best)")] = cell
        for key in ("reference", "facet", "tuned"):
            row.pop(key)
    page.with_suffix(".json").write_text(json.dumps(legacy))
    remark(page)
    upgraded = json.loads(page.with_suffix(".json").read_text())
    assert upgraded["format"] == 4
    headers = [c["header"] for c in upgraded["columns"]]
    assert "val nll (last)" in headers and "test bleu (best)" in headers and "test nll" not in headers
    marks = _marked_cells(upgraded["markdown"]["table"])
    assert marks == {(row, header.replace("val nll (best)", "val nll (last)")): mark
                     for (row, header), mark in _marked_cells(fresh["markdown"]["table"]).items()}
    # a format-3 row of one shared seed kept its example-level p, and keeps it, now as `†`
    one_seed = json.loads(json.dumps(legacy))
    for row in one_seed["rows"]:
        row["seeds"] = row["seeds"][:1]
        for cell in (c for c in row.values() if isinstance(c, dict)):
            cell["values"], cell["n"] = cell["values"][:1], 1
        if row["run"] == "noisy":
            row["test bleu"].update(test="sacrebleu", p_raw=0.001, p=0.005)
    page.with_suffix(".json").write_text(json.dumps(one_seed))
    remark(page)
    kept = {row["run"]: row for row in json.loads(page.with_suffix(".json").read_text())["rows"]}
    assert kept["noisy"]["test bleu (best)"]["test"] == "examples" and kept["noisy"]["test bleu (best)"]["p"] == 0.001
    assert "sacreBLEU's paired bootstrap" in kept["noisy"]["test bleu (best)"]["why"]
    assert kept["noisy"]["test chrf (best)"]["why"].startswith("one shared seed; no per-example values")  # it had none
    assert " †" in page.read_text().split("| noisy |")[1].split("\n")[0]


def regenerate_fixture() -> None:  # pragma: no cover - run by hand after a deliberate change of the page
    """python -c 'import sys; sys.path.insert(0, "tests"); import test_publish; test_publish.regenerate_fixture()'"""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.chdir(tmp)
        _publish(_sweep(tmp), tmp / "demo.md")
        FIXTURE.mkdir(parents=True, exist_ok=True)
        for name in ("demo.md", "demo.json"):
            shutil.copyfile(tmp / name, FIXTURE / name)


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])


def test_the_commit_a_page_names_changes_with_the_code_not_with_the_docs(tmp_path):
    """`+changes` says the code that measured differs from the commit; a results page being written
    (docs/, markdown) is no such change."""
    import subprocess

    from attnlab.reports.provenance import commit

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    (tmp_path / "docs").mkdir()
    for name in ("code.py", "README.md", "docs/page.json"):
        (tmp_path / name).write_text("a\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    head = commit(tmp_path)
    assert len(head) == 7 and "+" not in head
    (tmp_path / "docs" / "page.json").write_text("b\n")
    (tmp_path / "README.md").write_text("b\n")
    assert commit(tmp_path) == head
    (tmp_path / "code.py").write_text("b\n")
    assert commit(tmp_path) == head + "+changes"
