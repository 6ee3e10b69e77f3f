"""Loading attnlab checkpoints safely (weights_only) into the right family with its tokenizer.

`read_checkpoint` is the one place that opens a checkpoint file a user names (`generate`,
`average`, `attention`, `ablate-heads` and the `--ckpt_path` of fit / validate / test / predict):
always with `torch.load(weights_only=True)`, so a file that would run code when unpickled is
refused, and every other problem (missing, truncated, not attnlab's, another family) is an
AttnlabError naming the file.
"""
from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path

import torch

from attnlab.errors import AttnlabError

# Values Lightning accepts for --ckpt_path that are not file paths.
LIGHTNING_CKPT_ALIASES = ("last", "best", "hpc")


def unpickling_refusal(path, err: BaseException, what: str = "checkpoint") -> AttnlabError:
    """The message for a file torch.load(weights_only=True) refused: it names what would have run."""
    text = str(err)
    found = re.search(r"GLOBAL ([\w.]+)", text) or re.search(r"Unsupported global: ([\w.]+)", text)
    detail = f"it would call {found.group(1)}" if found else (text.splitlines()[0][:200] if text else type(err).__name__)
    return AttnlabError(
        f"{what} {path} holds objects that could run code when loaded ({detail}); refusing it: "
        "attnlab loads checkpoints only with torch.load(weights_only=True); use one written by `attnlab fit`"
    )


def read_checkpoint(path: str | Path, arg: str = "checkpoint", family: str | None = None,
                    map_location: str = "cpu", mmap: bool = False) -> dict:
    """The checkpoint dict at `path`, loaded with weights_only=True, checked to be attnlab's
    (and of `family`, when given); AttnlabError naming `arg` and the file otherwise."""
    from attnlab.modules import FAMILIES

    path = Path(path).expanduser()
    if not path.is_file():
        what = "is a directory, not a checkpoint file" if path.is_dir() else "does not exist"
        raise AttnlabError(f"{arg}: {path} {what}; pass the path of a .ckpt file from a run's checkpoints/ folder")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        raise unpickling_refusal(path, err, what=f"{arg}:") from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as err:
        reason = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise AttnlabError(
            f"{arg}: {path} is truncated or not a torch checkpoint ({reason}); "
            "use a complete .ckpt written by `attnlab fit` (a copy may have been cut short)"
        ) from None
    meta = ckpt.get("attnlab") if isinstance(ckpt, dict) else None
    recorded = meta.get("family") if isinstance(meta, dict) else None
    if recorded is None or not isinstance(ckpt.get("state_dict"), dict) or "hyper_parameters" not in ckpt:
        raise AttnlabError(
            f"{arg}: {path} was not written by attnlab (no model family recorded in it); "
            "use a checkpoint from `attnlab fit`"
        )
    if recorded not in FAMILIES:
        raise AttnlabError(
            f"{arg}: {path} holds a model of family {recorded!r}, which this attnlab does not know "
            f"(it has {', '.join(sorted(FAMILIES))})"
        )
    if family is not None and recorded != family:
        raise AttnlabError(
            f"{arg}: {path} holds a model of family {recorded!r} but the config builds {family!r}: "
            "pass the config the checkpoint was trained with"
        )
    return ckpt


def load_checkpoint(path: str | Path, map_location: str = "cpu"):
    """Return (LightningModule in eval mode with its tokenizer, raw checkpoint dict)."""
    from attnlab.modules import FAMILIES
    from data_modules.tokenizer import Tokenizer

    ckpt = read_checkpoint(path, map_location=map_location)
    meta = ckpt["attnlab"]
    module = FAMILIES[meta["family"]](**ckpt["hyper_parameters"])
    try:
        module.load_state_dict(ckpt["state_dict"])
    except RuntimeError as err:
        raise AttnlabError(f"checkpoint {path}: its weights do not fit its recorded hyper-parameters ({str(err).splitlines()[0]})") from None
    if meta.get("tokenizer"):
        module.tokenizer = Tokenizer.from_proto(meta["tokenizer"])
    return module.eval(), ckpt


def check_ckpt_path_arg(config) -> tuple[Path, dict] | None:
    """`--ckpt_path` of a LightningCLI verb, checked right after parsing (see AttnlabCLI).

    Aliases Lightning resolves itself (last, best, hpc, registry...) and folders (sharded FSDP
    checkpoints) are left to Lightning.
    """
    subcommand = config.get("subcommand") if hasattr(config, "get") else None
    if not subcommand:
        return None
    section = config.get(subcommand)
    ckpt_path = section.get("ckpt_path") if section is not None else None
    if not ckpt_path:
        return None
    path = Path(str(ckpt_path)).expanduser()
    if path.is_dir() or (not path.exists() and (str(ckpt_path) in LIGHTNING_CKPT_ALIASES or str(ckpt_path).startswith("registry"))):
        return None
    return path, read_checkpoint(path, arg="--ckpt_path", family=_config_family(section), mmap=True)


def _config_family(section) -> str | None:
    """The family (`decoder_only` ...) of the model class the parsed config names, if it can tell."""
    import importlib

    model = section.get("model") if section is not None else None
    class_path = model.get("class_path") if model is not None and hasattr(model, "get") else None
    if not class_path or "." not in str(class_path):
        return None
    module_name, _, name = str(class_path).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError):
        return None
    return getattr(cls, "family", None)
