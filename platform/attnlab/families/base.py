"""The family contract and the training loop every family shares.

A family subclasses FamilyModule, builds its nn.Module in `__init__` and implements the abstract
methods below; optimizer, schedule, training step, compilation, checkpoint metadata and the
evaluation loop (`EvaluationSteps`) come from here and use nothing else of the family.
"""
from __future__ import annotations

import contextlib
import functools
import math
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, replace

import lightning as L
import torch

from attnlab.checkpoints.checks import check_fits
from attnlab.components import BackboneConfig
from attnlab.errors import ConfigError
from attnlab.families.evaluation import EvaluationSteps
from attnlab.families.metrics import EvalMetrics
from attnlab.families.optim import OptimizerConfig, build_optimizer
from attnlab.generation import SamplingConfig
from attnlab.models.losses import LossTerms
from attnlab.training.flops import FlopCounter
from attnlab.training.mfu import MFU
from data_modules.batch import Example, SpecialIds, collate

# What every family states about itself, each True or False: checked when it is registered, and
# recorded in each run's summary.json for the report.
CAPABILITIES = ("autoregressive", "nll_is_bound", "encodes_source")


def _coerce(cls, value):
    """A private copy of a config given as a dataclass (CLI), a dict (checkpoint) or None."""
    if value is None:
        return cls()
    return replace(value) if isinstance(value, cls) else cls(**value)


class FamilyModule(EvaluationSteps, L.LightningModule, ABC):
    family: str  # the name checkpoints record and the registry (families/registry.py) keys
    # What code outside the family asks of it instead of its name (register_family checks them):
    autoregressive: bool  # each target token predicted from those before it (the report: AR vs non-AR)
    nll_is_bound: bool  # val/nll is an upper bound on the NLL (a NELBO), not the NLL itself
    encodes_source: bool  # the source runs through an encoder of its own (the bench: encoder-decoder shapes)
    causal_lm = False  # `model(tokens)` gives every position's next-token logits: it can score text
    block_size = 1  # tokens a decoding step settles together (one: token by token)
    compile_backend = "inductor"  # what `compile` uses (tests may swap in a cheaper one)
    verifies_drafts = False  # decodes by draft-and-verify with `generation.verify` (a model with an AR view)

    @classmethod
    def traits(cls) -> dict[str, bool]:
        """What the family says it is, as a run's summary.json records it for the report."""
        return {name: getattr(cls, name) for name in CAPABILITIES}

    def check_generation(self) -> None:
        """Generation settings the family cannot decode with, refused in one line (at setup, and by
        `attnlab generate` after its options change them)."""
        if self.sampling.verify and not self.verifies_drafts:
            raise ConfigError(f"generation.verify is draft-and-verify decoding of BlockDiffusion (with shift true and "
                              f"context causal); {type(self).__name__} has no drafts to verify: set it false")

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

        compile: torch.compile the transformer stacks when a Trainer runs (see `compile_stacks`);
        it pays on a GPU. Weights and checkpoints are the same either way.
        """
        super().__init__()
        self.backbone = _coerce(BackboneConfig, backbone)
        self.optim = _coerce(OptimizerConfig, optimizer)
        self.sampling = _coerce(SamplingConfig, generation)
        if not self.verifies_drafts:
            FamilyModule.check_generation(self)
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
        self.checkpoint_checked = False  # set once a checkpoint about to load was checked to fit
        self.run_config: dict | None = None  # the fit's config fingerprint, saved in its checkpoints (the CLI sets it)
        # Plain dicts only, so checkpoints load with torch.load(weights_only=True).
        self.save_hyperparameters({
            "backbone": asdict(self.backbone), "optimizer": asdict(self.optim),
            "generation": asdict(self.sampling), "vocab_size": vocab_size,
            "special_ids": asdict(self.special), "eval_every_n_epochs": eval_every_n_epochs,
            "num_examples": num_examples, "compile": compile,
        })
        self.val_metrics, self.test_metrics = EvalMetrics(), EvalMetrics()
        self.examples: list[tuple[str, str, str]] = []
        self.example_records: list[dict] = []  # per-example values of a test / validate run (attnlab.training.per_example)
        self.tokenizer = None  # set from the data module at setup, or from a checkpoint
        self.plain_lm = False  # trained on plain text (no sources): generation continues text

    # ---- what a family provides ------------------------------------------------------------------
    @abstractmethod
    def loss_terms(self, batch: dict) -> LossTerms:
        """Per-row training loss and NLL sums, target tokens per row, and the input tokens."""

    @abstractmethod
    def generate_ids(self, batch: dict) -> list[list[int]]:
        """Generated token ids per row (without eos), within each row's `max_output_length`."""

    @abstractmethod
    def positions_needed(self, source_length: int, target_length: int) -> int:
        """Longest position index + 1 that training and generation use for one example."""

    @abstractmethod
    def attention_stacks(self) -> dict:
        """The TransformerStacks by name, so head ablation can name modules `decoder.0.self`."""

    @abstractmethod
    def attention_weights(self, example: Example) -> list:
        """Teacher-forced attention of one example, one AttentionMap per attention kind."""

    def expected_flops(self, batch: dict) -> float:
        """The training FLOPs `loss_terms` counts for this batch (their expectation where it draws
        noise), from the framing alone: what a `run.budget` of FLOPs divides by (attnlab.training.ledger)."""
        raise ConfigError(f"{type(self).__name__} does not say what a training step costs (expected_flops), "
                          "which a run.budget of flops, tokens or epochs needs")

    # ---- what the FLOPs counter, the bench and sample quality ask of a family ---------------------
    @classmethod
    def count_flops(cls, model, vocab: int) -> FlopCounter:
        """The FlopCounter of this family's network `model`: every position runs through
        `model.stack` (a family with an encoder passes it too)."""
        return FlopCounter(model.stack, vocab)

    @classmethod
    def flops_per_token(cls, model, vocab: int, source_len: int, target_len: int,
                        masked_fraction: float = 0.5) -> float:
        """Training FLOPs per target token of one row of `target_len` tokens (after `source_len`
        source tokens where the family encodes a source), every position projected: the bench's
        rows, which have no prompt. `masked_fraction`: the share a denoiser projects."""
        return cls.count_flops(model, vocab).step(1, target_len, target_len) / target_len

    def sample_decodings(self, steps: list[int], thresholds: list[float], unmasking: str) -> list[dict]:
        """The decodings `continue_ids` takes, for sample quality's sweep over model calls (`steps`
        per block, adaptive `thresholds`, an `unmasking` rule where the family has them); none: it
        cannot continue plain text."""
        return []

    def continue_ids(self, prompts: list[list[int]], setting: dict, **common) -> list[list[int]]:
        """Continuations of each prompt under one of `sample_decodings`; `common`: the generator's
        keywords (max_new_tokens, eos_id, pad_id, sampling, generator, compiled)."""
        raise ConfigError(f"{type(self).__name__} cannot continue text from a prompt")

    @classmethod
    def bench_arguments(cls, block_size: int) -> dict:
        """Constructor arguments the bench gives this family beyond the backbone: none here; a
        family that settles blocks takes the bench shape's `block_size`."""
        return {}

    def bench_decodings(self, batch: dict, new: int, beam: int, eos_id: int) -> dict:
        """The bench's decodings: name -> make(compiled) -> a call that generates `new` tokens
        after each row's source in `batch` (a schema batch; `eos_id` never stops a row), whose
        model calls `decoding_stack()` counts. Beam rows are named `beam<beam>`."""
        return {}

    def max_output_length(self, source_length):
        """Most tokens to generate: generation.max_new_tokens, else the paper's source length + 50;
        an int, or one budget per row for a tensor of source lengths."""
        configured = self.sampling.max_new_tokens
        if configured is None:
            return source_length + 50
        return torch.full_like(source_length, configured) if torch.is_tensor(source_length) else configured

    # ---- training ----------------------------------------------------------------------------------
    @functools.cached_property
    def flop_counter(self) -> FlopCounter:
        """Counts each training step's FLOPs (for train/mfu); built from the layer shapes before a
        strategy wraps or shards them (`setup` touches it)."""
        return type(self).count_flops(self.model, self.vocab_size)

    def setup(self, stage: str) -> None:
        self.flop_counter  # noqa: B018 (before FSDP shards the weights it counts)
        self.compile_stacks()
        try:
            datamodule = getattr(self.trainer, "datamodule", None)
        except RuntimeError:  # not attached to a Trainer
            datamodule = None
        if datamodule is not None and getattr(datamodule, "tokenizer", None) is not None:
            self.tokenizer = datamodule.tokenizer
            self.check_position_table(datamodule)
            train = datamodule.examples("train") if "train" in datamodule.splits else []
            self.plain_lm = bool(train) and not train[0].source

    def check_position_table(self, datamodule) -> None:
        """Fail before training, not at the first generation, when data outgrows the learned table."""
        if all(stack.positional.max_positions is None for stack in self.attention_stacks().values()):
            return  # an encoding without a table: any position exists
        limit = self.backbone.max_positions
        needs = [(self.positions_needed(source, target), split, source, target)
                 for split in datamodule.splits for source, target in datamodule.example_lengths(split)]
        if not needs:
            return
        need, split, source, target = max(needs)  # the most any example needs, so the fix suggested suffices
        if need > limit:
            raise ConfigError(
                f"a {split} example needs {need} positions (source {source} and "
                f"target {target} tokens, plus generation) but the learned table has "
                f"backbone.max_positions={limit}: raise backbone.max_positions to at least {need}, "
                "lower generation.max_new_tokens, or use another positional encoding"
            )

    def compile_stacks(self) -> None:
        """With `compile`, torch.compile every transformer stack, once, in place (at `setup`, not
        in `configure_model`, which Lightning reserves for building sharded layers).

        In place (nn.Module.compile), so state-dict keys stay clean and a checkpoint loads into an
        eager model; the stacks, because every family path goes through their forward. `dynamic`:
        batches vary in length. Generation runs these stacks eagerly (`_eager_generation`): a decoding
        call is compiled whole, with its mask and cache writes, by `generation.compile`.
        """
        if self.compile_model and not self._compiled:
            for stack in self.attention_stacks().values():
                stack.compile(dynamic=True, backend=self.compile_backend)
            self._compiled = True

    def decoding_stack(self):
        """The stack whose forward calls are the model calls (NFE) of generation."""
        return self.model.stack

    def _eager_generation(self):
        """A context in which compiled stacks run as plain eager modules (see `compile_stacks`)."""
        return torch.compiler.set_stance("force_eager") if self._compiled else contextlib.nullcontext()

    def configure_optimizers(self):
        return build_optimizer(self, self.optim, self.schedule_horizon, self.backbone.d_model)

    def schedule_horizon(self) -> int:
        """The optimizer steps the schedule spans (0: unknown, as with a time budget): the trainer's
        estimate, read at every step, so the decay ends where a budget moves the last step."""
        steps = self.trainer.estimated_stepping_batches
        return int(steps) if math.isfinite(steps) else 0

    def cost_key(self) -> tuple:
        """What `expected_flops` depends on besides the batch shapes (block diffusion: its noise
        range): a budget recomputes a step's cost when it changes."""
        return ()

    def on_train_start(self) -> None:
        self._mfu = MFU.for_device(self.device, str(self.trainer.precision))

    def on_train_batch_start(self, batch, batch_idx):
        self._step_started = time.perf_counter()

    def training_step(self, batch, batch_idx):
        terms = self.loss_terms(batch)
        loss_sum, n_targets = terms.loss.sum(), terms.targets.sum().to(terms.loss.dtype)
        world = self.trainer.world_size
        if world > 1:
            # Normalise by the global batch's token count, as one process holding it would: the
            # strategy averages gradients over ranks, so each rank scales its sum by world / global
            # tokens (fairseq's rule; per-rank means would weight ranks equally).
            totals = self.trainer.strategy.reduce(torch.stack([loss_sum.detach(), n_targets]), reduce_op="sum")
            loss = loss_sum * world / totals[1].clamp(min=1)
            logged = totals[0] / totals[1].clamp(min=1)
        else:
            loss = logged = loss_sum / n_targets.clamp(min=1)
        self._step_tokens, self.step_flops = terms.inputs, terms.flops  # step_flops: also the BudgetLedger's
        self.log("train/loss", logged, prog_bar=True, batch_size=len(batch["target"]))
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        """Throughput of this rank's step: train/tokens_per_s, train/tflops and train/mfu
        (= tokens/s × FLOPs per token / the device's peak)."""
        seconds = max(time.perf_counter() - self._step_started, 1e-9)
        flops_per_s = self.step_flops / seconds
        self.log("train/tokens_per_s", self._step_tokens / seconds, batch_size=1)
        self.log("train/tflops", flops_per_s / 1e12, batch_size=1)
        self.log("train/mfu", self._mfu(flops_per_s), batch_size=1)

    # ---- checkpoints -------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["attnlab"] = {
            "family": self.family,
            "tokenizer": self.tokenizer.model_proto if self.tokenizer is not None else None,
            "plain_lm": self.plain_lm,
        }
        if self.run_config is not None:  # what a resume must share with this run (attnlab.training.config_fingerprint)
            checkpoint["attnlab"]["config"] = self.run_config

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """A checkpoint loaded by a Trainer outside the CLI (which checks before it writes anything)."""
        if not self.checkpoint_checked:
            check_fits(self, checkpoint, "the checkpoint", shapes=False)
        self.checkpoint_checked = False

    # ---- direct use --------------------------------------------------------------------------------
    def collate_on_device(self, examples: list[Example]) -> dict:
        """A schema batch of `examples` with its tensors on the module's device."""
        batch = collate(examples, self.special.pad)
        return {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in batch.items()}

    @torch.no_grad()
    def translate(self, sources: list[str], batch_size: int = 64) -> list[str]:
        """Generate for each string (needs the tokenizer): its translation, or for a model trained
        on plain text (`plain_lm`) its continuation."""
        was_training = self.training
        self.eval()
        out = []
        for start in range(0, len(sources), batch_size):
            chunk = sources[start : start + batch_size]
            encoded = self.tokenizer.encode_batch(chunk)
            examples = [Example([], ids, "", text) if self.plain_lm else Example(ids, [], text, "")
                        for ids, text in zip(encoded, chunk)]
            batch = self.collate_on_device(examples)
            with self._eager_generation():
                out.extend(self.tokenizer.decode_batch(self.generate_ids(batch)))
        self.train(was_training)
        return out
