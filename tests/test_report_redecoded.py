"""A row decoded another way on the test data (the main job's `verify`: the converted model's AR view)
is tested against its reference's `test` evaluation when the reference has no such decoding; other
evaluations, and likelihoods (which do not depend on decoding), are not."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

from attnlab.reports.report import Point, build_columns, decodes_the_test_data, report_rows
from attnlab.reports.runs import RunRecord
from attnlab.reports.significance import adjust, compare_columns, store_comparisons
from attnlab.reports.stats import paired_t
from attnlab.reports.tables import render

DATA = {"class_path": "data_modules.Grammar", "init_args": {"data_dir": "d", "eval_batch_size": 64}}


def _evaluation(tmp_path, name: str, data: dict) -> object:
    folder = tmp_path / name
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"data": data}))
    return folder


def _record(tmp_path, name, seed, reference, evaluations: dict[str, dict], data: dict[str, dict]) -> RunRecord:
    dirs = {e: _evaluation(tmp_path, f"{name}/seed{seed}/{e}", data.get(e, DATA)) for e in evaluations}
    return RunRecord(name, tmp_path / name, "x", [], summary={"steps": 10}, seed=seed, reference=reference,
                     evaluations=evaluations, evaluation_dirs=dirs)


def _report(tmp_path, verify_data: dict = DATA):
    ar_bleu, ar_view, converted = [70.0, 72.0, 75.0], [69.5, 72.4, 73.9], [40.0, 42.0, 41.0]
    records = []
    for seed in range(3):
        records.append(_record(tmp_path, "decoder_only", seed, "decoder_only",
                               {"test": {"test/bleu": ar_bleu[seed], "test/nll": 1.0 + seed / 10}}, {}))
        records.append(_record(tmp_path, "converted", seed, "decoder_only",
                               {"test": {"test/bleu": converted[seed], "test/nll": 1.5 + seed / 10},
                                "verify": {"test/bleu": ar_view[seed], "test/nll": 1.5 + seed / 10}},
                               {"verify": {**verify_data, "init_args": {**verify_data["init_args"], "eval_batch_size": 1}}}))
        records.append(_record(tmp_path, "encoder_decoder", seed, "decoder_only",
                               {"test": {"test/bleu": 71.0 + seed, "test/nll": 1.1}}, {}))
    points = [Point(n, [r for r in records if r.name == n]) for n in ("decoder_only", "converted", "encoder_decoder")]
    columns = build_columns(records)
    rows = report_rows(points, columns)
    tested = compare_columns(rows, columns)
    counts = adjust(tested)
    store_comparisons(rows)
    return records, columns, {r["run"]: r for r in rows}, counts, (ar_bleu, ar_view)


def test_another_decoding_of_the_test_data_is_tested_against_the_references_test(tmp_path):
    records, columns, rows, counts, (ar_bleu, ar_view) = _report(tmp_path)
    assert decodes_the_test_data(records, "verify")  # the eval batch size aside, the same data
    by_header = {c.header: c for c in columns}
    assert by_header["verify bleu (best)"].against == "test"
    assert by_header["verify nll (best)"].against is None  # a likelihood does not depend on decoding
    found = rows["converted"]["verify bleu (best)"]
    expected = paired_t(ar_view, ar_bleu)
    assert found["test"] == "seeds" and found["shared"] == 3
    assert found["difference"] == pytest.approx(np.mean(ar_view) - np.mean(ar_bleu))
    assert found["p_raw"] == pytest.approx(expected.p)
    assert rows["converted"]["verify nll (best)"]["test"] == "none"  # the test's own likelihood: not tested twice
    # A row without the decoding gets no comparison in its column, and the reference none of its own.
    assert all("test" not in rows[name]["verify bleu (best)"] for name in ("encoder_decoder", "decoder_only"))
    # Hypotheses: converted's test and verify (bleu, nll each) and encoder_decoder's test (bleu, nll).
    assert counts["seeds"] == 5
    words = "\n".join(render(columns, list(rows.values()), counts)["significance"])
    assert f"**verify bleu (best)**, reference decoder_only's test bleu (best) ({np.mean(ar_bleu):.2f})" in words


def test_an_evaluation_on_other_data_is_not_tested_against_the_references_test(tmp_path):
    other = {"class_path": "data_modules.Grammar", "init_args": {"data_dir": "elsewhere", "eval_batch_size": 64}}
    records, columns, rows, _, _ = _report(tmp_path, other)
    assert not decodes_the_test_data(records, "verify")
    assert next(c for c in columns if c.header == "verify bleu (best)").against is None
    found = rows["converted"]["verify bleu (best)"]
    assert found["test"] == "none" and found["why"] == "the reference decoder_only has no value here"
