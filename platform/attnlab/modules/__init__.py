"""The LightningModules: a shared base and one thin subclass per family."""
from attnlab.modules.base import FamilyModule
from attnlab.modules.decoder_only import DecoderOnly

FAMILIES = {cls.family: cls for cls in (DecoderOnly,)}

__all__ = ["FAMILIES", "DecoderOnly", "FamilyModule"]
