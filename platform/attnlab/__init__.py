"""attnlab: compare and ablate transformer families with Lightning."""
from attnlab.components import BackboneConfig
from attnlab.errors import AttnlabError, ConfigError, DataError
from attnlab.generation import SamplingConfig
from attnlab.modules import BlockDiffusion, DecoderOnly, EncoderDecoder, FamilyModule
from attnlab.modules.optim import OptimizerConfig

__all__ = [
    "AttnlabError", "BackboneConfig", "BlockDiffusion", "ConfigError", "DataError", "DecoderOnly", "EncoderDecoder", "FamilyModule",
    "OptimizerConfig", "SamplingConfig",
]
