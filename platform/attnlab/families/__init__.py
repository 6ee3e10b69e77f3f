"""The LightningModules: the family contract (base.py) and one subclass per family."""
from attnlab.families.base import FamilyModule
from attnlab.families.block_diffusion import BlockDiffusion
from attnlab.families.decoder_only import DecoderOnly
from attnlab.families.encoder_decoder import EncoderDecoder

FAMILIES = {cls.family: cls for cls in (DecoderOnly, EncoderDecoder, BlockDiffusion)}

__all__ = ["FAMILIES", "BlockDiffusion", "DecoderOnly", "EncoderDecoder", "FamilyModule"]
