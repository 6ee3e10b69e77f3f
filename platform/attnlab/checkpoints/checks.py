"""Whether a checkpoint fits the model about to load it: the one check, for the CLI and for Trainers."""
from __future__ import annotations

from dataclasses import asdict

from attnlab.errors import AttnlabError


def check_fits(module, checkpoint: dict, source: str = "the checkpoint", shapes: bool = True) -> None:
    """The one check that a checkpoint fits the module about to load it: the same family, and
    (with `shapes`) the same weights and sizes. Names the first differing weight and the backbone
    settings that differ, instead of torch's list of every mismatched tensor."""
    family = (checkpoint.get("attnlab") or {}).get("family")
    if family != module.family:
        raise AttnlabError(
            f"{source} holds a model of family {family!r} but the config builds {module.family!r}: "
            "pass the config the checkpoint was trained with"
        )
    saved = checkpoint.get("state_dict")
    if not shapes or not isinstance(saved, dict) or not saved:
        return
    own = module.state_dict()
    missing = sorted(set(own) - set(saved))
    unexpected = sorted(set(saved) - set(own))
    wrong = [k for k in own if k in saved and hasattr(saved[k], "shape") and tuple(saved[k].shape) != tuple(own[k].shape)]
    if not (missing or unexpected or wrong):
        return
    theirs = (checkpoint.get("hyper_parameters") or {}).get("backbone") or {}
    ours = asdict(module.backbone)
    differ = ", ".join(f"backbone.{k}: checkpoint {theirs[k]!r}, config {ours[k]!r}"
                       for k in ours if k in theirs and theirs[k] != ours[k])
    if wrong:
        k = wrong[0]
        first = f"{k} has shape {tuple(saved[k].shape)} in the checkpoint but {tuple(own[k].shape)} in the model"
    else:
        first = f"weights {', '.join((missing or unexpected)[:3])} are {'missing from' if missing else 'unexpected in'} the checkpoint"
    raise AttnlabError(
        f"{source} does not fit the model the config builds ({first}"
        + (f"; {differ}" if differ else "") + "): pass the config the checkpoint was trained with"
    )
