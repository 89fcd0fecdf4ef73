"""Latency that holds still: every model timed in the same rounds, interleaved, medians and spread.

Timing one model after another (each its own warm-up, its own minute of machine load) lets two
identical models differ by 2x on a shared machine. Here each round times every model once per batch
size, in an order that rotates from round to round, so a slow spell of the machine falls on all
models alike; the median over rounds is the figure, the quartiles and min-max its spread.

    out = interleaved_latency({"teacher": teacher.logits, "bilstm": student.logits}, texts, rounds=7)
    out["bilstm"]["batch_64"]["median"]          # ms per example, tokenization included
    ratios(out, "teacher")["bilstm"]["batch_1"]  # the teacher's median / the student's

Callers pin threads first (`pin_threads`): torch.set_num_threads, and onnxruntime sessions made
after it use as many (students.student.OnnxStudent).
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Mapping, Optional, Sequence

Predict = Callable[[list[str]], Any]  # a batch of texts → anything (logits); tokenization included

ROUNDS = 7
# Texts per timing: at batch 1 one call per text, at larger batches whole batches of these.
TEXTS_PER_TIMING = {1: 16}
BATCHES_PER_TIMING = 2


def pin_threads(threads: int) -> None:
    """torch's intra-op threads (and so onnxruntime's, for sessions created after this), and one inter-op thread."""
    import torch

    torch.set_num_threads(int(threads))
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # only settable before the first parallel work; the intra-op setting is what counts
        pass


def _spread(samples: Sequence[float]) -> dict[str, Any]:
    q = statistics.quantiles(samples, n=4, method="inclusive") if len(samples) > 1 else [samples[0]] * 3
    return {"median": statistics.median(samples), "q1": q[0], "q3": q[2], "min": min(samples), "max": max(samples),
            "samples": list(samples)}


def _chunks(texts: Sequence[str], batch_size: int) -> list[list[str]]:
    """The batches timed at `batch_size`; fewer texts than they need are repeated to fill them."""
    if not texts:
        raise ValueError("no texts to time")
    n = TEXTS_PER_TIMING.get(batch_size, batch_size * BATCHES_PER_TIMING)
    texts = (list(texts) * (n // len(texts) + 1))[:n]
    return [texts[i:i + batch_size] for i in range(0, n, batch_size)]


def interleaved_latency(predictors: Mapping[str, Predict], texts: Sequence[str], batch_sizes: Sequence[int] = (1, 64),
                        rounds: int = ROUNDS, clock: Callable[[], float] = time.perf_counter,
                        log: Optional[Callable[[str], None]] = None) -> dict[str, dict[str, dict]]:
    """{name: {"batch_B": {median, q1, q3, min, max, samples}}}: milliseconds per example.

    Each round times every predictor on the same texts at each batch size (batch 1: one call per text
    for 16 texts; batch B: two batches of B), in an order rotated by one each round. One untimed
    call per predictor and batch size first: the first calls allocate and pick kernels.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    names = list(predictors)
    chunks = {bs: _chunks(texts, bs) for bs in batch_sizes}
    for bs in batch_sizes:
        for name in names:
            predictors[name](chunks[bs][0])
    samples: dict[str, dict[int, list[float]]] = {name: {bs: [] for bs in batch_sizes} for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for bs in batch_sizes:
            for name in order:
                predict = predictors[name]
                start = clock()
                for chunk in chunks[bs]:
                    predict(chunk)
                elapsed = clock() - start
                samples[name][bs].append(1000.0 * elapsed / sum(len(c) for c in chunks[bs]))
        if log:
            log(f"latency round {r + 1}/{rounds}")
    return {name: {f"batch_{bs}": _spread(samples[name][bs]) for bs in batch_sizes} for name in names}


def ratios(result: Mapping[str, Mapping[str, Mapping[str, Any]]], baseline: str) -> dict[str, dict[str, float]]:
    """{name: {"batch_B": baseline's median / name's median}}: the speed-up over `baseline`."""
    base = result[baseline]
    return {name: {key: base[key]["median"] / cell["median"] for key, cell in by_bs.items()}
            for name, by_bs in result.items()}
