"""Decoding: token choice (sampling.py), the shared loop (loop.py), beam search, one file per family."""
from attnlab.generation.sampling import SamplingConfig, choose_next

__all__ = ["SamplingConfig", "choose_next"]
