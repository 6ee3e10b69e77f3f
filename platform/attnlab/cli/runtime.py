"""Process-wide settings that make CPU runs faster.

glibc returns every large freed block to the kernel and maps it again on the next allocation,
so a training or beam-search step that allocates (batch x vocabulary) tensors spends much of
its time in page faults, in system time. Raising the mmap / trim thresholds keeps freed memory
in the process for reuse. Set ATTNLAB_KEEP_MALLOC=1 to leave the allocator alone.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
KEEP = 1 << 30  # 1 GiB


def tune_allocator() -> bool:
    """Apply the glibc thresholds; True when applied (Linux with glibc), False elsewhere."""
    if os.environ.get("ATTNLAB_KEEP_MALLOC") == "1":
        return False
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl)
        return False
    ok = all(mallopt(option, KEEP) == 1 for option in (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, M_TOP_PAD))
    return ok
