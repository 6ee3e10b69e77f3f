"""Pure-torch building blocks shared by every family (no Lightning here)."""
from attnlab.components.attention import MultiHeadAttention, math_attention
from attnlab.components.config import BackboneConfig
from attnlab.components.embedding import TokenEmbedding
from attnlab.components.kv_cache import DecodeState, KVCache, LayerCache
from attnlab.components.layers import TransformerLayer
from attnlab.components.positional import REGISTRY as POSITIONAL_ENCODINGS
from attnlab.components.positional import build_positional
from attnlab.components.stack import TransformerStack

__all__ = [
    "BackboneConfig", "DecodeState", "KVCache", "LayerCache", "MultiHeadAttention", "POSITIONAL_ENCODINGS",
    "TokenEmbedding", "TransformerLayer", "TransformerStack", "build_positional", "math_attention",
]
