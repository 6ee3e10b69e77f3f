"""BlockDiffusion: BD3-LM (Arriola et al., 2025) as a LightningModule.

The prefix `[bos] source [sep]` stays clean; the target is cut into blocks of `block_size`.
Training: one noise level t per block, every target token of the block masked with
probability t, the cross-entropy of masked tokens weighted by 1/t (the NELBO of the
log-linear schedule). `val/nll` is that bound with t over [eval_noise_floor, 1], per target
token. block_size 1 is autoregressive; a block as long as the target is a masked diffusion LM.

The eos fillers that complete the last block are trained on (sampling makes whole blocks, so
the model must learn that eos follows eos) and scored in `nll`, which is then a true upper bound
on the NLL of target and eos (the model's probability of the filled sequence is at most that of
the text; leaving the fillers out would drop terms of a bound while unmasked fillers still
reveal the length), but not counted: nll, ppl and bpb are per token an AR model scores (target
and eos), so they compare with AR's. For converting a DecoderOnly checkpoint, `shift`, `context: causal`,
`ar_loss_weight`, `complementary_masks` and `loss_weighting: uniform` give Fast-dLLM v2's recipe
(docs/guides/families.md).
"""
from __future__ import annotations

from functools import partial

import torch

from attnlab.errors import ConfigError
from attnlab.families.attention_map import AttentionMap, layer_weights, token_labels
from attnlab.families.base import FamilyModule
from attnlab.generation import SamplingConfig
from attnlab.generation.block_diffusion import UNMASKING, sample_blocks
from attnlab.generation.draft_verify import DRAFT_SPAN, DraftStats, draft_and_verify, replayed_drafts
from attnlab.models.block_diffusion import BlockDiffusionModel
from attnlab.models.framing import BlockFrame, frame_blocks, prompts_of
from attnlab.models.losses import LossTerms, row_sums, token_losses
from attnlab.models.masked_diffusion import (
    bd3lms_windows,
    example_noise,
    mask_blocks,
    reachable,
    resample_masks,
    sample_block_times,
)

LOSS_WEIGHTINGS = ("elbo", "uniform")

NOISE_SEARCH_METRICS = ("val/noise_low", "val/noise_high", "val/noise_loss_var")  # logged with noise_search


def _check_range(name: str, value, block_size: int, resample: bool) -> tuple[float, float]:
    low, high = (float(v) for v in value) if len(value) == 2 else (None, None)
    if low is None or not 0.0 < low < high <= 1.0:
        raise ConfigError(f"model.init_args.{name}={list(value)} must be [low, high] with 0 < low < high <= 1")
    if resample and not reachable(low, high, block_size):
        raise ConfigError(f"model.init_args.{name}={list(value)}: no block of {block_size} tokens has a masked "
                          "fraction in that range, so resample would never finish; widen it or set resample: false")
    return low, high


def _noise_candidates(noise_search, block_size: int, resample: bool) -> list[tuple[float, float]]:
    """noise_search's ranges: as listed, or "bd3lms" for bd3lms's own windows (`bd3lms_windows`;
    with resample, those some block can reach)."""
    if noise_search == "bd3lms":
        return [w for w in bd3lms_windows() if not resample or reachable(*w, block_size)]
    if isinstance(noise_search, str):
        raise ConfigError(f"model.init_args.noise_search={noise_search!r} must be a list of [low, high] ranges or "
                          "bd3lms (every window of width 0.5, 0.6, 0.7, 0.8 and 0.9 slid in steps of 0.05, and the full range)")
    return [_check_range("noise_search", c, block_size, resample) for c in (noise_search or [])]


def _check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"model.init_args.{name}={value!r} must be true or false")
    return value


BENCH_STEPS = (1, 2, 4)  # the bench's calls per block (confidence unmasking); those above block_size are left out
BENCH_THRESHOLDS = (0.9, 0.7)  # and its adaptive rows: each call reveals every token at least this probable


class BlockDiffusion(FamilyModule):
    family = "block_diffusion"
    autoregressive, nll_is_bound, encodes_source = False, True, False
    verifies_drafts = True

    def __init__(
        self,
        *args,
        block_size: int = 4,
        denoising_steps: int | None = None,
        unmasking: str = "confidence",
        threshold: float = 0.9,
        noise_range: tuple[float, float] = (1e-3, 1.0),
        noise_search: list[list[float]] | str | None = None,
        eval_noise_floor: float = 1e-3,
        antithetic: bool = True,
        mask_backend: str = "auto",
        resample: bool = False,
        shift: bool = False,
        context: str = "block_causal",
        ar_loss_weight: float = 0.0,
        complementary_masks: bool = False,
        loss_weighting: str = "elbo",
        **kwargs,
    ):
        """noise_range: the training t range [β, ω] (BD3-LM clips it, e.g. [0.5, 1] for block 4).
        noise_search: candidate ranges, or "bd3lms" (bd3lms's: every window of width 0.5, 0.6, 0.7,
        0.8 and 0.9 slid in steps of 0.05, and the full range; 36 validation passes each epoch); each validation epoch
        of `fit` measures, under each, the variance of the per-block mean loss (bd3lms's statistic,
        with `resample` as training draws its masks) and trains on the lowest, logged as
        train/noise_low and train/noise_high at every step.
        resample: BD3-LM's `training.resample`: a block whose masked fraction falls outside the
        training range has its masks drawn again (same t) until it is inside.
        denoising_steps: model calls per block when sampling (default: block_size, one token each);
        with unmasking "threshold" a block takes as many calls as it needs instead: each reveals
        every masked position whose proposal has probability >= `threshold` (at least one);
        "first_hitting" (BD3-LM's sampler) reveals one uniformly chosen masked position per call.
        shift / context: see attnlab.models.block_diffusion (the AR view, for conversions).
        ar_loss_weight: weight of an autoregressive loss on the clean half (needs context causal,
        where clean tokens never see what they predict); 0 trains the NELBO alone.
        complementary_masks: each example twice in the batch, the second with the complementary
        mask, so every target token is trained once (Fast-dLLM v2); needs loss_weighting uniform.
        With `resample` only the first copy is redrawn into the range: the second masks the rest
        of each block (fraction 1 - f), which is what makes the pair complementary.
        ar_loss_weight and complementary_masks shape training only: val/loss and val/nll are the
        bound's.
        loss_weighting: "elbo" weights a masked token's loss by 1/t (the NELBO); "uniform" is plain
        cross-entropy on masked tokens (Fast-dLLM v2). val/nll is the NELBO either way, and so is
        what noise_search measures (the variance of each block's 1/t-weighted loss, as bd3lms).
        """
        super().__init__(*args, **kwargs)
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ConfigError(f"model.init_args.block_size={block_size!r} must be an integer >= 1")
        steps = block_size if denoising_steps is None else denoising_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= block_size:
            raise ConfigError(
                f"model.init_args.denoising_steps={denoising_steps!r} must be an integer from 1 to "
                f"block_size={block_size} (or null: one step per token)"
            )
        if unmasking not in UNMASKING:
            raise ConfigError(f"model.init_args.unmasking={unmasking!r} is not one of {', '.join(UNMASKING)}")
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
            raise ConfigError(f"model.init_args.threshold={threshold!r} must be a probability in [0, 1] "
                              "(0 reveals a whole block in one call, 1 one token per call)")
        if not 0.0 < eval_noise_floor < 1.0:
            raise ConfigError(f"model.init_args.eval_noise_floor={eval_noise_floor} must be in (0, 1)")
        if self.sampling.beam_size != 1:
            raise ConfigError("generation.beam_size must be 1 for BlockDiffusion (it samples whole blocks, not beams)")
        if unmasking == "first_hitting" and denoising_steps not in (None, block_size):
            raise ConfigError(f"model.init_args.denoising_steps={denoising_steps} cannot go with unmasking first_hitting "
                              f"(one token per call: block_size={block_size} calls a block); leave it null")
        if loss_weighting not in LOSS_WEIGHTINGS:
            raise ConfigError(f"model.init_args.loss_weighting={loss_weighting!r} is not one of {', '.join(LOSS_WEIGHTINGS)}")
        if isinstance(ar_loss_weight, bool) or not isinstance(ar_loss_weight, (int, float)) or ar_loss_weight < 0:
            raise ConfigError(f"model.init_args.ar_loss_weight={ar_loss_weight!r} must be a number >= 0 (0: no AR loss)")
        if ar_loss_weight and context != "causal":
            raise ConfigError("model.init_args.ar_loss_weight > 0 needs context: causal (under block_causal a clean "
                              "token sees the rest of its block, the very token the AR loss asks it to predict)")
        if _check_bool("complementary_masks", complementary_masks) and loss_weighting != "uniform":
            raise ConfigError("model.init_args.complementary_masks needs loss_weighting: uniform (the complement is "
                              "masked at 1 - t, whose 1/t weight has no bound as t nears 1)")
        self.resample = _check_bool("resample", resample)
        self.block_size = block_size
        self.noise_candidates = _noise_candidates(noise_search, block_size, resample)
        self.denoising_steps, self.unmasking = steps, unmasking
        self.threshold = float(threshold)
        self.eval_noise_floor, self.antithetic = eval_noise_floor, antithetic
        self.ar_loss_weight, self.complementary_masks = float(ar_loss_weight), complementary_masks
        self.loss_weighting = loss_weighting
        self.hparams.update(
            block_size=block_size, denoising_steps=denoising_steps, unmasking=unmasking, threshold=threshold,
            noise_range=list(noise_range), noise_search=noise_search, eval_noise_floor=eval_noise_floor,
            antithetic=antithetic, mask_backend=mask_backend, resample=resample, shift=shift, context=context,
            ar_loss_weight=ar_loss_weight, complementary_masks=complementary_masks, loss_weighting=loss_weighting,
        )
        # A buffer, so the range chosen by noise_search is saved with the weights and resumed.
        self.register_buffer("train_noise", torch.tensor(_check_range("noise_range", noise_range, block_size, resample)))
        self.model = BlockDiffusionModel(self.backbone, self.vocab_size, self.special.pad, self.special.mask,
                                         mask_backend, shift=_check_bool("shift", shift), context=context)
        self.check_generation()
        self.draft_stats = DraftStats()  # what draft-and-verify's drafts did in this evaluation
        self._eval_noise: torch.Generator | None = None  # created, seeded 0, at first use in each evaluation
        self._variance_stats: dict[int, list[float]] = {}

    def check_generation(self) -> None:
        if self.sampling.verify and not (self.model.shift and self.model.causal):
            raise ConfigError("generation.verify needs model.init_args.shift true and context causal (the AR view "
                              "that checks the drafts: a model converted from DecoderOnly has it); set verify false")

    # ---- the NELBO --------------------------------------------------------------------------------
    def _frame(self, batch: dict) -> BlockFrame:
        ids = self.special
        return frame_blocks(batch, ids.bos, ids.sep, ids.eos, ids.pad, self.block_size)

    def _generator(self, device) -> torch.Generator | None:
        """Evaluation without example indices (direct calls, head ablation) draws its noise from a
        generator reseeded every epoch; batches from a data module use each example's own seed
        (`example_noise`). Either way val/nll compares across epochs and checkpoints. Training
        uses the global stream (seed_everything)."""
        if self.training:
            return None
        if self._eval_noise is None or self._eval_noise.device != device:
            self._eval_noise = torch.Generator(device).manual_seed(0)
        return self._eval_noise

    def nelbo_terms(self, frame: BlockFrame, low: float, high: float, generator=None, t=None, seeds=None,
                    per_token: bool = False, resample: bool | None = None):
        """Per-row weighted training loss and NLL sums (B,) under t ~ U[low, high] per block
        (or the given (B, n_blocks) t); `seeds` (evaluation): each row's noise from its own seed.
        `per_token`: also the (B, Ln) 1/t-weighted (NELBO) loss of every target position, 0 where
        unmasked, whatever `loss_weighting` trains with. `resample`: redraw masks outside [low,
        high] (default: when training with `resample`; noise_search's statistic asks for it).

        Training adds what the options ask: resampled masks, a complementary copy of each row,
        the AR loss on the clean half. The NLL scores every target position, eos fillers included
        (see the module's doc)."""
        target, blocks, positions = frame.target_view()
        rows, draw = len(target), None
        if seeds is not None:
            t, draw = example_noise(seeds, blocks, low, high, self.antithetic)
        elif t is None:
            t = sample_block_times(rows, target.shape[1] // self.block_size, low, high, self.antithetic, generator,
                                   target.device)
        _, masked, t_token = mask_blocks(target, blocks, t, self.special.mask, generator, draw)
        if (self.training and self.resample) if resample is None else resample:
            masked = resample_masks(masked, blocks, t_token, self.block_size, low, high, generator)
        clean, clean_blocks = self._clean_half(frame, self.training)
        if self.training and self.complementary_masks:  # the second copy's t is 1 - t: its marginal
            masked = torch.cat((masked, ~masked & (blocks >= 0)))
            t_token = torch.cat((t_token, 1 - t_token))
            target, blocks, positions, clean, clean_blocks = (
                torch.cat((x, x)) for x in (target, blocks, positions, clean, clean_blocks))
        noisy = torch.where(masked, self.special.mask, target)
        hidden, _ = self.model.joint_pass(noisy, blocks, positions, clean, clean_blocks)
        predictors = self.model.predictors(hidden, blocks, positions, clean_blocks)
        logits = self.model.logits(predictors[masked]).float()
        smoothed, nll = token_losses(logits, target[masked], self.optim.label_smoothing, excluded=self.special.mask)
        weight = 1.0 / t_token[masked]
        train_weight = weight if self.loss_weighting == "elbo" else torch.ones_like(weight)
        loss, nll = row_sums(masked.nonzero()[:, 0], len(target), smoothed * train_weight,
                             nll * weight)
        n_logits = len(logits)
        if len(target) > rows:  # complementary copies: each an estimate, the row's their mean
            loss, nll = (loss[:rows] + loss[rows:]) / 2, (nll[:rows] + nll[rows:]) / 2
        if self.training and self.ar_loss_weight:  # a training signal: val/loss stays the bound's loss
            ar_loss, n_ar = self._ar_loss(frame, hidden[:rows, noisy.shape[1]:])
            loss, n_logits = loss + self.ar_loss_weight * ar_loss, n_logits + n_ar
        self.last_flops = self.flop_counter.step(len(target), noisy.shape[1] + clean.shape[1], n_logits)
        if per_token:  # the NELBO's terms whatever the training weights: bd3lms's noise-search statistic
            dense = torch.zeros(masked.shape, device=target.device, dtype=loss.dtype)
            dense[masked] = smoothed * weight
            return loss, nll, dense[:rows]
        return loss, nll

    def _clean_half(self, frame: BlockFrame, training: bool):
        """The clean tokens of the joint pass: only the columns noisy tokens read
        (`BlockFrame.read_width`; for one block, the prefix alone), or all of them when training
        with the AR loss, which predicts from every clean position. The rest would change nothing
        the loss reads, and the ledger counts what runs."""
        width = frame.clean.shape[1] if training and self.ar_loss_weight else frame.read_width
        return frame.clean[:, :width], frame.clean_blocks[:, :width]

    def _ar_loss(self, frame: BlockFrame, clean_hidden: torch.Tensor):
        """Per-row next-token loss of the clean half (B,): the clean token at p - 1 predicts the
        target (and eos) at p, as the AR model was trained. Returns it and the logits computed."""
        i = torch.arange(int(frame.n_targets.max()), device=clean_hidden.device)[None, :]
        labelled = i < frame.n_targets[:, None]
        at = (frame.target_start[:, None] + i).clamp(max=frame.clean.shape[1] - 1)
        labels = frame.clean.gather(1, at)[labelled]
        before = clean_hidden.gather(1, (at - 1)[..., None].expand(-1, -1, clean_hidden.shape[-1]))[labelled]
        smoothed, _ = token_losses(self.model.logits(before).float(), labels, self.optim.label_smoothing,
                                   excluded=self.special.mask)
        (loss,) = row_sums(labelled.nonzero()[:, 0], len(labelled), smoothed)
        return loss, len(labels)

    @property
    def train_range(self) -> tuple[float, float]:
        """The training noise range as the floats it was configured with: the buffer holds float32
        (1e-3 would read 0.0010000000474974513, which `resample` would then enforce), and every
        range here is a config value of at most 6 decimals."""
        low, high = (round(x, 6) for x in self.train_noise.tolist())
        return low, high

    def _eval_seeds(self, batch) -> list[int] | None:
        """Evaluation batches from a data module carry each example's index: its noise seed."""
        return None if self.training or "index" not in batch else batch["index"].tolist()

    def loss_terms(self, batch):
        frame = self._frame(batch)
        low, high = self.train_range if self.training else (self.eval_noise_floor, 1.0)
        loss, nll = self.nelbo_terms(frame, low, high, self._generator(frame.clean.device), seeds=self._eval_seeds(batch))
        copies = 2 if self.training and self.complementary_masks else 1  # each row runs twice
        _, clean_blocks = self._clean_half(frame, self.training)  # the positions the pass runs (MDLM: the prefix)
        n_inputs = copies * int((clean_blocks >= 0).sum() + frame.region.sum())
        return LossTerms(loss, nll, frame.n_targets, n_inputs, self.last_flops)

    def expected_flops(self, batch):
        """Each target token is masked with probability t ~ U[train_noise] (its block's): the output
        projection runs on (low + high) / 2 of them on average (at the range trained at setup)."""
        frame = self._frame(batch)
        target, blocks, _ = frame.target_view()
        low, high = self.train_range
        copies = 2 if self.complementary_masks else 1  # the copies together mask every token once
        masked = int((blocks >= 0).sum()) * (1.0 if self.complementary_masks else (low + high) / 2)
        if self.ar_loss_weight:
            masked += int(frame.n_targets.sum())
        clean, _ = self._clean_half(frame, training=True)
        return self.flop_counter.step(copies * len(target), target.shape[1] + clean.shape[1], masked)

    def cost_key(self) -> tuple:
        return self.train_range  # noise_search moves it, and with it the masked share projected

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.noise_candidates:  # the range noise_search chose, which this step trained on
            low, high = self.train_range
            self.log_dict({"train/noise_low": low, "train/noise_high": high}, batch_size=1)
        return loss

    # ---- noise-range search -------------------------------------------------------------------------
    def validation_metrics(self, generates: bool) -> list[str]:
        return super().validation_metrics(generates) + (list(NOISE_SEARCH_METRICS) if self.noise_candidates else [])

    def reset_eval_noise(self) -> None:
        self._eval_noise = None

    def on_validation_epoch_start(self):
        super().on_validation_epoch_start()
        self.reset_eval_noise()
        self._variance_stats = {}
        self.draft_stats = DraftStats()

    def on_test_epoch_start(self):
        super().on_test_epoch_start()
        self.reset_eval_noise()
        self.draft_stats = DraftStats()

    def on_test_epoch_end(self):
        self._log_draft_stats("test")
        super().on_test_epoch_end()

    def _log_draft_stats(self, stage: str) -> None:
        """With generation.verify: tokens per call (k) and the share of drafts equal to the AR
        view's choice (p), overall and by draft position (`{stage}/draft_p1` ..., those some draft
        reached), over every rank's rows (every rank joins the sum, with or without rows)."""
        if not self.sampling.verify:
            return
        stats, n = self.draft_stats, self.block_size - 1
        checked, agreed = (getattr(stats, name) or [0] * n for name in ("checked", "agreed"))
        sums = torch.tensor([stats.row_calls, stats.tokens, *checked, *agreed], dtype=torch.float64, device=self.device)
        row_calls, tokens, *counts = self.trainer.strategy.reduce(sums, reduce_op="sum").tolist()
        if not row_calls:
            return
        checked, agreed = counts[:n], counts[n:]
        logged = {f"{stage}/tokens_per_call": tokens / row_calls,
                  **({f"{stage}/draft_p": sum(agreed) / sum(checked)} if sum(checked) else {}),
                  **{f"{stage}/draft_p{i + 1}": a / c for i, (a, c) in enumerate(zip(agreed, checked)) if c}}
        self.log_dict(logged, batch_size=1, sync_dist=True)

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        if self.noise_candidates and not self.trainer.sanity_checking and self.trainer.state.fn == "fit":
            frame = self._frame(batch)
            counted = batch["counted"] if "counted" in batch else torch.ones(len(frame.n_targets), dtype=torch.bool)
            counted = counted.to(frame.n_targets.device)  # a distributed sampler's padding rows do not count
            _, blocks, _ = frame.target_view()
            rows = len(blocks)
            real = (blocks >= 0).view(rows, -1, self.block_size)[..., 0] & counted[:, None]
            for i, (low, high) in enumerate(self.noise_candidates):
                *_, per_token = self.nelbo_terms(frame, low, high, self._generator(frame.clean.device),
                                                 seeds=self._eval_seeds(batch), per_token=True, resample=self.resample)
                # bd3lms's statistic: the loss of each block, averaged over its tokens
                per_block = per_token.view(rows, -1, self.block_size).mean(-1)[real]
                stats = self._variance_stats.setdefault(i, [0.0, 0.0, 0.0])
                stats[0] += len(per_block)
                stats[1] += float(per_block.sum())
                stats[2] += float((per_block**2).sum())

    def on_validation_epoch_end(self):
        self._log_draft_stats("val")
        super().on_validation_epoch_end()
        if not self.noise_candidates or self.trainer.sanity_checking or self.trainer.state.fn != "fit":
            return
        # Sums over every rank's blocks: the choice is the one a single process would make on the
        # whole validation set, the same on every rank (a rank with no batch still joins). One
        # variance over all blocks, where bd3lms sums per-batch variances: it does not then depend
        # on the batch size.
        stats = torch.tensor([self._variance_stats.get(i, [0.0, 0.0, 0.0]) for i in range(len(self.noise_candidates))],
                             dtype=torch.float64, device=self.device)
        stats = self.trainer.strategy.reduce(stats, reduce_op="sum")
        if float(stats[:, 0].min()) == 0:
            return
        n, total, squares = stats.unbind(1)
        variances = {i: float(v) for i, v in enumerate(squares / n - (total / n) ** 2)}
        best = min(variances, key=variances.get)
        self.train_noise.copy_(torch.tensor(self.noise_candidates[best]))
        low, high = self.noise_candidates[best]
        every = {f"val/noise_var_{i}": v for i, v in variances.items()}  # candidate i of noise_search
        # Already reduced over ranks (identical everywhere): sync_dist only tells Lightning so.
        self.log_dict({"val/noise_low": low, "val/noise_high": high, "val/noise_loss_var": variances[best], **every},
                      batch_size=1, sync_dist=True)

    # ---- attention maps -----------------------------------------------------------------------------
    def attention_stacks(self):
        return {"decoder": self.model.stack}

    @torch.no_grad()
    def attention_weights(self, example):
        """One pass of `x_t ⊕ x_0` with every target token masked (t = 1, what the sampler's first
        step of each block sees). `clean`: the block-causal attention of the clean sequence
        `[bos] source [sep] target [eos] eos…` (it never sees noisy keys); `denoise`: the masked
        target's queries over all keys (its own block, noisy, and the clean blocks before it)."""
        frame = self._frame(self.collate_on_device([example]))
        target, blocks, positions = frame.target_view()
        noisy = torch.full_like(target, self.special.mask)
        _, weights = self.model.joint_pass(noisy, blocks, positions, frame.clean, frame.clean_blocks, need_weights=True)
        weights, n = layer_weights(weights, "self"), noisy.shape[1]
        clean, masked = token_labels(self, frame.clean[0]), token_labels(self, noisy[0])
        return [
            AttentionMap("clean", weights[:, :, n:, n:], clean, clean),
            AttentionMap("denoise", weights[:, :, :n], masked, masked + clean),
        ]

    # ---- generation ---------------------------------------------------------------------------------
    @classmethod
    def flops_per_token(cls, model, vocab, source_len, target_len, masked_fraction=0.5):
        """The layers see x_t ⊕ x_0 (2T tokens); the masked fraction reaches the projection."""
        return cls.count_flops(model, vocab).step(1, 2 * target_len, masked_fraction * target_len) / target_len

    def sample_decodings(self, steps, thresholds, unmasking):
        """First-hitting (BD3-LM's sampler, one uniformly chosen position a call), or confidence /
        random unmasking at each of `steps` per block that a block allows; then each threshold."""
        if unmasking == "first_hitting":
            fixed = [{"unmasking": unmasking, "steps": self.block_size}]
        else:
            usable = sorted({s for s in steps if 1 <= s <= self.block_size}) or [self.block_size]
            fixed = [{"unmasking": unmasking, "steps": s} for s in usable]
        return fixed + [{"unmasking": "threshold", "steps": self.block_size, "threshold": t} for t in thresholds]

    def continue_ids(self, prompts, setting, **common):
        return sample_blocks(self.model, prompts, block_size=self.block_size, **setting, **common)

    @classmethod
    def bench_arguments(cls, block_size):
        """The converted recipe's network (shift, causal clean context): what draft-and-verify needs,
        at the cost of any block-diffusion model of the same shape."""
        return {"block_size": block_size, "shift": True, "context": "causal"}

    def bench_decodings(self, batch, new, beam, eos_id):
        """Confidence and threshold decodings; with an AR view, draft-and-verify with every draft kept
        (`verify_all`: block_size tokens a call) and with none (`verify_none`: one), the bounds of
        its speed whatever a trained model's drafts (replayed drafts: the bench's weights are
        untrained)."""
        prompts = batch["source"].tolist()
        common = dict(max_new_tokens=new, eos_id=eos_id, pad_id=self.special.pad, sampling=SamplingConfig())
        out = {(f"tau{s['threshold']}" if "threshold" in s else f"steps{s['steps']}"):
               lambda compiled, s=s: partial(self.continue_ids, prompts, s, compiled=compiled, **common)
               for s in self.sample_decodings(BENCH_STEPS, BENCH_THRESHOLDS, "confidence")}
        if self.model.shift and self.model.causal and self.block_size > 1:
            span = dict(common, max_new_tokens=new + DRAFT_SPAN * self.block_size)
            truth = torch.tensor(draft_and_verify(self.model, prompts, block_size=self.block_size, **span))
            for name, kept in (("verify_all", True), ("verify_none", False)):
                out[name] = lambda compiled, kept=kept: partial(
                    draft_and_verify, self.model, prompts, block_size=self.block_size, compiled=compiled,
                    drafter=replayed_drafts(truth, kept, self.vocab_size, self.special.mask), **common)
        return out

    def positions_needed(self, source_length: int, target_length: int) -> int:
        prefix = 1 if source_length == 0 else source_length + 2
        targets = target_length + (0 if source_length == 0 else 1)
        trained = -(-targets // self.block_size) * self.block_size
        generated = 0 if source_length == 0 else -(-self.max_output_length(source_length) // self.block_size) * self.block_size
        if generated and self.sampling.verify:  # a finished row's last calls reach past the output
            generated += DRAFT_SPAN * self.block_size
        return prefix + max(trained, generated)

    def generate_ids(self, batch):
        ids = self.special
        prompts = prompts_of(batch, ids.bos, ids.sep)
        max_new = self.max_output_length(batch["source_lengths"])  # one budget per row
        if self.sampling.verify:
            return draft_and_verify(self.model, prompts, max_new_tokens=max_new, block_size=self.block_size,
                                    eos_id=ids.eos, pad_id=ids.pad, sampling=self.sampling,
                                    compiled=self.sampling.compile, stats=self.draft_stats)
        return sample_blocks(
            self.model, prompts, max_new_tokens=max_new, block_size=self.block_size, steps=self.denoising_steps,
            eos_id=ids.eos, pad_id=ids.pad, sampling=self.sampling, unmasking=self.unmasking,
            threshold=self.threshold, compiled=self.sampling.compile,
        )
