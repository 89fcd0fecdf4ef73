"""Keep a long pipeline process from holding on to memory its batches have freed.

glibc's malloc serves an allocation from the heap unless it is above the mmap threshold, and raises
that threshold (up to 32 MB) each time a large mmapped block is freed. A teacher's forward passes
allocate and free tensors of many sizes (one per batch shape), so after the first few batches they
all come from the heap, which fragments and never shrinks: a `transferset score` run grew by ~4 KB
per row scored (1.8 GB after 91k rows, 4.8 GB after 853k; benchmarks/scale.py) although no Python
object outlived its batch. Fixing the threshold at glibc's own default (128 KiB) hands every large
block back to the system when it is freed: 1.2 GB instead of 1.8 GB after 91k rows, 2.1 GB instead of
4.8 GB after 853k (with the score pipeline's rows out of its grouping too), no slower within the
noise of the runs that measured it. The augment driver and its tagging workers call it as well.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging

LOG = logging.getLogger("transferset")

M_MMAP_THRESHOLD = -3  # mallopt parameter number (malloc.h)
MMAP_THRESHOLD = 128 * 1024

_done = False


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold for this process (once); False where the C library is not glibc."""
    global _done
    if _done:
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl without mallopt, Windows)
        return False
    _done = bool(mallopt(M_MMAP_THRESHOLD, int(threshold)))
    if not _done:
        LOG.debug("mallopt(M_MMAP_THRESHOLD) refused; memory may grow with the rows scored")
    return _done
