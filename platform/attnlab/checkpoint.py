"""Loading attnlab checkpoints safely (weights_only) into the right family with its tokenizer."""
from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import torch

from attnlab.errors import AttnlabError


def load_checkpoint(path: str | Path, map_location: str = "cpu"):
    """Return (LightningModule in eval mode with its tokenizer, raw checkpoint dict)."""
    from attnlab.modules import FAMILIES
    from data_modules.tokenizer import Tokenizer

    path = Path(path)
    if not path.is_file():
        raise AttnlabError(f"checkpoint {path} does not exist: pass the path of a .ckpt file from a run's checkpoints/ folder")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise AttnlabError(
            f"checkpoint {path} holds objects that could run code when loaded; refusing it ({str(err).splitlines()[0]})"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile) as err:
        raise AttnlabError(f"checkpoint {path} is truncated or not a torch checkpoint ({err})") from None
    meta = ckpt.get("attnlab") if isinstance(ckpt, dict) else None
    if not meta or meta.get("family") not in FAMILIES:
        raise AttnlabError(f"checkpoint {path} was not written by attnlab (no family recorded); train one with `attnlab fit`")
    module = FAMILIES[meta["family"]](**ckpt["hyper_parameters"])
    module.load_state_dict(ckpt["state_dict"])
    if meta.get("tokenizer"):
        module.tokenizer = Tokenizer.from_proto(meta["tokenizer"])
    return module.eval(), ckpt
