"""attnlab: compare and ablate transformer families with Lightning."""
import importlib as _importlib
import sys as _sys

from attnlab.components import BackboneConfig
from attnlab.errors import AttnlabError, ConfigError, DataError
from attnlab.families import BlockDiffusion, DecoderOnly, EncoderDecoder, FamilyModule
from attnlab.families.optim import OptimizerConfig
from attnlab.generation import SamplingConfig

# Module paths of earlier releases that configs may name (class_path: attnlab.averaging.CheckpointAveraging).
MOVED = {"attnlab.modules": "attnlab.families", "attnlab.averaging": "attnlab.checkpoints.averaging"}
for _old, _new in MOVED.items():
    _sys.modules.setdefault(_old, _importlib.import_module(_new))

__all__ = [
    "AttnlabError", "BackboneConfig", "BlockDiffusion", "ConfigError", "DataError", "DecoderOnly", "EncoderDecoder", "FamilyModule",
    "OptimizerConfig", "SamplingConfig",
]
