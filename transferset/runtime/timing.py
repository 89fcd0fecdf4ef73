"""CPU latency per example, measured one way for teachers and students: on one thread, every model in
the same interleaved rounds, with the machine's load recorded beside the figures.

Timing one model after another (each its own warm-up, its own minute of machine load) lets two
identical models differ by 2x on a shared machine. Here each round times every model once per batch
size, in an order that rotates from round to round, so a slow spell of the machine falls on all
models alike; the median over rounds is the figure, the quartiles and min-max its spread.

    out = measure({"teacher": teacher.logits, "bilstm": student.logits}, texts)
    out["latency"]["bilstm"]["batch_64"]["median"]          # ms per example, tokenization included
    ratios(out["latency"], "teacher")["bilstm"]["batch_1"]   # the teacher's median / the student's
    out["conditions"]["busy"], describe(out["conditions"])  # whether the machine let the figures be

One thread (THREADS): a figure that does not depend on how many cores the machine has or how many of
them other work takes; a run on a shared machine with 2 threads printed the teacher at 247 ms/example
and speed-ups of 1.4-4.3x that are 12-18x alone. Even on one thread a busy machine slows every figure
and bends the ratios, so `measure` records the load averages and the share of a core the timed thread
got, and says `busy` when either shows other work competing: callers show that beside the figures
and leave the ratios out.

The ONNX runtime takes its threads when a session is made: load ONNX models inside `torch_threads(THREADS)`
(or after `set_torch_threads(THREADS)`) to time them on one thread too.
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from transferset.runtime.threads import torch_threads

Predict = Callable[[list[str]], Any]  # a batch of texts → anything (logits); tokenization included

ROUNDS = 7
THREADS = 1
# Texts per timing: at batch 1 one call per text, at larger batches whole batches of these.
TEXTS_PER_TIMING = {1: 16}
BATCHES_PER_TIMING = 2
# The timed thread got less of a core than this (process CPU time / wall time): something else ran on it.
BUSY_CPU_SHARE = 0.8


def machine_load() -> Optional[list[float]]:
    """The 1, 5 and 15-minute load averages (runnable threads, machine-wide); None where the OS has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def conditions(*, threads: int, cpu_count: Optional[int], load_before: Optional[Sequence[float]],
               load_after: Optional[Sequence[float]], cpu_share: Optional[float]) -> dict[str, Any]:
    """What a timing was taken under, and whether the machine was `busy`: the 1-minute load average after
    the timing above the CPU count (more runnable threads than cores, ours included), or the timed
    thread given less than BUSY_CPU_SHARE of a core. `busy_because` says which, in words."""
    reasons = []
    if load_after and cpu_count and load_after[0] > cpu_count:
        reasons.append(f"load average {load_after[0]:.2f} on {cpu_count} CPUs")
    if cpu_share is not None and cpu_share < BUSY_CPU_SHARE:
        reasons.append(f"the timed thread got {cpu_share:.0%} of a core")
    return {"threads": threads, "cpu_count": cpu_count,
            "load_average_before": list(load_before) if load_before else None,
            "load_average_after": list(load_after) if load_after else None,
            "cpu_share": None if cpu_share is None else round(cpu_share, 3),
            "busy": bool(reasons), "busy_because": "; ".join(reasons) or None}


def describe(cond: Mapping[str, Any]) -> str:
    """One line for a log or a report: threads, load, and what a busy machine means for the figures."""
    load = cond.get("load_average_after")
    parts = [f"{cond['threads']} thread{'' if cond['threads'] == 1 else 's'}",
             f"load average {load[0]:.2f} on {cond['cpu_count']} CPUs" if load else f"{cond['cpu_count']} CPUs"]
    if cond.get("cpu_share") is not None:
        parts.append(f"{cond['cpu_share']:.0%} of a core for the timed thread")
    line = ", ".join(parts)
    if cond.get("busy"):
        line += (f": the machine was busy ({cond['busy_because']}), so the figures are slower than alone and "
                 "ratios between models are not reliable")
    return line


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
    """{name: {"batch_B": {median, q1, q3, min, max, samples}}}: milliseconds per example, on the threads
    the caller set (`measure` sets THREADS and records the load).

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


def measure(predictors: Mapping[str, Predict], texts: Sequence[str], batch_sizes: Sequence[int] = (1, 64),
            rounds: int = ROUNDS, *, threads: int = THREADS, clock: Callable[[], float] = time.perf_counter,
            cpu_clock: Callable[[], float] = time.process_time,
            load: Callable[[], Optional[list[float]]] = machine_load,
            cpu_count: Optional[int] = None, log: Optional[Callable[[str], None]] = None) -> dict[str, Any]:
    """{"latency": interleaved_latency's result, "conditions": conditions(...)}, timed on `threads` torch
    threads (the caller's count again afterwards)."""
    before = load()
    with torch_threads(threads):
        wall0, cpu0 = clock(), cpu_clock()
        result = interleaved_latency(predictors, texts, batch_sizes, rounds, clock=clock, log=log)
        wall, cpu = clock() - wall0, cpu_clock() - cpu0
    share = cpu / wall if wall > 0 else None
    return {"latency": result,
            "conditions": conditions(threads=threads, cpu_count=cpu_count or os.cpu_count(), load_before=before,
                                     load_after=load(), cpu_share=share)}


def ratios(result: Mapping[str, Mapping[str, Mapping[str, Any]]], baseline: str) -> dict[str, dict[str, float]]:
    """{name: {"batch_B": baseline's median / name's median}}: the speed-up over `baseline`."""
    base = result[baseline]
    return {name: {key: base[key]["median"] / cell["median"] for key, cell in by_bs.items()}
            for name, by_bs in result.items()}
