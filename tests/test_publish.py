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
    """A finished two-point, two-seed sweep with its sweep.json, as `attnlab sweep` leaves it."""
    sweep = root / "runs" / "demo"
    for seed in (0, 1):
        _write_run(sweep, "clean", seed, 0, list(REFERENCES), [1.0] * len(REFERENCES))
        _write_run(sweep, "noisy", seed, 1, _corrupt(REFERENCES, share, seed), [1.5] * len(REFERENCES))
    for fit in sweep.glob("*/seed*/fit"):
        (fit / "summary.json").write_text(json.dumps({"family": "DecoderOnly", "params": 850_000, "fit_seconds": 36.0,
                                                      "epochs": 1, "steps": 625}))
    (sweep / "sweep.json").write_text(json.dumps(META))
    return sweep


def _publish(sweep: Path, page: Path) -> None:
    """Report and publish from the current folder, with relative paths as a user types them."""
    from attnlab.experiment.report import report_main

    assert report_main([os.path.relpath(sweep), "--wandb", "disabled", "--publish", os.path.relpath(page)]) == 0


def test_a_page_rendered_from_the_fixture_json_equals_the_committed_page():
    from attnlab.experiment.publish import render_page

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
                 "every run trained 625 optimizer steps (1 epoch); seeds 0, 1 for every row",
                 "Wall time: 2:24 of training in all"):  # 4 fits of 36 s
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
    from attnlab.experiment.publish import render_page

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
