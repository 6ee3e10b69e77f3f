"""The configurations the bench measures: `cpu` is the one REFERENCE.md's CPU anchors use,
`gpt2-small` the GPU goal (124M-parameter GPT-2 shapes, vocabulary padded to 50304)."""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class BenchShape:
    vocab: int = 8000
    d_model: int = 256
    n_layers: int = 4  # decoder-only and block diffusion
    n_heads: int = 8
    n_kv_heads: int | None = None  # None: n_heads (the references have no GQA); the GQA memory rows vary it
    d_ff: int = 1024
    batch: int = 16
    seq_len: int = 256  # tokens per row, [bos] included
    ed_layers: int = 3  # encoder-decoder: this many encoder and decoder layers
    ed_batch: int = 64
    ed_len: int = 64  # source and target tokens per row (with eos / bos)
    block_size: int = 4
    # Batch 1 is single-stream decoding, where per-step overhead, not matmuls, decides; 256 is an
    # evaluation batch, where the matmuls do.
    gen_batches: tuple[int, ...] = (1, 16, 256)
    gen_beam: int = 4  # the beam of the beam-search rows (DecoderOnly, EncoderDecoder, HF generate)
    # Batches this large or larger: gen_few_rounds timed rounds after a short warm-up call (2 blocks
    # of new tokens, where any compiling happens) instead of max(3, rounds) rounds after a full
    # one: a full-length beam search at such a batch is long on a CPU. Three rounds: paired, so
    # that twin rows' ratio is taken round by round, and their median outlasts one slow spell
    # (with two, one slow round decides the ratio).
    gen_few_rounds_from: int = 256
    gen_few_rounds: int = 3
    reference_max_batch: int = 16  # nn.Transformer (no cache) re-decodes every prefix: not beyond this
    gen_prompt: int = 32
    gen_new: int = 128
    memory_lengths: tuple[int, ...] = (1024, 2048, 4096, 8192)
    memory_math_max: int = 4096  # the quadratic reference stops here (8192 would need ~10 GB)


SIZES = {
    "cpu": BenchShape(),
    "gpt2-small": BenchShape(
        vocab=50304, d_model=768, n_layers=12, n_heads=12, d_ff=3072, batch=16, seq_len=1024,
        ed_layers=6, ed_batch=64, ed_len=256, gen_batches=(1, 16, 64), gen_prompt=128, gen_new=256,
        memory_lengths=(4096, 8192, 16384, 32768), memory_math_max=16384,
    ),
}


def resolve_shape(size: str, **overrides) -> BenchShape:
    """A preset with the flags the user set (None = keep the preset's value)."""
    return replace(SIZES[size], **{k: v for k, v in overrides.items() if v is not None})
