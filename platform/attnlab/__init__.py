"""attnlab: compare and ablate transformer families with Lightning.

The names below load on first use (PEP 562), so that `attnlab --help`, `attnlab report` and
every one-line refusal of bad input start without importing torch and Lightning.
"""
import importlib as _importlib
import importlib.abc as _abc
import importlib.util as _util
import sys as _sys

_EXPORTS = {
    "AttnlabError": "attnlab.errors", "ConfigError": "attnlab.errors", "DataError": "attnlab.errors",
    "BackboneConfig": "attnlab.components", "OptimizerConfig": "attnlab.families.optim",
    "BlockDiffusion": "attnlab.families", "DecoderOnly": "attnlab.families", "EncoderDecoder": "attnlab.families",
    "FamilyModule": "attnlab.families", "SamplingConfig": "attnlab.generation",
}
__all__ = sorted(_EXPORTS)

# Module paths of earlier releases that configs may name (class_path: attnlab.averaging.CheckpointAveraging).
# `attnlab.experiment` was split into sweeps/, reports/ and probes/; configs name only its callback.
MOVED = {"attnlab.modules": "attnlab.families", "attnlab.averaging": "attnlab.checkpoints.averaging",
         "attnlab.experiment": "attnlab.probes", "attnlab.experiment.attention_maps": "attnlab.probes.attention_maps"}


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'attnlab' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


class _MovedModules(_abc.MetaPathFinder, _abc.Loader):
    """Imports an old module path as the module that now lives at the new one (the same object)."""

    def find_spec(self, fullname, path=None, target=None):
        return _util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec):
        module = _importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # the import machinery sets __spec__ to the old name's
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state  # already executed under its new name


if not any(isinstance(finder, _MovedModules) for finder in _sys.meta_path):
    _sys.meta_path.insert(0, _MovedModules())  # first: the path finder would load a moved file twice
