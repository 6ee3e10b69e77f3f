"""Multi-process training: the fully sharded strategy (fsdp.py) and what happens when a rank fails."""
from attnlab.distributed.fsdp import LayerWiseFSDP

__all__ = ["LayerWiseFSDP"]
