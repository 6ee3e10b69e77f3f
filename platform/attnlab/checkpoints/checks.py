"""Whether a checkpoint fits the model about to load it: the one check, for the CLI and for Trainers."""
from __future__ import annotations

from dataclasses import asdict

from attnlab.errors import AttnlabError


def check_fits(module, checkpoint: dict, source: str = "the checkpoint", shapes: bool = True,
               any_family: bool = False, fix: str = "pass the config the checkpoint was trained with") -> None:
    """The one check that a checkpoint fits the module about to load it: the same family (unless
    `any_family`: then only the network, `model.*`, must fit), and (with `shapes`) the same weights
    and sizes. Names the first differing weight and the backbone settings that differ, instead of
    torch's list of every mismatched tensor."""
    family = (checkpoint.get("attnlab") or {}).get("family")
    if family != module.family and not any_family:
        raise AttnlabError(
            f"{source} holds a model of family {family!r} but the config builds {module.family!r}: "
            "pass the config the checkpoint was trained with"
        )
    saved = checkpoint.get("state_dict")
    if not shapes or not isinstance(saved, dict) or not saved:
        return
    own = module.state_dict()
    if any_family:  # the network alone: a family's own buffers (block diffusion's noise range) stay
        own = {k: v for k, v in own.items() if k.startswith("model.")}
        saved = {k: v for k, v in saved.items() if k.startswith("model.")}
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
    whose = f" (a model of family {family!r})" if family != module.family else ""
    raise AttnlabError(
        f"{source}{whose} does not fit the model the config builds ({first}"
        + (f"; {differ}" if differ else "") + f"): {fix}"
    )


def load_network(module, checkpoint: dict, source: str, tokenizer=None) -> None:
    """Start `module` from another checkpoint's network weights (`model.*`), of any family whose
    network has the same weights and shapes (BD3-LM fine-tunes block diffusion from an AR or MDLM
    model), trained with the same tokenizer."""
    check_fits(module, checkpoint, source, any_family=True,
               fix="build the same backbone (sizes, positional encoding) and vocabulary as the checkpoint")
    theirs = (checkpoint.get("attnlab") or {}).get("tokenizer")
    tokenizer = tokenizer if tokenizer is not None else module.tokenizer
    ours = tokenizer.model_proto if tokenizer is not None else None
    if theirs is not None and ours is not None and theirs != ours:
        raise AttnlabError(f"{source} was trained with another tokenizer than this run's data builds: "
                           "start from a checkpoint trained on the same data (and data.init_args.vocab_size)")
    network = {k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items() if k.startswith("model.")}
    module.model.load_state_dict(network)
