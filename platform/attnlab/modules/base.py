"""What every family's LightningModule shares: optimizer, schedule, metrics, logging, evaluation.

A family subclass builds its nn.Module and implements three things: `loss_terms` (per-row
training loss and NLL on a batch), `generate_ids` (hypotheses for a batch) and `family` (its name);
`attention_weights` (one example's attention, for maps) is what attention maps need.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, replace
from typing import NamedTuple

import lightning as L
import torch

from attnlab.components import BackboneConfig
from attnlab.errors import ConfigError
from attnlab.generation import SamplingConfig
from attnlab.modules.metrics import GENERATION_METRICS, LIKELIHOOD_METRICS, EvalMetrics, example_record
from attnlab.modules.optim import OptimizerConfig, build_optimizer
from data_modules.batch import SpecialIds, collate, Example


def _coerce(cls, value):
    """A private copy of a config given as a dataclass (CLI), a dict (checkpoint) or None."""
    if value is None:
        return cls()
    return replace(value) if isinstance(value, cls) else cls(**value)


def token_losses(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float, excluded: int | None = None):
    """Per-token training loss (label-smoothed) and NLL, each (N,).

    One log-softmax serves both (the vocabulary-wide softmax is a large share of a CPU step):
    smoothed = (1 - eps) * nll + eps * mean over the vocabulary of -log p, as in torch's
    cross_entropy(label_smoothing=eps). An `excluded` token (block diffusion's mask, whose
    logit is -inf) is left out of the smoothing mean.
    """
    log_probs = logits.log_softmax(dim=-1)
    nll = -log_probs.gather(1, labels[:, None]).squeeze(1)
    if not label_smoothing:
        return nll, nll
    if excluded is None:
        uniform = -log_probs.mean(dim=-1)
    else:
        uniform = -log_probs.index_fill(-1, torch.tensor([excluded], device=logits.device), 0.0).sum(-1)
        uniform = uniform / (logits.shape[-1] - 1)
    return (1 - label_smoothing) * nll + label_smoothing * uniform, nll


def row_sums(rows: torch.Tensor, n_rows: int, *values: torch.Tensor) -> list[torch.Tensor]:
    """Per-row sums (n_rows,) of per-token values, given each token's row: one index_add for all."""
    out = values[0].new_zeros(n_rows, len(values))
    out.index_add_(0, rows, torch.stack(values, dim=1))
    return list(out.unbind(1))


def target_losses(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float, labelled: torch.Tensor):
    """Per-row training loss (label-smoothed) and NLL sums (B,) over the `labelled` positions of a
    (B, L) layout, from the logits of those positions (N, V) and their labels (N,)."""
    smoothed, nll = token_losses(logits, labels, label_smoothing)
    return row_sums(labelled.nonzero()[:, 0], len(labelled), smoothed, nll)


class LossTerms(NamedTuple):
    """What a family's loss gives per batch: per-row sums, so evaluation can count every example
    once (see `counted` in the batch) and save per-example likelihoods.

    loss: training objective sums (B,); nll: negative log-likelihood sums in nats (B,) (a bound
    for block diffusion); targets: target tokens per row (B,); inputs: tokens fed to the model.
    """

    loss: torch.Tensor
    nll: torch.Tensor
    targets: torch.Tensor
    inputs: int


class AttentionMap(NamedTuple):
    """One figure's worth of attention: weights (layers, heads, Lq, Lk) and the token labels."""

    kind: str
    weights: torch.Tensor
    queries: list[str]
    keys: list[str]


class FamilyModule(L.LightningModule):
    family = "base"
    compile_backend = "inductor"  # what `compile` uses (tests may swap in a cheaper one)

    def __init__(
        self,
        backbone: BackboneConfig = BackboneConfig(),
        optimizer: OptimizerConfig = OptimizerConfig(),
        generation: SamplingConfig = SamplingConfig(),
        vocab_size: int = 0,
        special_ids: SpecialIds | None = None,
        eval_every_n_epochs: int = 1,
        num_examples: int = 3,
        compile: bool = False,
    ):
        """vocab_size and special_ids are linked from the data module; do not set them in a config.

        compile: torch.compile the transformer stacks when a Trainer runs (see `configure_model`);
        it pays on a GPU. Weights and checkpoints are the same either way.
        """
        super().__init__()
        self.backbone = _coerce(BackboneConfig, backbone)
        self.optim = _coerce(OptimizerConfig, optimizer)
        self.sampling = _coerce(SamplingConfig, generation)
        self.special = _coerce(SpecialIds, special_ids)
        if vocab_size < 1:
            raise ConfigError(
                "model vocab_size is not set: it is linked from the data module's tokenizer "
                "(run through `attnlab fit --config ...`, or pass vocab_size=datamodule.vocab_size)"
            )
        if eval_every_n_epochs < 0:
            raise ConfigError(f"model.eval_every_n_epochs={eval_every_n_epochs} must be >= 0 (0 = never)")
        if not isinstance(compile, bool):
            raise ConfigError(f"model.init_args.compile={compile!r} must be true or false")
        self.vocab_size = vocab_size
        self.eval_every_n_epochs = eval_every_n_epochs
        self.num_examples = num_examples
        self.compile_model = compile  # not `self.compile`: that is nn.Module.compile
        self._compiled = False
        # Plain dicts only, so checkpoints load with torch.load(weights_only=True).
        self.save_hyperparameters({
            "backbone": asdict(self.backbone), "optimizer": asdict(self.optim),
            "generation": asdict(self.sampling), "vocab_size": vocab_size,
            "special_ids": asdict(self.special), "eval_every_n_epochs": eval_every_n_epochs,
            "num_examples": num_examples, "compile": compile,
        })
        self.val_metrics, self.test_metrics = EvalMetrics(), EvalMetrics()
        self.examples: list[tuple[str, str, str]] = []
        self.example_records: list[dict] = []  # per-example values of a test / validate run (see attnlab.per_example)
        self.tokenizer = None  # set from the data module at setup, or from a checkpoint

    # ---- what a family provides -------------------------------------------------------------
    def loss_terms(self, batch: dict) -> LossTerms:
        """Per-row training loss and NLL sums, target tokens per row, and the input tokens."""
        raise NotImplementedError

    def generate_ids(self, batch: dict) -> list[list[int]]:
        raise NotImplementedError

    def positions_needed(self, source_length: int, target_length: int) -> int:
        """Longest position index + 1 that training and generation use for one example."""
        raise NotImplementedError

    def attention_weights(self, example: Example) -> list[AttentionMap]:
        """Teacher-forced attention of one example, per attention kind (for maps and tests)."""
        raise NotImplementedError

    def attention_stacks(self) -> dict:
        """The TransformerStacks by name, so head ablation can name modules `decoder.0.self`."""
        return {"decoder": self.model.stack}

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

    def max_output_length(self, source_length):
        """Most tokens to generate: generation.max_new_tokens, else the paper's source length + 50.

        Works on an int or on a tensor of source lengths (one budget per row).
        """
        configured = self.sampling.max_new_tokens
        if configured is None:
            return source_length + 50
        return torch.full_like(source_length, configured) if torch.is_tensor(source_length) else configured

    # ---- Lightning hooks ---------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
        if datamodule is not None and getattr(datamodule, "tokenizer", None) is not None:
            self.tokenizer = datamodule.tokenizer
            if self.backbone.positional == "learned":
                self._check_position_table(datamodule)

    def configure_model(self) -> None:
        """With `compile`, torch.compile every transformer stack, once, in place.

        In place (nn.Module.compile), so state-dict keys stay clean (no `_orig_mod.`) and a
        checkpoint loads into an eager model. The stacks, not `self.model`: the families call the
        model's methods (hidden, encode, decode, denoise), never its forward, while every path
        goes through the stacks' forward. `dynamic=True`: batches vary in length (and block
        diffusion in padding), so shapes are symbolic from the first compile instead of one graph
        per length. Training and validation losses run compiled; generation runs eagerly
        (`_eager_generation`): its incremental calls with growing caches would be a new graph at
        nearly every step, for kernels too small to gain from compiling.
        """
        if self.compile_model and not self._compiled:
            for stack in self.attention_stacks().values():
                stack.compile(dynamic=True, backend=self.compile_backend)
            self._compiled = True

    def _eager_generation(self):
        """A context in which compiled stacks run as plain eager modules (see `configure_model`)."""
        return torch.compiler.set_stance("force_eager") if self._compiled else contextlib.nullcontext()

    def _check_position_table(self, datamodule) -> None:
        """Fail before training, not at the first generation, when data outgrows the learned table."""
        limit = self.backbone.max_positions
        for split in datamodule.splits:
            for example in datamodule.examples(split):
                need = self.positions_needed(len(example.source), len(example.target))
                if need > limit:
                    raise ConfigError(
                        f"a {split} example needs {need} positions (source {len(example.source)} and "
                        f"target {len(example.target)} tokens, plus generation) but the learned table has "
                        f"backbone.max_positions={limit}: raise backbone.max_positions to at least {need}, "
                        "lower generation.max_new_tokens, or use another positional encoding"
                    )

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        family = (checkpoint.get("attnlab") or {}).get("family")
        if family != self.family:
            raise ConfigError(
                f"the checkpoint holds a {family or 'non-attnlab'} model but the config builds "
                f"{self.family}: pass the config the checkpoint was trained with"
            )

    def _check_checkpoint_shapes(self, checkpoint: dict, source: str = "the checkpoint") -> None:
        """A checkpoint of this family but another size: name the first differing weight and the
        backbone settings that differ, instead of torch's list of every mismatched tensor.

        Called by the CLI on the unwrapped model before the Trainer exists (not from
        on_load_checkpoint, where FSDP may have sharded the model's own state dict)."""
        saved = checkpoint.get("state_dict")
        if not isinstance(saved, dict) or not saved:
            return
        own = self.state_dict()
        missing = sorted(set(own) - set(saved))
        unexpected = sorted(set(saved) - set(own))
        wrong = [k for k in own if k in saved and hasattr(saved[k], "shape") and tuple(saved[k].shape) != tuple(own[k].shape)]
        if not (missing or unexpected or wrong):
            return
        theirs = (checkpoint.get("hyper_parameters") or {}).get("backbone") or {}
        ours = asdict(self.backbone)
        differ = ", ".join(f"backbone.{k}: checkpoint {theirs[k]!r}, config {ours[k]!r}"
                           for k in ours if k in theirs and theirs[k] != ours[k])
        if wrong:
            k = wrong[0]
            first = f"{k} has shape {tuple(saved[k].shape)} in the checkpoint but {tuple(own[k].shape)} in the model"
        else:
            first = f"weights {', '.join((missing or unexpected)[:3])} are {'missing from' if missing else 'unexpected in'} the checkpoint"
        raise ConfigError(
            f"{source} does not fit the model the config builds ({first}"
            + (f"; {differ}" if differ else "") + "): pass the config the checkpoint was trained with"
        )

    def configure_optimizers(self):
        total = int(self.trainer.estimated_stepping_batches) if self.optim.schedule == "cosine" else 0
        return build_optimizer(self, self.optim, total, self.backbone.d_model)

    def on_train_batch_start(self, batch, batch_idx):
        self._step_started = time.perf_counter()

    def training_step(self, batch, batch_idx):
        terms = self.loss_terms(batch)
        loss_sum, n_targets = terms.loss.sum(), terms.targets.sum().to(terms.loss.dtype)
        world = self.trainer.world_size
        if world > 1:
            # Normalise by the token count of the whole global batch, as one process holding it
            # would: the strategy averages gradients over ranks, so each rank scales its sum by
            # world / global tokens (fairseq's rule; per-rank means would weight ranks equally).
            totals = self.trainer.strategy.reduce(torch.stack([loss_sum.detach(), n_targets]), reduce_op="sum")
            loss = loss_sum * world / totals[1].clamp(min=1)
            logged = totals[0] / totals[1].clamp(min=1)
        else:
            loss = logged = loss_sum / n_targets.clamp(min=1)
        self._step_tokens = terms.inputs
        self.log("train/loss", logged, prog_bar=True, batch_size=len(batch["target"]))
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        seconds = time.perf_counter() - self._step_started
        self.log("train/tokens_per_s", self._step_tokens / max(seconds, 1e-9), batch_size=1)

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
        if generate and self.tokenizer is not None and batch["source"].shape[1] > 0:
            started = time.perf_counter()
            with self._eager_generation():
                ids = self.generate_ids(batch)
            seconds = time.perf_counter() - started
            hypotheses = self.tokenizer.decode_batch(ids)
            # Throughput counts every generated row (padding rows cost time too); quality, counted rows.
            metrics.update_generation([hypotheses[i] for i in kept], [batch["target_text"][i] for i in kept],
                                      sum(len(i) + 1 for i in ids), seconds)
            if len(self.examples) < self.num_examples:
                self.examples.extend(zip(batch["source_text"], batch["target_text"], hypotheses))
        if self.trainer.state.fn in ("test", "validate"):
            index = batch["index"].tolist() if "index" in batch else range(len(self.example_records), len(self.example_records) + n_rows)
            nll, tokens = terms.nll.tolist(), terms.targets.tolist()
            for i, (position, k) in enumerate(zip(index, keep)):
                if k:
                    self.example_records.append(example_record(
                        position, batch["source_text"][i], batch["target_text"][i],
                        None if hypotheses is None else hypotheses[i], nll[i], tokens[i], int(n_bytes[i])))

    def on_validation_epoch_start(self):
        self.examples, self.example_records = [], []

    def validation_step(self, batch, batch_idx):
        generate = not self.trainer.sanity_checking and (self._generation_epoch() or self.trainer.state.fn == "validate")
        self._evaluate(batch, self.val_metrics, generate)

    def _generation_epoch(self) -> bool:
        every, epoch = self.eval_every_n_epochs, self.current_epoch + 1
        last = self.trainer.max_epochs is not None and epoch >= self.trainer.max_epochs
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

    # ---- attention maps ------------------------------------------------------------------------
    def collate_on_device(self, examples: list[Example]) -> dict:
        """A schema batch of `examples` with its tensors on the module's device."""
        batch = collate(examples, self.special.pad)
        return {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in batch.items()}

    def _one_example(self, example: Example) -> dict:
        return self.collate_on_device([example])

    def piece_labels(self, ids) -> list[str]:
        """Tick labels: special tokens by name, other pieces as text (ids without a tokenizer)."""
        names = {getattr(self.special, n): f"<{n}>" for n in ("pad", "unk", "bos", "eos", "sep", "mask")}
        ids = ids.tolist() if torch.is_tensor(ids) else list(ids)
        if self.tokenizer is None:
            return [names.get(i, str(i)) for i in ids]
        return [names.get(i) or self.tokenizer.decode([i]).strip() or "▁" for i in ids]

    @staticmethod
    def stack_weights(per_layer: list[dict], kind: str) -> torch.Tensor:
        """(layers, heads, Lq, Lk) float CPU weights of the first row from a stack's per-layer dicts."""
        return torch.stack([layer[kind][0] for layer in per_layer]).float().cpu()

    # ---- checkpoints and direct use ------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["attnlab"] = {
            "family": self.family,
            "tokenizer": self.tokenizer.model_proto if self.tokenizer is not None else None,
        }

    @torch.no_grad()
    def translate(self, sources: list[str], batch_size: int = 64) -> list[str]:
        """Generate a target for each source string (needs the tokenizer)."""
        was_training = self.training
        self.eval()
        out = []
        for start in range(0, len(sources), batch_size):
            chunk = sources[start : start + batch_size]
            encoded = self.tokenizer.encode_batch(chunk)
            batch = self.collate_on_device([Example(ids, [], text, "") for ids, text in zip(encoded, chunk)])
            with self._eager_generation():
                out.extend(self.tokenizer.decode_batch(self.generate_ids(batch)))
        self.train(was_training)
        return out
