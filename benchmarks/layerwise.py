"""Benchmark: what the online teacher of the layer losses costs per training row (students/losses/online.py).

One scored set, one student (k layers cut from the teacher), the same seeded batches in every mode; each mode
trains its own copy of the student for the same epochs, modes interleaved epoch by epoch so that a change in
the machine's load hits them alike:

- logits: KL on the cached logits only (the teacher never runs);
- tinybert: + embedding, hidden and attention-score MSE on every mapped layer (the teacher runs alongside);
- minilm: + the last layer's attention and value-relation KL (the teacher runs alongside);
- teacher only: the online teacher's forward on the same batches, no student (its share of the above).

    .venv/bin/python benchmarks/layerwise.py                        # packaged MiniLM teacher, 1,000 SST-2 rows
    .venv/bin/python benchmarks/layerwise.py --teacher runs/demo/teacher --rows 2000 --layers 2

Without --teacher, the packaged MiniLM encoder with an untrained classification head stands in (6 layers x
384): the figures are timings, no accuracy is reported. The load average is printed with them: on a shared
machine, compare modes of one run, not runs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from train import SST2, load_teacher, write_scored  # noqa: E402

from students import trainer  # noqa: E402
from students.build import setup  # noqa: E402
from students.families import transformer_layers  # noqa: E402
from students.losses import LossWeights  # noqa: E402
from students.phases import phases  # noqa: E402
from transferset import sources  # noqa: E402
from transferset.config import StudentConfig  # noqa: E402
from transferset.runtime import typed  # noqa: E402
from transferset.runtime.threads import set_torch_threads  # noqa: E402

MODES = {
    "logits": {"losses": {"kd": 1.0}},
    "tinybert": {"losses": {"kd": 1.0, "emb_mse": 1.0, "hidden_mse": 1.0, "att_mse": 1.0}},
    "minilm": {"losses": {"kd": 1.0, "att_kl": 1.0, "value_kl": 1.0}, "layer_map": "last-1"},
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teacher", default=None, help="fine-tuned teacher directory (default: packaged MiniLM)")
    ap.add_argument("--data", default=str(SST2), help="directory with train.tsv")
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=2, help="epochs timed per mode")
    ap.add_argument("--layers", type=int, default=3, help="student layers (skip init)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--output", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    set_torch_threads(args.threads)
    spec = sources.SourceSpec(path=os.path.join(args.data, "train.tsv"), label_names=("0", "1"), limit=args.rows)
    examples = [r for r in sources.read_source(spec) if isinstance(r, sources.Example)]
    teacher, teacher_dir = load_teacher(args.teacher, args.max_length)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        scored = os.path.join(tmp, "scored")
        write_scored(Path(scored), examples, teacher, teacher_dir)
        runs = {}
        for mode, values in MODES.items():
            cfg = typed.load(StudentConfig, {"student": "transformer", "threads": args.threads, "optim": {"lr": 1e-4},
                                             "batch_size": args.batch_size, "model": {"n_layer": args.layers},
                                             **values}, mode)
            s = setup(cfg, scored)
            weights = LossWeights.of(cfg)
            # one joint phase: every group and the online W_h learn (students.trainer.set_trainable)
            runs[mode] = (s, weights, phases("joint", weights, 1, s.family.param_groups(s.model).keys())[0])
        seconds = {m: [] for m in [*MODES, "teacher only"]}
        rows = 0
        for epoch in range(args.epochs):
            for mode, (s, weights, phase) in runs.items():
                t0 = time.perf_counter()
                batches = list(trainer.train_batches(s, scored, seed=epoch))
                trainer.fit(s, phase, batches)  # the recipe's steps, as `transferset train` takes them
                seconds[mode].append(time.perf_counter() - t0)
                rows = sum(len(b["ids"]) for b in batches)
            s = runs["tinybert"][0]
            t0 = time.perf_counter()
            with torch.no_grad():
                for batch in trainer.train_batches(s, scored, seed=epoch):
                    transformer_layers.forward(s.online.teacher, batch["ids"], batch["mask"], batch["type_ids"],
                                        states=[t for _, t in s.online.pairs])
            seconds["teacher only"].append(time.perf_counter() - t0)
    best = {m: min(v) for m, v in seconds.items()}
    res = {
        "rows_per_epoch": rows, "threads": args.threads, "batch_size": args.batch_size, "student_layers": args.layers,
        "teacher": teacher_dir, "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "epoch_seconds": seconds,
        "rows_per_second": {m: rows / b for m, b in best.items()},
        "ms_per_row": {m: 1000 * b / rows for m, b in best.items()},
        "slowdown_vs_logits": {m: best[m] / best["logits"] for m in MODES},
    }
    print(json.dumps(res, indent=2))
    if args.output:
        Path(args.output).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
