"""The LightningModules: a shared base and one thin subclass per family."""
from attnlab.modules.base import FamilyModule
from attnlab.modules.block_diffusion import BlockDiffusion
from attnlab.modules.decoder_only import DecoderOnly
from attnlab.modules.encoder_decoder import EncoderDecoder

FAMILIES = {cls.family: cls for cls in (DecoderOnly, EncoderDecoder, BlockDiffusion)}

__all__ = ["FAMILIES", "BlockDiffusion", "DecoderOnly", "EncoderDecoder", "FamilyModule"]
