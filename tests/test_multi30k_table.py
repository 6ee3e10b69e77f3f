"""scripts/multi30k_table.py: the goal check of issue 32 and the generated block of the results page."""
import json
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import multi30k_table  # noqa: E402
from attnlab.reports.publish import replace_generated  # noqa: E402

AR = {"test/bleu": 34.0, "test/gen_tokens_per_s": 300.0, "test/nfe_per_token": 1.0}


@pytest.mark.parametrize("bleu, tokens_per_s, calls, met", [
    (31.0, 600.0, 0.5, True),  # exactly on every bound
    (30.9, 600.0, 0.5, False),  # 3.1 BLEU below
    (33.0, 599.0, 0.5, False),  # 1.997× the tokens/s
    (33.0, 900.0, 0.51, False),  # more than two calls per block of 4
])
def test_the_goal_needs_quality_speed_and_few_calls_at_once(bleu, tokens_per_s, calls, met):
    ok, text = multi30k_table.goal_verdict(AR, {"test/bleu": bleu, "test/gen_tokens_per_s": tokens_per_s,
                                                "test/nfe_per_token": calls})
    assert ok is met
    assert ("✗" in text) is not met


@pytest.mark.parametrize("bleu, tokens_per_s, k, met, limit", [
    (33.0, 450.0, 2.0, True, None),  # 1 BLEU below, exactly 1.5x
    (32.9, 450.0, 2.0, False, None),  # 1.1 BLEU below
    (34.0, 390.0, 1.3, False, "k would have to reach 1.50; at this k, a call would have to cost 0.87 AR steps"),
])
def test_draft_and_verify_needs_ar_quality_and_one_and_a_half_times_its_speed(bleu, tokens_per_s, k, met, limit):
    """Speed-up 1.3x at k 1.3 is b / a = 1.00: it is k that falls short of 1.5."""
    ok, text = multi30k_table.verify_verdict(AR, {"test/bleu": bleu, "test/gen_tokens_per_s": tokens_per_s,
                                                  "test/tokens_per_call": k})
    assert ok is met
    assert (limit is None) == ("would have to" not in text) and (limit is None or limit in text)
    assert f"k {k:.2f}, b / a {k / (tokens_per_s / 300.0):.2f}" in text


def _evaluation(root, name, bleu, tokens_per_s, calls, hypotheses, fit, **more):
    folder = root / name
    folder.mkdir(parents=True)
    more = {f"test/{key}": value for key, value in more.items()}
    (folder / "metrics.csv").write_text(",".join(["test/bleu", "test/chrf", "test/gen_tokens_per_s", "test/nfe_per_token",
                                                  *more]) + "\n" + ",".join(map(str, [bleu, 50.0, tokens_per_s, calls,
                                                                                     *more.values()])) + "\n")
    (folder / "examples.jsonl").write_text("".join(json.dumps({"reference": r, "hypothesis": h}) + "\n"
                                                   for r, h in zip(REFERENCES, hypotheses)))
    (folder / "config.yaml").write_text(f"ckpt_path: {fit / 'checkpoints' / 'x.ckpt'}\n")


REFERENCES = ["ein hund läuft im park .", "zwei männer spielen fußball .", "eine frau liest ein buch ."] * 4


def test_the_page_block_is_replaced_with_the_table_and_the_verdict(tmp_path):
    root = tmp_path / "runs" / "multi30k"
    ar_fit, bd_fit = root / "decoder_only" / "budget", root / "block_diffusion_from_ar" / "epoch7"
    for fit, summary in ((ar_fit, {"steps": 3000, "fit_seconds": 3200.0, "ledger": {"train_seconds": 3200.0}}),
                         (bd_fit, {"steps": 2500, "fit_seconds": 1200.0, "ledger": {
                             "train_seconds": 3210.0, "inherited": {"steps": 1700, "seconds": 2000.0}}})):
        (fit / "checkpoints").mkdir(parents=True)
        (fit / "checkpoints" / "x.ckpt").write_bytes(b"")
        (fit / "summary.json").write_text(json.dumps(summary))
    worse = [h.replace("hund", "katze") for h in REFERENCES]
    for batch in (1, 64):
        _evaluation(root, f"decoder_only/budget-greedy@b{batch}", 34.0, 300.0, 1.0, REFERENCES, ar_fit)
        _evaluation(root, f"block_diffusion_from_ar/epoch7-steps=2@b{batch}", 32.0, 650.0, 0.5, worse, bd_fit)
        _evaluation(root, f"block_diffusion_from_ar/epoch7-steps=4@b{batch}", 33.5, 280.0, 1.0, worse, bd_fit)
    # Draft-and-verify: blocks of 4 at batch 1 and 64 decode the same text; blocks of 8 another (a bug's sign).
    drafts = {"tokens_per_call": 1.5, "draft_p": 0.4, "draft_p1": 0.45, "draft_p2": 0.3, "draft_p3": 0.2}
    for batch in (1, 64):
        _evaluation(root, f"block_diffusion_from_ar/epoch7-verify@b{batch}", 33.8, 420.0, 0.67, REFERENCES, bd_fit,
                    **drafts)
    page = tmp_path / "page.md"
    page.write_text("# title\n\n<!-- generated: multi30k_table -->\n<!-- /generated -->\n\nafter\n")
    multi30k_table.main(root, "decoder_only/*greedy@b64", page)  # an empty block
    page.write_text(page.read_text().replace("p: sacreBLEU", "old numbers"))
    multi30k_table.main(root, "decoder_only/*greedy@b64", page)  # and one holding the last table

    text = page.read_text()
    assert "old numbers" not in text and text.startswith("# title") and text.endswith("after\n")
    assert "0:53:30 (0:33:20 AR + 0:20:10), 2,500 steps" in text  # the converted row's cost includes its AR epochs
    assert "0:53:20, 3,000 steps" in text
    assert "block_diffusion_from_ar/epoch7-steps=2@b1: 2.00 BLEU below" in text and "2.17×" in text
    assert "epoch7-steps=4@b1" in text and "0.93× its tokens/s (goal ≥ 2×) ✗" in text
    assert "**The goal is met** by 1 of the 2 block-diffusion decodings at batch 1." in text
    assert "| block_diffusion_from_ar/epoch7-verify@b1 | 1.50 | 0.45 | 0.30 | 0.20 |" in text  # p by position
    assert "epoch7-verify@b1 against decoder_only/budget-greedy@b1: 0.20 BLEU below (goal ≤ 1), 1.40× its " \
        "tokens/s (goal ≥ 1.5×) ✗; k 1.50, b / a 1.07" in text
    assert "decoded the same text (block size and batch aside): yes" in text

    _evaluation(root, "block_diffusion_from_ar/epoch7-verify-block8@b1", 33.0, 420.0, 0.67, worse, bd_fit,
                **drafts, draft_p4=0.1, draft_p5=0.0, draft_p6=0.0, draft_p7=0.0)
    multi30k_table.main(root, "decoder_only/*greedy@b64", page)
    text = page.read_text()
    assert "| block_diffusion_from_ar/epoch7-verify@b1 | 1.50 | 0.45 | 0.30 | 0.20 | — | — | — | — |" in text
    assert "decoded the same text (block size and batch aside): NO" in text


def test_a_page_without_the_markers_is_refused_and_left_as_it_was(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# no block here\n")
    with pytest.raises(SystemExit, match="has no <!-- generated: multi30k_table -->"):
        replace_generated(page, "multi30k_table", "table")
    assert page.read_text() == "# no block here\n"
