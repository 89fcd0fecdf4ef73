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

oneDNN (torch's CPU kernels) also keeps a cache of up to 1,024 compiled primitives, one per operation
and shape. The packed forward's batches have a new token count nearly every time, so that cache hardly
ever hits and only fills: ~0.3 GB of a scoring worker's memory by the time it is full (~200k rows).
`limit_primitive_cache` caps it for the scoring workers: benchmarks/README.md (scale) has the figures.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

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


ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_CACHE_CAPACITY = 16


def limit_primitive_cache(capacity: int = ONEDNN_CACHE_CAPACITY) -> str:
    """Cap oneDNN's primitive cache for this process unless the environment already sets it; returns the
    value in force. oneDNN reads it when it creates its first primitive: call before the first forward pass."""
    return os.environ.setdefault(ONEDNN_CACHE_ENV, str(int(capacity)))
