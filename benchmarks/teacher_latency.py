"""Why a teacher timed at batch 64 could be slower per example than at batch 1, and the path the report now times.

The report used to time a teacher through its own forward (Student.from_pretrained on a Hugging Face classifier):
a batch is padded to its longest row, so on rows of mixed length a batch of 64 computes every row at the length of
the longest. The report now times a teacher on the forward pass that scored the transfer set
(transferset.app.report.latency.ScoringTeacher: transferset.teacher.scoring.Teacher, padding-free on CPU for the families
packed.py serves). Both paths are timed here in the same interleaved rounds (transferset.runtime.timing, one
thread, tokenization included) on two sets of rows:

- sst2: the first --rows sentences of SST-2's dev file (short, 5-60 tokens);
- long: the same sentences joined in runs of 1 to 6 (seeded), so rows run from a few tokens to the 128-token cap,
  the mix of a news task.

Printed: ms per example at batch 1 and 64 for each path, batch 64 over batch 1 for each, and the padded path over the
packed one (the baseline, measured in the same run).

    .venv/bin/python benchmarks/teacher_latency.py --teacher runs/demo/teacher
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from students.student import Student  # noqa: E402
from transferset.app.report.latency import ScoringTeacher  # noqa: E402
from transferset.config import DEFAULT_MAX_LENGTH  # noqa: E402
from transferset.runtime.timing import describe, measure  # noqa: E402
from transferset.sources import read_texts  # noqa: E402

SST2_DEV = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "sst2", "dev.tsv")


def long_rows(texts: list[str], seed: int = 0) -> list[str]:
    """The sentences joined in seeded runs of 1 to 6: rows of mixed length up to the token cap."""
    rng, out, i = random.Random(seed), [], 0
    while i < len(texts):
        k = rng.randint(1, 6)
        out.append(" ".join(texts[i:i + k]))
        i += k
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--teacher", required=True, help="a fine-tuned classifier folder (a run's teacher/)")
    p.add_argument("--data", default=SST2_DEV)
    p.add_argument("--rows", type=int, default=128, help="rows of each set timed (batch 64: two batches)")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    sentences = list(read_texts(args.data))
    sets = {"sst2": sentences[:args.rows], "long": long_rows(sentences)[:args.rows]}
    padded = Student.from_pretrained(args.teacher, max_length=DEFAULT_MAX_LENGTH)
    packed = ScoringTeacher(args.teacher)
    out = {"teacher": args.teacher, "scoring_path": packed.runtime, "sets": {}}
    for name, texts in sets.items():
        lengths = [len(ids) for ids in packed.teacher.tokenizer(texts, truncation=True,
                                                                max_length=DEFAULT_MAX_LENGTH)["input_ids"]]
        timed = measure({"padded": padded.logits, "scoring": packed.logits}, texts, batch_sizes=(1, 64),
                        rounds=args.rounds)
        med = {k: {b: v[f"batch_{b}"]["median"] for b in (1, 64)} for k, v in timed["latency"].items()}
        out["sets"][name] = {"rows": len(texts), "tokens_mean": sum(lengths) / len(lengths), "tokens_max": max(lengths),
                             "ms": med, "conditions": timed["conditions"]}
        print(f"{name}: {len(texts)} rows, {sum(lengths) / len(lengths):.1f} tokens on average, at most "
              f"{max(lengths)}; {describe(timed['conditions'])}")
        for path in ("padded", "scoring"):
            print(f"  {path:8s} batch 1 {med[path][1]:7.2f} ms  batch 64 {med[path][64]:7.2f} ms  "
                  f"64/1 {med[path][64] / med[path][1]:.2f}")
        print(f"  padded / scoring: batch 1 {med['padded'][1] / med['scoring'][1]:.2f}x, "
              f"batch 64 {med['padded'][64] / med['scoring'][64]:.2f}x")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
