"""Training and generation steps of the platform's families and of the references, as closures
the timer can interleave. Every training step is forward + loss + backward + AdamW."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from attnlab.bench.references import TorchTranslator, hf_gpt2
from attnlab.bench.shapes import BenchShape
from attnlab.components import BackboneConfig
from attnlab.families import BlockDiffusion, DecoderOnly, EncoderDecoder
from attnlab.generation import SamplingConfig
from attnlab.generation.block_diffusion import sample_blocks
from attnlab.generation.decoder_only import generate, generate_beam
from attnlab.generation.encoder_decoder import translate_beam, translate_greedy
from data_modules.batch import SpecialIds

SPECIAL = SpecialIds()
NEVER = -1  # an eos id no model can produce: every generation runs to its full length
FIRST_PIECE = 6  # ids below are special pieces


@dataclass
class Options:
    device: torch.device
    precision: str = "32"  # or "bf16-mixed"
    compile: bool = False
    fused_qkv: bool = True

    def autocast(self):
        if self.precision == "bf16-mixed":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()


def random_pieces(rows: int, length: int, vocab: int, device, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(FIRST_PIECE, vocab, (rows, length), generator=generator).to(device)


def schema_batch(source: torch.Tensor | None, target: torch.Tensor) -> dict:
    """The platform's batch schema for rows of equal length (no padding)."""
    rows = len(target)
    source = target.new_zeros(rows, 0) if source is None else source
    return {
        "source": source, "source_lengths": torch.full((rows,), source.shape[1], device=target.device),
        "target": target, "target_lengths": torch.full((rows,), target.shape[1], device=target.device),
        "source_text": [""] * rows, "target_text": [""] * rows,
    }


def backbone(shape: BenchShape, options: Options, family: str) -> BackboneConfig:
    """GPT-2's layout for the decoders (pre-norm, GELU, learned positions); the paper's for the
    encoder-decoder (post-norm, ReLU, sinusoids), as torch.nn.Transformer is."""
    common = dict(d_model=shape.d_model, n_heads=shape.n_heads, n_kv_heads=shape.n_kv_heads, d_ff=shape.d_ff, dropout=0.0,
                  fused_qkv=options.fused_qkv)
    if family == "encoder_decoder":
        return BackboneConfig(**common, n_layers=shape.ed_layers, max_positions=4 * shape.ed_len)
    return BackboneConfig(**common, n_layers=shape.n_layers, norm_position="pre", activation="gelu",
                          positional="learned", scale_embeddings=False,
                          max_positions=max(shape.seq_len, shape.gen_prompt + shape.gen_new) + 8)


def platform_module(family: str, shape: BenchShape, options: Options):
    cls = {"decoder_only": DecoderOnly, "encoder_decoder": EncoderDecoder, "block_diffusion": BlockDiffusion}[family]
    extra = {"block_size": shape.block_size} if family == "block_diffusion" else {}
    module = cls(backbone=backbone(shape, options, family), vocab_size=shape.vocab, special_ids=SPECIAL,
                 compile=options.compile, **extra)
    module.to(options.device)
    module.compile_stacks()  # what a Trainer's setup does: compiles the stacks when asked
    return module


def _train_step(parameters, loss_fn: Callable[[], torch.Tensor], options: Options) -> Callable[[], None]:
    optimizer = torch.optim.AdamW(parameters, lr=1e-4)

    def step():
        with options.autocast():
            loss = loss_fn()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def platform_train_step(module, batch: dict, options: Options):
    module.train()

    def loss():
        terms = module.loss_terms(batch)
        return terms.loss.sum() / terms.targets.sum()

    return _train_step(module.parameters(), loss, options)


def gpt2_train_step(model, tokens: torch.Tensor, options: Options):
    model.to(options.device).train()
    if options.compile:
        model.compile(dynamic=False)
    return _train_step(model.parameters(), lambda: model(input_ids=tokens, labels=tokens).loss, options)


def translator_train_step(model: TorchTranslator, source, target_in, labels, options: Options):
    model.to(options.device).train()
    if options.compile:
        model.compile(dynamic=False)
    return _train_step(model.parameters(), lambda: model.loss(source, target_in, labels), options)


def decoder_tokens(shape: BenchShape, device, generator) -> torch.Tensor:
    """(batch, seq_len) rows `[bos] pieces`, the decoders' training input."""
    pieces = random_pieces(shape.batch, shape.seq_len - 1, shape.vocab, device, generator)
    return torch.cat((torch.full_like(pieces[:, :1], SPECIAL.bos), pieces), dim=1)


def training_steps(shape: BenchShape, options: Options, families: list[str], references: bool, hf: bool):
    """{name: step} and {name: tokens per step}; tokens are sequence tokens (decoders) or target
    tokens (encoder-decoder), never block diffusion's doubled x_t ⊕ x_0."""
    generator = torch.Generator().manual_seed(0)
    steps, tokens, modules = {}, {}, {}
    device = options.device
    if "decoder_only" in families or "block_diffusion" in families:
        rows = decoder_tokens(shape, device, generator)
        batch = schema_batch(None, rows[:, 1:])
        for family in ("decoder_only", "block_diffusion"):
            if family in families:
                modules[family] = platform_module(family, shape, options)
                steps[family] = platform_train_step(modules[family], batch, options)
                tokens[family] = rows.numel()
        if references and hf and "decoder_only" in families:
            steps["hf_gpt2"] = gpt2_train_step(hf_gpt2(shape), rows, options)
            tokens["hf_gpt2"] = rows.numel()
    if "encoder_decoder" in families:
        source = random_pieces(shape.ed_batch, shape.ed_len - 1, shape.vocab, device, generator)
        target = random_pieces(shape.ed_batch, shape.ed_len - 1, shape.vocab, device, generator)
        modules["encoder_decoder"] = platform_module("encoder_decoder", shape, options)
        steps["encoder_decoder"] = platform_train_step(modules["encoder_decoder"], schema_batch(source, target), options)
        tokens["encoder_decoder"] = target.numel() + len(target)  # [bos] target
        if references:
            eos, bos = torch.full_like(source[:, :1], SPECIAL.eos), torch.full_like(source[:, :1], SPECIAL.bos)
            steps["torch_transformer"] = translator_train_step(
                TorchTranslator(shape), torch.cat((source, eos), 1), torch.cat((bos, target), 1),
                torch.cat((target, eos), 1), options,
            )
            tokens["torch_transformer"] = tokens["encoder_decoder"]
    return steps, tokens, modules


BLOCK_STEPS = (1, 2, 4)  # block diffusion's calls per block (confidence unmasking); those above block_size are left out
THRESHOLDS = (0.9, 0.7)  # and its adaptive rows: each call reveals every token at least this probable


@dataclass
class Decoding:
    """One generation contender: `run()` generates the shape's gen_new tokens after each prompt of
    a batch. `stack` is the module whose forward calls are its model calls (a compiled row's are
    reported by its compiled runner: see generation/model_calls.py)."""
    family: str  # decoder_only, hf_generate, block_diffusion, encoder_decoder, torch_transformer
    decoding: str  # greedy, beam4, steps2, tau0.9
    compiled: bool
    run: Callable[[], None]
    stack: torch.nn.Module

    @property
    def name(self) -> str:
        return f"{self.family}/{self.decoding}" + ("_compiled" if self.compiled else "")


def generation_steps(shape: BenchShape, options: Options, modules: dict, references: bool, hf: bool, batch: int,
                     new: int | None = None) -> dict[str, Decoding]:
    """{name: Decoding} for `batch` rows of gen_prompt tokens, each continued by `new` tokens
    (default gen_new): every family's decodings (DecoderOnly greedy and beam, BlockDiffusion with
    1, 2 and 4 steps per block and with thresholds 0.9 and 0.7, EncoderDecoder greedy and beam),
    eagerly and with each decoding call compiled (`_compiled` rows; the same tokens), and the references (Hugging Face `generate` greedy and beam, nn.Transformer)."""
    generator = torch.Generator().manual_seed(1)
    device, new = options.device, shape.gen_new if new is None else new
    prompts = random_pieces(batch, shape.gen_prompt, shape.vocab, device, generator)
    prompt_lists = prompts.tolist()
    greedy, beam = SamplingConfig(), f"beam{shape.gen_beam}"
    out: list[Decoding] = []

    def both(family: str, decoding: str, stack, make: Callable[[bool], Callable[[], None]]):
        out.append(Decoding(family, decoding, False, make(False), stack))
        out.append(Decoding(family, decoding, True, make(True), stack))

    for module in modules.values():
        module.eval()
    if "decoder_only" in modules:
        model = modules["decoder_only"].model
        both("decoder_only", "greedy", model.stack, lambda compiled: partial(
            generate, model, prompt_lists, max_new_tokens=new, eos_id=NEVER, pad_id=SPECIAL.pad, sampling=greedy,
            compiled=compiled))
        both("decoder_only", beam, model.stack, lambda compiled: partial(
            generate_beam, model, prompt_lists, max_new_tokens=new, eos_id=NEVER, pad_id=SPECIAL.pad,
            beam_size=shape.gen_beam, alpha=0.6, compiled=compiled))
        if references and hf:
            gpt2 = hf_gpt2(shape).to(device).eval()
            attention = torch.ones_like(prompts)

            def hf_generate(**kwargs):
                @torch.no_grad()
                def run():
                    # min_new_tokens: eos is suppressed until the last token, so every row (and beam) runs full length
                    tokens = gpt2.generate(prompts, attention_mask=attention, max_new_tokens=new, min_new_tokens=new,
                                           do_sample=False, pad_token_id=SPECIAL.pad, **kwargs)
                    assert tokens.shape == (batch, shape.gen_prompt + new), "generate stopped early"
                return run

            out.append(Decoding("hf_generate", "greedy", False, hf_generate(), gpt2.transformer))
            out.append(Decoding("hf_generate", beam, False, hf_generate(num_beams=shape.gen_beam, early_stopping=False),
                                gpt2.transformer))
    if "block_diffusion" in modules:
        model, size = modules["block_diffusion"].model, shape.block_size
        sample = partial(sample_blocks, model, prompt_lists, max_new_tokens=new, block_size=size, eos_id=NEVER,
                         pad_id=SPECIAL.pad, sampling=greedy)
        for steps in (s for s in BLOCK_STEPS if s <= size):
            both("block_diffusion", f"steps{steps}", model.stack, lambda compiled, steps=steps: partial(
                sample, steps=steps, unmasking="confidence", compiled=compiled))
        for tau in THRESHOLDS:
            both("block_diffusion", f"tau{tau}", model.stack, lambda compiled, tau=tau: partial(
                sample, steps=size, unmasking="threshold", threshold=tau, compiled=compiled))
    if "encoder_decoder" in modules:
        module = modules["encoder_decoder"]
        source = schema_batch(prompts, prompts[:, :1])
        lengths = torch.full((batch,), new, device=device)
        common = dict(max_lengths=lengths, bos_id=SPECIAL.bos, eos_id=NEVER, pad_id=SPECIAL.pad)

        def translate(decode, **kwargs):
            @torch.no_grad()
            def run():
                source_tokens, valid, _, _ = module._frame(source)
                decode(module.model, module.model.encode(source_tokens, valid)[0], **common, **kwargs)
            return run

        both("encoder_decoder", "greedy", module.model.decoder,
             lambda compiled: translate(translate_greedy, sampling=greedy, compiled=compiled))
        both("encoder_decoder", beam, module.model.decoder,
             lambda compiled: translate(translate_beam, beam_size=shape.gen_beam, alpha=0.6, compiled=compiled))
        if references and batch <= shape.reference_max_batch:
            translator = TorchTranslator(shape).to(device).eval()
            out.append(Decoding("torch_transformer", "greedy", False,
                                partial(translator.greedy, prompts, SPECIAL.bos, new), translator.transformer.decoder))
    return {d.name: d for d in out}
