"""The LightningModules: the family contract (base.py) and one subclass per family."""
from attnlab.families.base import FamilyModule
from attnlab.families.block_diffusion import BlockDiffusion
from attnlab.families.decoder_only import DecoderOnly
from attnlab.families.encoder_decoder import EncoderDecoder
from attnlab.families.registry import FAMILIES, family_class, register_family

for _cls in (DecoderOnly, EncoderDecoder, BlockDiffusion):
    register_family(_cls)

__all__ = ["FAMILIES", "BlockDiffusion", "DecoderOnly", "EncoderDecoder", "FamilyModule", "family_class",
           "register_family"]
