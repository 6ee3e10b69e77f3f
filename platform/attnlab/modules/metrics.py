"""Evaluation metrics every family reports under the same keys, synchronised across ranks.

Sums (not means) are kept as states so that DDP synchronisation is exact.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torchmetrics import Metric, SumMetric
from torchmetrics.text import CHRFScore, SacreBLEUScore


class ExactMatch(Metric):
    full_state_update = False

    def __init__(self):
        super().__init__()
        self.add_state("correct", torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, predictions: list[str], references: list[str]) -> None:
        self.correct += sum(p.strip() == r.strip() for p, r in zip(predictions, references))
        self.total += len(references)

    def compute(self) -> torch.Tensor:
        return self.correct / self.total.clamp(min=1)


class EvalMetrics(nn.Module):
    """Likelihood sums, generation quality (cased detokenized sacreBLEU 13a, chrF) and speed."""

    def __init__(self):
        super().__init__()
        self.bleu = SacreBLEUScore(tokenize="13a")
        self.bleu_lc = SacreBLEUScore(tokenize="13a", lowercase=True)  # secondary, as older papers report
        self.chrf = CHRFScore(n_word_order=0)
        self.exact_match = ExactMatch()
        # A NaN loss must surface as val/nll = nan (never selected as best): torchmetrics' default
        # drops NaN values with a warning, which turned a diverged model into val/nll = 0.
        for name in ("loss_sum", "nll_sum"):
            setattr(self, name, SumMetric(nan_strategy="disable"))
        for name in ("tokens", "gen_tokens", "gen_seconds"):
            setattr(self, name, SumMetric())
        self.generated = False

    def update_likelihood(self, loss_sum: torch.Tensor, nll_sum: torch.Tensor, tokens: int) -> None:
        self.loss_sum.update(loss_sum.detach().float())
        self.nll_sum.update(nll_sum.detach().float())
        self.tokens.update(float(tokens))

    def update_generation(self, hypotheses: list[str], references: list[str], n_tokens: int, seconds: float):
        self.bleu.update(hypotheses, [[r] for r in references])
        self.bleu_lc.update(hypotheses, [[r] for r in references])
        self.chrf.update(hypotheses, [[r] for r in references])
        self.exact_match.update(hypotheses, references)
        self.gen_tokens.update(float(n_tokens))
        self.gen_seconds.update(seconds)
        self.generated = True

    def compute(self, prefix: str) -> dict[str, float]:
        tokens = max(float(self.tokens.compute()), 1.0)
        nll = float(self.nll_sum.compute()) / tokens
        out = {
            f"{prefix}/loss": float(self.loss_sum.compute()) / tokens,
            f"{prefix}/nll": nll,
            f"{prefix}/ppl": math.exp(min(nll, 50.0)),
        }
        if self.generated:
            out[f"{prefix}/bleu"] = 100.0 * float(self.bleu.compute())
            out[f"{prefix}/bleu_lc"] = 100.0 * float(self.bleu_lc.compute())
            out[f"{prefix}/chrf"] = 100.0 * float(self.chrf.compute())
            out[f"{prefix}/exact_match"] = 100.0 * float(self.exact_match.compute())
            out[f"{prefix}/gen_tokens_per_s"] = float(self.gen_tokens.compute()) / max(
                float(self.gen_seconds.compute()), 1e-9
            )
        return out

    def reset(self) -> None:
        for child in self.children():
            child.reset()
        self.generated = False
