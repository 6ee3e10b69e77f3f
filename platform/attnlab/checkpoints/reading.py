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


ZIP_MAGIC, PICKLE_PROTOCOL = b"PK\x03\x04", 0x80  # torch.save's zip format; its legacy pickle format


def would_run_code(err: BaseException) -> str | None:
    """The callable a file names when torch.load(weights_only=True) refused it for running code, if so."""
    text = str(err)
    found = re.search(r"GLOBAL ([\w.]+)", text) or re.search(r"Unsupported global: ([\w.]+)", text)
    return found.group(1) if found else None


def unpickling_refusal(path, err: BaseException, what: str = "checkpoint") -> AttnlabError:
    """The message for a file torch.load(weights_only=True) refused: it names what would have run,
    or says the file is not a checkpoint at all (torch's unpickler also fails on any other bytes)."""
    name = would_run_code(err)
    if name is None:
        return not_a_checkpoint(path, str(err) or type(err).__name__, what)
    detail = f"it would call {name}"
    return AttnlabError(
        f"{what} {path} holds objects that could run code when loaded ({detail}); refusing it: "
        "attnlab loads checkpoints only with torch.load(weights_only=True); use one written by `attnlab fit`"
    )


def not_a_checkpoint(path, reason: str, what: str = "checkpoint") -> AttnlabError:
    reason = reason.splitlines()[0][:200]
    return AttnlabError(
        f"{what} {path} is truncated or not a torch checkpoint ({reason}); "
        "use a complete .ckpt written by `attnlab fit` (a copy may have been cut short)"
    )


def _sniff(path: Path) -> str | None:
    """Why a file cannot be a torch checkpoint, from its first bytes (None: it may be one)."""
    with path.open("rb") as f:
        head = f.read(64)
    if head.startswith(ZIP_MAGIC) or (head and head[0] == PICKLE_PROTOCOL):
        return None
    if not head:
        return "the file is empty"
    try:
        return f"it is text, starting {head.decode('utf-8').splitlines()[0][:40]!r}"
    except UnicodeDecodeError:
        return f"its first bytes {head[:8]!r} are neither a zip archive nor a pickle"


def read_checkpoint(path: str | Path, arg: str = "checkpoint", map_location: str = "cpu", mmap: bool = False,
                    sharded: bool = False) -> dict:
    """The checkpoint dict at `path`, loaded with weights_only=True and checked to be attnlab's
    (whether it fits a model is `check_fits`); AttnlabError naming `arg` and the file otherwise.
    With `sharded`, a sharded checkpoint folder gives its newest complete step's meta.pt: all
    but the tensors (an empty state_dict), for the checks a resume makes before loading it."""
    from attnlab.checkpoints import sharded_steps
    from attnlab.families import FAMILIES

    path = Path(path).expanduser()
    step = sharded_steps.newest(path) if sharded and path.is_dir() else None
    if step is not None:
        path = step / sharded_steps.META
    if not path.is_file():
        what = "is a directory, not a checkpoint file" if path.is_dir() else "does not exist"
        raise AttnlabError(f"{arg}: {path} {what}; pass the path of a .ckpt file from a run's checkpoints/ folder")
    not_torch = _sniff(path)
    if not_torch:
        raise not_a_checkpoint(path, not_torch, what=f"{arg}:")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        raise unpickling_refusal(path, err, what=f"{arg}:") from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError, zipfile.BadZipFile) as err:
        raise not_a_checkpoint(path, str(err) or type(err).__name__, what=f"{arg}:") from None
    meta = ckpt.get("attnlab") if isinstance(ckpt, dict) else None
    recorded = meta.get("family") if isinstance(meta, dict) else None
    if step is not None:
        ckpt.setdefault("state_dict", {})  # the tensors stay in the shards
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
    _read_as_now(ckpt["hyper_parameters"])
    return ckpt


def _read_as_now(hyper_parameters: dict) -> None:
    """A setting an earlier attnlab recorded that this one no longer has: generation.compile "auto"
    (once the default) reads as false, decoding eagerly unless compiling is asked for."""
    generation = hyper_parameters.get("generation")
    if isinstance(generation, dict) and generation.get("compile") == "auto":
        generation["compile"] = False


def load_checkpoint(path: str | Path, map_location: str = "cpu"):
    """Return (LightningModule in eval mode with its tokenizer, raw checkpoint dict)."""
    from attnlab.families import FAMILIES
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
    module.plain_lm = bool(meta.get("plain_lm", False))
    return module.eval(), ckpt


def is_sharded_checkpoint(path: Path) -> bool:
    """A folder written by torch.distributed.checkpoint (FSDP's state_dict_type: sharded)."""
    return path.is_dir() and (path / ".metadata").is_file()


def check_ckpt_path_arg(config) -> tuple[Path, dict] | None:
    """`--ckpt_path` of a LightningCLI verb, checked right after parsing (see AttnlabCLI).

    Aliases Lightning resolves itself (last, best, hpc, registry...) and sharded FSDP checkpoint
    folders are left to Lightning; any other folder is refused here.
    """
    subcommand = config.get("subcommand") if hasattr(config, "get") else None
    if not subcommand:
        return None
    section = config.get(subcommand)
    ckpt_path = section.get("ckpt_path") if section is not None else None
    if not ckpt_path:
        return None
    path = Path(str(ckpt_path)).expanduser()
    if is_sharded_checkpoint(path) or (not path.exists() and (str(ckpt_path) in LIGHTNING_CKPT_ALIASES
                                                               or str(ckpt_path).startswith("registry"))):
        return None
    return path, read_checkpoint(path, arg="--ckpt_path", mmap=True)
