"""The LightningModules: the family contract (base.py) and one subclass per family.

The names below load on first use (PEP 562): a report or a sweep reads `families.metric_keys`
without importing torch and Lightning. `FAMILIES` is the registry (registry.py), the built-in
families registered in it on first use.
"""
import importlib as _importlib

from attnlab.families.registry import family_class, register_family

_EXPORTS = {"FamilyModule": "attnlab.families.base", "BlockDiffusion": "attnlab.families.block_diffusion",
            "DecoderOnly": "attnlab.families.decoder_only", "EncoderDecoder": "attnlab.families.encoder_decoder"}

__all__ = ["FAMILIES", "BlockDiffusion", "DecoderOnly", "EncoderDecoder", "FamilyModule", "family_class",
           "register_family"]


def __getattr__(name):
    if name == "FAMILIES":
        from attnlab.families.registry import registered

        value = registered()
    elif name in _EXPORTS:
        value = getattr(_importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'attnlab.families' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


def load_all() -> None:
    """Import every family, so Lightning's CLI knows each by its short class name
    (`--model DecoderOnly`) as it would after an eager import."""
    __getattr__("FAMILIES")
