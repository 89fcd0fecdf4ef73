"""How OpenMP's wait policy changes a training step's time on a quiet and on a busy machine.

torch's CPU threads come from OpenMP (GNU libgomp in the pip wheels), whose threads spin on a core while they
wait for work unless `OMP_WAIT_POLICY=PASSIVE`. On a machine whose cores other processes also want, a spinning
thread holds a core the thread that has the work needs. Each setting runs in its own process (the policy is
read when the OpenMP runtime starts), timing a step of the teacher's size (a 6-layer, 384-wide BERT, 32 rows
of 64 tokens, forward and backward) on every core: alone, then beside one busy process per core.

    .venv/bin/python benchmarks/omp_wait.py [--rounds 3] [--competitor python|torch]

Run it alone: the "quiet" rows need a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

STEP = r"""
import json, os, time, torch
from transformers import BertConfig, BertForSequenceClassification
torch.manual_seed(0)
model = BertForSequenceClassification(BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                                 intermediate_size=1536, vocab_size=30522))
ids = torch.randint(1000, 30000, (32, 64))
labels = torch.randint(0, 2, (32,))
for _ in range(2):
    model(input_ids=ids, labels=labels).loss.backward()
times = []
for _ in range(int(os.environ["STEPS"])):
    t0 = time.perf_counter()
    model(input_ids=ids, labels=labels).loss.backward()
    times.append(time.perf_counter() - t0)
print(json.dumps(times))
"""


def step_seconds(policy: str, steps: int) -> list[float]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    env["STEPS"] = str(steps)
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run([sys.executable, "-c", STEP], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


COMPETITORS = {
    "python": "while True: pass",
    # another training job on one thread, as a second student beside this one
    "torch": "import torch\nx = torch.randn(512, 512)\nwhile True: x = torch.tanh(x @ x)",
}


def busy(cores: int, kind: str) -> list[subprocess.Popen]:
    """One process per core doing `kind` of work: another user's job."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread each
    return [subprocess.Popen([sys.executable, "-c", COMPETITORS[kind]], env=env) for _ in range(cores)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of each setting (default 3)")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per process (default 8)")
    ap.add_argument("--competitor", choices=sorted(COMPETITORS), default="python",
                    help="the busy processes' work: pure Python, or torch on one thread each (default python)")
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} cores, load average before: {os.getloadavg()[0]:.2f}")
    results: dict[tuple[str, str], list[float]] = {}
    for load in ("quiet", "busy"):
        others = busy(cores, args.competitor) if load == "busy" else []
        try:
            time.sleep(1.0 if others else 0.0)
            for _ in range(args.rounds):
                for policy in ("default", "PASSIVE"):
                    results.setdefault((load, policy), []).extend(step_seconds(policy, args.steps))
        finally:
            for p in others:
                p.kill()
    print("| machine | OMP_WAIT_POLICY | median ms per step | min | ratio to default |")
    print("| --- | --- | ---: | ---: | ---: |")
    for load in ("quiet", "busy"):
        base = statistics.median(results[(load, "default")])
        for policy in ("default", "PASSIVE"):
            times = results[(load, policy)]
            med = statistics.median(times)
            print(f"| {load} | {policy} | {med * 1000:.0f} | {min(times) * 1000:.0f} | {med / base:.2f} |")


if __name__ == "__main__":
    main()
