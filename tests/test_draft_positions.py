"""scripts/draft_positions.py: the table of p by draft position over seeds and block sizes."""
import json
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import draft_positions  # noqa: E402


def _evaluation(folder, metrics: dict, hypotheses: list[str]):
    folder.mkdir(parents=True)
    (folder / "metrics.csv").write_text(",".join(metrics) + "\n" + ",".join(map(str, metrics.values())) + "\n")
    (folder / "examples.jsonl").write_text("".join(json.dumps({"reference": h, "hypothesis": h}) + "\n"
                                                   for h in hypotheses))
    return folder


def test_the_table_averages_seeds_by_block_and_checks_the_text_is_the_same(tmp_path):
    text = ["ein hund .", "zwei katzen ."]
    folders = {
        4: [_evaluation(tmp_path / "seed0" / "block4", {"test/bleu": 70, "test/tokens_per_call": 1.2, "test/draft_p": 0.4,
                                                         "test/draft_p1": 0.5, "test/draft_p2": 0.3, "test/draft_p3": 0.1}, text),
            _evaluation(tmp_path / "seed1" / "block4", {"test/bleu": 72, "test/tokens_per_call": 1.4, "test/draft_p": 0.5,
                                                         "test/draft_p1": 0.6, "test/draft_p2": 0.4, "test/draft_p3": 0.2}, text)],
        8: [_evaluation(tmp_path / "seed0" / "block8", {"test/bleu": 70, "test/tokens_per_call": 1.1, "test/draft_p": 0.3,
                                                         "test/draft_p1": 0.5, "test/draft_p7": "nan"}, text),
            _evaluation(tmp_path / "seed1" / "block8", {"test/bleu": 72, "test/tokens_per_call": 1.3, "test/draft_p": 0.4,
                                                         "test/draft_p1": 0.7, "test/draft_p7": "nan"}, text)],
    }
    lines = draft_positions.table(folders)
    assert lines[0].endswith("| p1 | p2 | p3 | p4 | p5 | p6 | p7 |")
    assert "| 4 | 2 | 71.00 ± 1.41 | 1.30 ± 0.14 | 0.45 ± 0.07 | 0.55 | 0.35 | 0.15 | — | — | — | — |" in lines
    assert "| 8 | 2 | 71.00 ± 1.41 | 1.20 ± 0.14 | 0.35 ± 0.07 | 0.60 | — | — | — | — | — | — |" in lines
    assert lines[-1].endswith(": yes.")

    (folders[8][1] / "examples.jsonl").write_text("".join(json.dumps({"reference": h, "hypothesis": h + " x"}) + "\n"
                                                          for h in text))
    assert draft_positions.table(folders)[-1].endswith(": NO.")
