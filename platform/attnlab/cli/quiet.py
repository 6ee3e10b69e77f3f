"""Two messages of the libraries underneath that a user of attnlab cannot act on, silenced where
they arise (by their exact text, never a whole category), so that a warning printed during a run
is always one worth reading.

- torch 2.13 deprecates `isinstance(x, LeafSpec)`, which Lightning's own pytree helper still calls.
- Lightning's advertisement for its LitLogger product, logged as INFO at every Trainer start.
"""
from __future__ import annotations

import logging
import warnings

LEAFSPEC = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
LITLOGGER_TIP = "💡 Tip: For seamless cloud logging"


class _DropTip(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(LITLOGGER_TIP)


def silence_library_noise() -> None:
    warnings.filterwarnings("ignore", message=LEAFSPEC)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropTip) for f in logger.filters):
            logger.addFilter(_DropTip())
