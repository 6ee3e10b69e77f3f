"""Pure-torch building blocks shared by every family (no Lightning here)."""
from attnlab.components.attention import KVCache, MultiHeadAttention, math_attention
from attnlab.components.config import BackboneConfig
from attnlab.components.embedding import TokenEmbedding
from attnlab.components.layers import LayerCache, TransformerLayer
from attnlab.components.positional import REGISTRY as POSITIONAL_ENCODINGS, build_positional
from attnlab.components.stack import TransformerStack

__all__ = [
    "BackboneConfig", "KVCache", "LayerCache", "MultiHeadAttention", "POSITIONAL_ENCODINGS",
    "TokenEmbedding", "TransformerLayer", "TransformerStack", "build_positional", "math_attention",
]
