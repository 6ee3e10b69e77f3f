"""The LightningModules: a shared base and one thin subclass per family."""
from attnlab.modules.base import FamilyModule
from attnlab.modules.decoder_only import DecoderOnly
from attnlab.modules.encoder_decoder import EncoderDecoder

FAMILIES = {cls.family: cls for cls in (DecoderOnly, EncoderDecoder)}

__all__ = ["FAMILIES", "DecoderOnly", "EncoderDecoder", "FamilyModule"]
