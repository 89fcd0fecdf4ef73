"""torch's CPU threads, set in one place for every caller (scoring, the MLM, training, predicting, timing).

Oversubscribed threads slow a forward pass by an order of magnitude on a busy machine, and several Beam
workers on one machine must not each use every core: each caller passes the count its setting gives.
onnxruntime sessions made after a call take the same count (students.student.OnnxStudent).
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional


def set_torch_threads(threads: Optional[int]) -> int:
    """torch's intra-op threads to `threads` (None or 0: leave them as they are) and one inter-op thread
    (torch runs no inter-op work for us); → the intra-op count before the call."""
    import torch  # a command that never runs a model never imports torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # settable only before the first parallel work; the intra-op count is what counts
            pass
    return before


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """`threads` intra-op threads for the block, then the caller's count again."""
    before = set_torch_threads(threads)
    try:
        yield
    finally:
        set_torch_threads(before)
