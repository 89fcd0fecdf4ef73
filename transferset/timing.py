"""CPU latency per example, measured the same way for teachers and students."""
from __future__ import annotations

import time
from typing import Callable, Sequence


def ms_per_example(predict: Callable[[list[str]], object], texts: Sequence[str], batch_size: int,
                   limit: int) -> float:
    """Milliseconds per example of `predict` over the first `limit` texts in chunks of `batch_size`.

    One untimed warm-up call first: the first calls allocate and pick kernels.
    """
    texts = list(texts[:limit])
    if not texts:
        return float("nan")
    predict(texts[:batch_size])
    start = time.perf_counter()
    for i in range(0, len(texts), batch_size):
        predict(texts[i:i + batch_size])
    return (time.perf_counter() - start) * 1000.0 / len(texts)
