"""Decoding: token choice (greedy / sampling) and the generation loops of each family."""
from attnlab.generation.sampling import SamplingConfig, choose_next

__all__ = ["SamplingConfig", "choose_next"]
