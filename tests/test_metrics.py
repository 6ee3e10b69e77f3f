"""Our metrics (through torchmetrics) equal the reference `sacrebleu` package."""
import pytest
import sacrebleu

from attnlab.families.metrics import EvalMetrics

HYPOTHESES = [
    "Ein Mann in einem blauen Hemd steht auf einer Leiter.",
    "Zwei Hunde spielen im Schnee .",
    "Eine Frau, die ein Buch liest, sitzt auf der Bank!",
    "Kinder spielen Fußball auf dem Rasen.",
    "Ein Mann fährt Fahrrad.",
]
REFERENCES = [
    "Ein Mann in einem blauen Hemd steht auf einer Leiter und putzt ein Fenster.",
    "Zwei Hunde spielen im Schnee.",
    "Eine Frau liest ein Buch auf einer Bank.",
    "Kinder spielen Fußball auf dem Rasen.",
    "Ein Junge fährt mit seinem Fahrrad.",
]


def computed(hypotheses, references, split_at=2):
    metrics = EvalMetrics()
    # Two updates, as in two validation batches: the states must add up exactly.
    metrics.update_generation(hypotheses[:split_at], references[:split_at], 10, 1.0)
    metrics.update_generation(hypotheses[split_at:], references[split_at:], 10, 1.0)
    return metrics.compute("val")


def test_bleu_equals_sacrebleu_13a_cased():
    expected = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES], tokenize="13a").score
    assert computed(HYPOTHESES, REFERENCES)["val/bleu"] == pytest.approx(expected, abs=1e-3)


def test_lowercased_bleu_equals_sacrebleu_lowercase():
    lowered = [h.upper() for h in HYPOTHESES]  # case differences count only in the cased score
    expected = sacrebleu.corpus_bleu(lowered, [REFERENCES], tokenize="13a", lowercase=True).score
    result = computed(lowered, REFERENCES)
    assert result["val/bleu_lc"] == pytest.approx(expected, abs=1e-3)
    assert result["val/bleu"] < result["val/bleu_lc"]


def test_chrf_equals_sacrebleu_chrf():
    expected = sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score  # chrF: word order 0
    assert computed(HYPOTHESES, REFERENCES)["val/chrf"] == pytest.approx(expected, abs=1e-2)


@pytest.mark.parametrize("hypotheses", [
    ["", "", HYPOTHESES[2], HYPOTHESES[3], ""],  # empty outputs
    ["xyz", "qqq", *HYPOTHESES[2:]],  # outputs that share no character n-gram with their reference
], ids=["empty", "no-overlap"])
def test_chrf_and_bleu_count_outputs_that_match_nothing(hypotheses):
    """torchmetrics' CHRFScore (1.9.0) drops such sentences' references and scores these near 100."""
    result = computed(hypotheses, REFERENCES)
    assert result["val/chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [REFERENCES]).score, abs=1e-6)
    assert result["val/bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [REFERENCES]).score, abs=1e-3)


def test_exact_match_counts_identical_strings():
    assert computed(HYPOTHESES, REFERENCES)["val/exact_match"] == pytest.approx(20.0)


def test_a_nan_loss_reaches_the_logged_nll_instead_of_vanishing():
    """torchmetrics drops NaN by default; a diverged model then read as val/nll = 0, a 'best' model."""
    import math

    import torch

    metrics = EvalMetrics()
    metrics.update_likelihood(torch.tensor(2.0), torch.tensor(2.0), 4, 10)
    metrics.update_likelihood(torch.tensor(float("nan")), torch.tensor(float("nan")), 4, 10)
    out = metrics.compute("val")
    assert math.isnan(out["val/nll"]) and math.isnan(out["val/loss"]) and math.isnan(out["val/ppl"])
    assert math.isnan(out["val/bpb"])
