"""The registry of families: family name -> FamilyModule class.

Code outside a family asks the class (`autoregressive`, `count_flops`, `bench_decodings`, ...),
never its name: checkpoint loading finds the class by the name a checkpoint records, the report
by a run's `model.class_path` (`family_class`). A family outside attnlab registers itself with
`register_family`, so its checkpoints load and the bench can name it.
"""
from __future__ import annotations

import importlib

from attnlab.errors import ConfigError

FAMILIES: dict = {}  # family name -> class, in registration order (the bench's default order)
BUILT_IN = ("attnlab.families.decoder_only.DecoderOnly", "attnlab.families.encoder_decoder.EncoderDecoder",
            "attnlab.families.block_diffusion.BlockDiffusion")
_built_in_registered = False


def registered() -> dict:
    """FAMILIES, the built-in families in it first: imported and registered on first use (they
    import torch, which a report of recorded runs does without)."""
    global _built_in_registered
    if not _built_in_registered:
        _built_in_registered = True
        for path in BUILT_IN:
            module, _, name = path.rpartition(".")
            register_family(getattr(importlib.import_module(module), name))
    return FAMILIES


def register_family(cls):
    """Add `cls` to FAMILIES under `cls.family` and return it (usable as a class decorator).

    Registering the same class again (a module imported twice) is a no-op; another class under a
    name already taken is refused, as is a class that leaves part of the contract out."""
    from attnlab.families.base import CAPABILITIES, FamilyModule

    registered()  # the built-in names are taken before any other family can claim one
    if not (isinstance(cls, type) and issubclass(cls, FamilyModule)):
        raise ConfigError(f"register_family: {cls!r} is not a subclass of attnlab.families.base.FamilyModule")
    name = getattr(cls, "family", None)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"register_family: {cls.__qualname__} has no class attribute `family` (the name "
                          "its checkpoints record)")
    problems = []
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        problems.append(f"methods not implemented: {', '.join(missing)}")
    unset = [c for c in CAPABILITIES if not isinstance(getattr(cls, c, None), bool)]
    if unset:
        problems.append(f"class attributes not set to True or False: {', '.join(unset)}")
    if problems:
        raise ConfigError(f"register_family: {cls.__qualname__} leaves out part of the family contract "
                          f"({'; '.join(problems)}); see docs/guides/families.md")
    taken = FAMILIES.get(name)
    if taken is not None and _qualified(taken) != _qualified(cls):
        raise ConfigError(f"register_family: the family name {name!r} is taken by {_qualified(taken)}; "
                          f"give {_qualified(cls)} a `family` of its own")
    FAMILIES[name] = cls
    return cls


def _qualified(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def family_class(class_path: str | None = None, name: str | None = None):
    """The FamilyModule class of a run: its config's `model.class_path` imported (as LightningCLI
    would), else the registered family `name` (summary.json's); None when neither gives one."""
    from attnlab.families.base import FamilyModule

    if class_path:
        module, _, attribute = class_path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module or "attnlab"), attribute)
        except (ImportError, AttributeError):
            cls = None
        if isinstance(cls, type) and issubclass(cls, FamilyModule):
            return cls
    return registered().get(name) if name else None
