"""`transferset evaluate`: accuracy of a trained student, or of any Hugging Face sequence classifier
(e.g. the teacher), and agreement with the teacher when the data holds its labels."""
from __future__ import annotations

import argparse
import json
from typing import Optional

from transferset.sources import DEFAULT_LABEL_COLUMN

EPILOG = """\
DATA is a labeled file (TSV/CSV/JSONL/Parquet) or a transferset Parquet set; when it holds teacher
columns (a scored set), the student's agreement with the teacher's labels is printed too.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="output directory of `transferset train` (or its model/), "
                        "or any Hugging Face sequence-classifier directory (e.g. of `transferset teacher`)")
    parser.add_argument("--data", required=True, help="labeled data or a scored transfer set")
    parser.add_argument("--text-column", default=None, help="text column of a labeled file (default sentence, else text)")
    parser.add_argument("--label-column", default=DEFAULT_LABEL_COLUMN, help="label column of a labeled file")
    parser.add_argument("--text-b-column", default=None, help="second text column of a labeled file (sentence pairs)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--max-length", type=int, default=None,
                        help="tokens per row (default: a student's training max_length; for another Hugging Face "
                        "model its tokenizer's model_max_length, at most its position embeddings)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def evaluate(model_path: str, data_path: str, *, text_column=None, label_column: str = DEFAULT_LABEL_COLUMN,
             text_b_column=None, batch_size: int = 256,
             max_length: Optional[int] = None) -> dict:
    from students.losses import NO_LABEL
    from students.data import read_eval_data
    from students.student import accuracy, load_student

    from students.trainer import require_input

    from transferset import fs
    from transferset.teacher.remote import local_teacher

    require_input(data_path, "--data")
    # A model directory on remote storage is copied once into the local cache.
    student = load_student(local_teacher(model_path) if fs.is_remote(model_path) else model_path,
                           max_length=max_length)
    data = read_eval_data(data_path, student.label_names, text_column=text_column, label_column=label_column,
                          text_b_column=text_b_column)
    pred = student.predict(data.texts, data.texts_b, batch_size=batch_size)
    out = {"data": data_path, "rows": len(data.texts),
           "labeled_rows": int((data.labels != NO_LABEL).sum()),
           "accuracy": accuracy(pred, data.labels)}
    if data.teacher_labels is not None:
        out["teacher_agreement"] = float((pred == data.teacher_labels).mean())
    return out


def run(args: argparse.Namespace, extra) -> int:
    result = evaluate(args.model, args.data, text_column=args.text_column, label_column=args.label_column,
                      text_b_column=args.text_b_column, batch_size=args.batch_size, max_length=args.max_length)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"accuracy {result['accuracy']:.4f} ({result['labeled_rows']} labeled rows of {result['rows']})")
    if "teacher_agreement" in result:
        print(f"teacher agreement {result['teacher_agreement']:.4f} ({result['rows']} rows)")
    return 0
