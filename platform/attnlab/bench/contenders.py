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
from attnlab.families import FAMILIES, DecoderOnly, EncoderDecoder
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


def backbone(shape: BenchShape, options: Options, encodes_source: bool) -> BackboneConfig:
    """GPT-2's layout for the decoders (pre-norm, GELU, learned positions); the paper's for a family
    with an encoder (post-norm, ReLU, sinusoids), as torch.nn.Transformer is."""
    common = dict(d_model=shape.d_model, n_heads=shape.n_heads, n_kv_heads=shape.n_kv_heads, d_ff=shape.d_ff, dropout=0.0,
                  fused_qkv=options.fused_qkv)
    if encodes_source:
        return BackboneConfig(**common, n_layers=shape.ed_layers, max_positions=4 * shape.ed_len)
    return BackboneConfig(**common, n_layers=shape.n_layers, norm_position="pre", activation="gelu",
                          positional="learned", scale_embeddings=False,
                          max_positions=max(shape.seq_len, shape.gen_prompt + shape.gen_new) + 8)


def platform_module(family: str, shape: BenchShape, options: Options):
    """The registered family `family` at the bench's shapes: the encoder-decoder ones (ed_*)
    where it encodes a source, else the decoder ones, and what else it asks for
    (`FamilyModule.bench_arguments`)."""
    cls = FAMILIES[family]
    module = cls(backbone=backbone(shape, options, cls.encodes_source), vocab_size=shape.vocab, special_ids=SPECIAL,
                 compile=options.compile, **cls.bench_arguments(shape.block_size))
    module.to(options.device)
    module.compile_stacks()  # what a Trainer's setup does: compiles the stacks when asked
    return module


def bench_lengths(shape: BenchShape, family: str) -> tuple[int, int]:
    """(source, target) tokens per row of the family's training rows: ed_len each where it encodes
    a source, else seq_len decoder tokens and no source."""
    return (shape.ed_len, shape.ed_len) if FAMILIES[family].encodes_source else (0, shape.seq_len)


def family_flops_per_token(family: str, model, vocab: int, source_len: int, target_len: int,
                           masked_fraction: float = 0.5) -> float:
    """Training FLOPs per target (sequence) token of the registered family's `model`, as the
    family counts them (`FamilyModule.flops_per_token`)."""
    return FAMILIES[family].flops_per_token(model, vocab, source_len, target_len, masked_fraction)


def in_bench_order(families) -> list[str]:
    """The registered families among `families` in registry order, those without an encoder first
    (they share the decoder rows, drawn first)."""
    chosen = [name for name in FAMILIES if name in families]
    return sorted(chosen, key=lambda name: FAMILIES[name].encodes_source)


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
    tokens (a family with an encoder), never block diffusion's doubled x_t ⊕ x_0. The references
    follow the families of their kind (GPT-2 the decoders, nn.Transformer the encoder-decoders)."""
    generator = torch.Generator().manual_seed(0)
    steps, tokens, modules = {}, {}, {}
    device = options.device
    chosen = in_bench_order(families)
    decoders = [f for f in chosen if not FAMILIES[f].encodes_source]
    encoders = [f for f in chosen if FAMILIES[f].encodes_source]
    if decoders:
        rows = decoder_tokens(shape, device, generator)
        batch = schema_batch(None, rows[:, 1:])
        for family in decoders:
            modules[family] = platform_module(family, shape, options)
            steps[family] = platform_train_step(modules[family], batch, options)
            tokens[family] = rows.numel()
        if references and hf and DecoderOnly.family in decoders:
            steps["hf_gpt2"] = gpt2_train_step(hf_gpt2(shape), rows, options)
            tokens["hf_gpt2"] = rows.numel()
    if encoders:
        source = random_pieces(shape.ed_batch, shape.ed_len - 1, shape.vocab, device, generator)
        target = random_pieces(shape.ed_batch, shape.ed_len - 1, shape.vocab, device, generator)
        for family in encoders:
            modules[family] = platform_module(family, shape, options)
            steps[family] = platform_train_step(modules[family], schema_batch(source, target), options)
            tokens[family] = target.numel() + len(target)  # [bos] target
        if references and EncoderDecoder.family in encoders:
            eos, bos = torch.full_like(source[:, :1], SPECIAL.eos), torch.full_like(source[:, :1], SPECIAL.bos)
            steps["torch_transformer"] = translator_train_step(
                TorchTranslator(shape), torch.cat((source, eos), 1), torch.cat((bos, target), 1),
                torch.cat((target, eos), 1), options,
            )
            tokens["torch_transformer"] = tokens[EncoderDecoder.family]
    return steps, tokens, modules


# The references and the family each mirrors (its FLOPs per token are theirs).
REFERENCE_OF = {"hf_gpt2": DecoderOnly.family, "torch_transformer": EncoderDecoder.family}


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
    (default gen_new): every family's `bench_decodings` (DecoderOnly greedy and beam, BlockDiffusion
    with 1, 2 and 4 steps per block and with thresholds 0.9 and 0.7, EncoderDecoder greedy and
    beam), eagerly and with each decoding call compiled (`_compiled` rows; the same tokens), and
    the references (Hugging Face `generate` greedy and beam, nn.Transformer)."""
    generator = torch.Generator().manual_seed(1)
    device, new = options.device, shape.gen_new if new is None else new
    prompts = random_pieces(batch, shape.gen_prompt, shape.vocab, device, generator)
    beam = f"beam{shape.gen_beam}"
    out: list[Decoding] = []

    for module in modules.values():
        module.eval()
    for family in in_bench_order(modules):
        module = modules[family]
        stack = module.decoding_stack()
        # A decoder's prompt is its source: the schema batch's source column, as in a plain-LM batch.
        for decoding, make in module.bench_decodings(schema_batch(prompts, prompts[:, :1]), new, shape.gen_beam,
                                                     NEVER).items():
            out.append(Decoding(family, decoding, False, make(False), stack))
            out.append(Decoding(family, decoding, True, make(True), stack))
        if type(module) is DecoderOnly and references and hf:
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
        if type(module) is EncoderDecoder and references and batch <= shape.reference_max_batch:
            translator = TorchTranslator(shape).to(device).eval()
            out.append(Decoding("torch_transformer", "greedy", False,
                                partial(translator.greedy, prompts, SPECIAL.bos, new), translator.transformer.decoder))
    return {d.name: d for d in out}
