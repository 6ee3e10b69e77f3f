"""The evaluation loop every family shares: likelihood and generation metrics, examples, predictions.

A mixin of FamilyModule, kept apart so the base class reads as the family contract and its
training step; these hooks use only that contract (`loss_terms`, `generate_ids`).
"""
from __future__ import annotations

import time

import torch

from attnlab.errors import ConfigError
from attnlab.generation.model_calls import CallCounter
from attnlab.families.metric_keys import GENERATION_METRICS, LIKELIHOOD_METRICS
from attnlab.families.metrics import EvalMetrics, example_record
from attnlab.models.framing import is_plain_lm


class EvaluationSteps:
    """validation / test / predict steps over the family contract."""

    def validation_metrics(self, generates: bool) -> list[str]:
        """The keys every validation logs; `generates`: the data has sources to generate from."""
        names = LIKELIHOOD_METRICS + (GENERATION_METRICS if generates and self.eval_every_n_epochs else ())
        return [f"val/{name}" for name in names]

    def check_monitor(self, key: str, datamodule=None) -> None:
        """Fail before training on a monitor (run.monitor) that no validation of this run logs."""
        val = datamodule.examples("val") if datamodule is not None else []
        known = self.validation_metrics(generates=not val or bool(val[0].source))
        if key not in known:
            raise ConfigError(f"run.monitor={key!r} is never logged by this {type(self).__name__} run: choose one "
                              f"of {', '.join(known)}")
        if key.rsplit("/", 1)[-1] in GENERATION_METRICS and self.eval_every_n_epochs != 1:
            raise ConfigError(f"run.monitor={key!r} is a generation metric, logged only every "
                              f"model.init_args.eval_every_n_epochs={self.eval_every_n_epochs} epochs: set "
                              "--model.init_args.eval_every_n_epochs 1 to choose checkpoints by it")

    def reset_eval_noise(self) -> None:
        """Make the next evaluation draw the same noise as the last one (stochastic families)."""

    def _evaluate(self, batch, metrics: EvalMetrics, generate: bool):
        """Likelihood of every counted row (a distributed sampler's padding rows are not counted),
        generation metrics, and the per-example records `attnlab test` and `validate` save."""
        terms = self.loss_terms(batch)
        n_rows = len(batch["target_text"])
        counted = batch.get("counted")
        keep = counted.tolist() if counted is not None else [True] * n_rows
        kept = [i for i, k in enumerate(keep) if k]
        rows = torch.tensor(kept, dtype=torch.long, device=terms.nll.device)
        n_bytes = torch.tensor([len(t.encode("utf-8")) for t in batch["target_text"]], device=terms.nll.device)
        metrics.update_likelihood(terms.loss[rows], terms.nll[rows], terms.targets[rows], n_bytes[rows])
        hypotheses = None
        if generate and self.tokenizer is not None and not is_plain_lm(batch):
            started = time.perf_counter()
            with self._eager_generation(), CallCounter(self.decoding_stack()) as calls:
                ids = self.generate_ids(batch)
            seconds = time.perf_counter() - started
            hypotheses = self.tokenizer.decode_batch(ids)
            lengths = self._output_lengths(batch, ids)
            # Throughput counts every generated row (padding rows cost time too); quality, counted rows.
            metrics.update_generation([hypotheses[i] for i in kept], [batch["target_text"][i] for i in kept],
                                      sum(lengths), seconds, calls=calls.calls, positions=max(lengths, default=0))
            if len(self.examples) < self.num_examples:
                self.examples.extend(zip(batch["source_text"], batch["target_text"], hypotheses))
        if self.trainer.state.fn in ("test", "validate"):
            start = len(self.example_records)
            index = batch["index"].tolist() if "index" in batch else range(start, start + n_rows)
            nll, tokens = terms.nll.tolist(), terms.targets.tolist()
            for i, (position, k) in enumerate(zip(index, keep)):
                if k:
                    self.example_records.append(example_record(
                        position, batch["source_text"][i], batch["target_text"][i],
                        None if hypotheses is None else hypotheses[i], nll[i], tokens[i], int(n_bytes[i])))

    def _output_lengths(self, batch, ids) -> list[int]:
        """Tokens each row generated: its eos only when it stopped before its budget (`ids` hold no
        eos, and a row that used its whole budget produced none). Their sum is what generation
        throughput counts; their max, what NFE per token divides by (an AR batch takes exactly
        that many calls)."""
        budgets = self.max_output_length(batch["source_lengths"]).tolist()
        return [len(row) + (len(row) < budget) for row, budget in zip(ids, budgets)]

    def on_validation_epoch_start(self):
        self.examples, self.example_records = [], []

    def validation_step(self, batch, batch_idx):
        generate = not self.trainer.sanity_checking and (self._generation_epoch() or self.trainer.state.fn == "validate")
        self._evaluate(batch, self.val_metrics, generate)

    def _generation_epoch(self) -> bool:
        """Whether this epoch's validation generates: every eval_every_n_epochs, and the run's last
        (the last epoch by max_epochs, or the step that reaches max_steps; -1 limits nothing)."""
        trainer = self.trainer
        epoch, max_epochs, max_steps = self.current_epoch + 1, trainer.max_epochs, trainer.max_steps
        last = (max_epochs is not None and 0 < max_epochs <= epoch) or (
            max_steps is not None and 0 < max_steps <= trainer.global_step)
        every = self.eval_every_n_epochs
        return bool(every) and (epoch % every == 0 or last)

    def on_validation_epoch_end(self):
        # compute() already reduces the metric states over ranks, so every rank holds the same
        # values; sync_dist averages identical numbers (a no-op) and tells Lightning they are global.
        self.log_dict(self.val_metrics.compute("val"), batch_size=1, sync_dist=True)
        self.val_metrics.reset()

    def on_test_epoch_start(self):
        self.examples, self.example_records = [], []

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, self.test_metrics, generate=True)

    def on_test_epoch_end(self):
        self.log_dict(self.test_metrics.compute("test"), batch_size=1, sync_dist=True)
        self.test_metrics.reset()

    def predict_step(self, batch, batch_idx):
        """Rows for predictions.jsonl; a distributed sampler's padding rows are dropped, and `index`
        lets the CLI put every rank's rows back in the split's order."""
        with self._eager_generation():
            hypotheses = self.tokenizer.decode_batch(self.generate_ids(batch))
        n = len(hypotheses)
        index = batch["index"].tolist() if "index" in batch else list(range(n))
        keep = batch["counted"].tolist() if "counted" in batch else [True] * n
        return [
            {"index": i, "source": s, "reference": r, "hypothesis": h}
            for i, k, s, r, h in zip(index, keep, batch["source_text"], batch["target_text"], hypotheses) if k
        ]
