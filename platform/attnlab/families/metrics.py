"""Evaluation metrics every family reports under the same keys, synchronised across ranks.

Sums (not means) are kept as states so that DDP synchronisation is exact.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torchmetrics import Metric, SumMetric
from torchmetrics.text import SacreBLEUScore

from attnlab.compat import private_api as private


def exact(prediction: str, reference: str) -> bool:
    """What exact match counts: the same string up to surrounding whitespace."""
    return prediction.strip() == reference.strip()


def example_record(index: int, source: str, reference: str, hypothesis: str | None, nll: float, tokens: int,
                   n_bytes: int) -> dict:
    """One evaluated example, as `attnlab test` saves it (examples.jsonl) for paired significance tests:
    nll in nats summed over its target tokens (a bound for block diffusion), bits = nll / ln 2."""
    record = {"index": int(index), "source": source, "reference": reference, "nll": float(nll), "tokens": int(tokens),
              "bytes": int(n_bytes), "bits": float(nll) / math.log(2)}
    if hypothesis is not None:
        record.update(hypothesis=hypothesis, exact=exact(hypothesis, reference))
    return record


class ExactMatch(Metric):
    full_state_update = False

    def __init__(self):
        super().__init__()
        self.add_state("correct", torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, predictions: list[str], references: list[str]) -> None:
        self.correct += sum(exact(p, r) for p, r in zip(predictions, references))
        self.total += len(references)

    def compute(self) -> torch.Tensor:
        return self.correct / self.total.clamp(min=1)


class ChrF(Metric):
    """Corpus chrF (character 6-grams, beta 2, no word n-grams) exactly as sacreBLEU computes it.

    torchmetrics' CHRFScore (1.9.0) drops the reference n-grams of every sentence that shares no
    n-gram with its reference, an empty output included (torchmetrics issue #3480, fixed after
    that release): a model that outputs nothing for half the examples would score 100. Here the
    states are sacreBLEU's own per-sentence statistics, summed (so DDP sync stays exact), and the
    score comes from sacreBLEU. (Its statistics methods are sacreBLEU's internals, which its own
    significance tests use; pinned to sacrebleu 2.x in pyproject.toml.)
    """

    full_state_update = False

    def __init__(self):
        super().__init__()
        from sacrebleu.metrics import CHRF

        self._chrf = CHRF()
        self.add_state("stats", torch.zeros(len(self._statistics(["a"], [["a"]])[0]), dtype=torch.float64),
                       dist_reduce_fx="sum")

    def _statistics(self, predictions: list[str], references: list[list[str]]) -> list[list[int]]:
        return private.get(self._chrf, "_extract_corpus_statistics")(predictions, references)

    def update(self, predictions: list[str], references: list[str]) -> None:
        if predictions:
            stats = self._statistics(list(predictions), [list(references)])
            self.stats += torch.tensor(stats, dtype=torch.float64, device=self.stats.device).sum(0)

    def compute(self) -> torch.Tensor:
        """0-1, like the other torchmetrics scores (x 100 when logged)."""
        score = private.get(self._chrf, "_compute_score_from_stats")(self.stats.tolist()).score
        return torch.tensor(score / 100.0, dtype=torch.float64)


class EvalMetrics(nn.Module):
    """Likelihood sums, generation quality (cased detokenized sacreBLEU 13a, chrF) and speed.

    bpb (bits per byte): summed target NLL in bits over the UTF-8 bytes of the reference texts, a
    likelihood that compares across tokenizers and vocabulary sizes (a bound for block diffusion).
    """

    def __init__(self):
        super().__init__()
        self.bleu = SacreBLEUScore(tokenize="13a")
        self.bleu_lc = SacreBLEUScore(tokenize="13a", lowercase=True)  # secondary, as older papers report
        self.chrf = ChrF()
        self.exact_match = ExactMatch()
        # A NaN loss must surface as val/nll = nan (never selected as best): torchmetrics' default
        # drops NaN values with a warning, which turned a diverged model into val/nll = 0.
        for name in ("loss_sum", "nll_sum"):
            setattr(self, name, SumMetric(nan_strategy="disable"))
        for name in ("tokens", "bytes", "gen_tokens", "gen_seconds", "gen_calls", "gen_positions"):
            setattr(self, name, SumMetric())
        self.generated = False

    def update_likelihood(self, loss: torch.Tensor, nll: torch.Tensor, tokens: torch.Tensor, n_bytes: torch.Tensor) -> None:
        """Per-row (or already summed) training loss, NLL in nats, target tokens and reference bytes."""
        self.loss_sum.update(loss.detach().float().sum())
        self.nll_sum.update(nll.detach().float().sum())
        self.tokens.update(torch.as_tensor(tokens).float().sum())
        self.bytes.update(torch.as_tensor(n_bytes).float().sum())

    def update_generation(self, hypotheses: list[str], references: list[str], n_tokens: int, seconds: float,
                          calls: int = 0, positions: int = 0):
        """`calls`: the model calls (NFE) the batch took; `positions`: tokens (with eos) of its longest row."""
        self.bleu.update(hypotheses, [[r] for r in references])
        self.bleu_lc.update(hypotheses, [[r] for r in references])
        self.chrf.update(hypotheses, references)
        self.exact_match.update(hypotheses, references)
        self.gen_tokens.update(float(n_tokens))
        self.gen_seconds.update(seconds)
        self.gen_calls.update(float(calls))
        self.gen_positions.update(float(positions))
        self.generated = True

    def compute(self, prefix: str) -> dict[str, float]:
        tokens = max(float(self.tokens.compute()), 1.0)
        nll = float(self.nll_sum.compute()) / tokens
        out = {
            f"{prefix}/loss": float(self.loss_sum.compute()) / tokens,
            f"{prefix}/nll": nll,
            f"{prefix}/ppl": math.exp(min(nll, 50.0)),
            f"{prefix}/bpb": float(self.nll_sum.compute()) / math.log(2) / max(float(self.bytes.compute()), 1.0),
        }
        if self.generated:
            out[f"{prefix}/bleu"] = 100.0 * float(self.bleu.compute())
            out[f"{prefix}/bleu_lc"] = 100.0 * float(self.bleu_lc.compute())
            out[f"{prefix}/chrf"] = 100.0 * float(self.chrf.compute())
            out[f"{prefix}/exact_match"] = 100.0 * float(self.exact_match.compute())
            out[f"{prefix}/gen_tokens_per_s"] = float(self.gen_tokens.compute()) / max(
                float(self.gen_seconds.compute()), 1e-9
            )
            if float(self.gen_positions.compute()) > 0:  # calls were counted (not by every caller)
                out[f"{prefix}/nfe_per_token"] = float(self.gen_calls.compute()) / float(self.gen_positions.compute())
        return out

    def reset(self) -> None:
        for child in self.children():
            child.reset()
        self.generated = False
