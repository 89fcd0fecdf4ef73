"""`transferset export`: a student, or any Hugging Face sequence classifier, as an ONNX directory
(students/compress/export.py)."""
from __future__ import annotations

import argparse
import json
from typing import Sequence

from students.compress.export import FORMATS, INT8_TOLERANCE, OPSET, QUANTIZE, export
from transferset.fs.output import OVERWRITE_HELP
from transferset.models.loading import check_hub_model

EPILOG = """examples:
  transferset export --model runs/sst2/students/bilstm --output runs/sst2/onnx/bilstm --format onnx
  transferset export --model runs/sst2/teacher --output runs/sst2/onnx/teacher
  transferset export --model runs/sst2/teacher --output runs/sst2/onnx/teacher-int8 --quantize int8

OUT: model.onnx (inputs named as the tokenizer names its arrays: input_ids, attention_mask,
token_type_ids where the tokenizer emits them; output logits; dynamic batch and length), the
tokenizer, and config.json with id2label. `transferset predict` / `evaluate --model OUT` run it on
onnxruntime; so do onnxruntime and the tokenizer alone (the snippet in students/compress/export.py).
With --quantize int8, model.onnx is the int8 graph (same inputs and output), kept only when it
agrees with the model on the check sentences; config.json records the tolerance and the difference.
OUT is never a teacher's or a student's folder, --overwrite or not (exit 2): choose another --output."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="`transferset train` output (or its model/), or any Hugging "
                        "Face sequence-classifier directory (e.g. the teacher), local or a URL")
    parser.add_argument("--output", required=True, metavar="OUT", help="output directory (local or a URL)")
    parser.add_argument("--format", default="onnx", choices=FORMATS)
    parser.add_argument("--opset", type=int, default=OPSET, help="ONNX opset version")
    parser.add_argument("--max-length", type=int, default=None,
                        help="tokens per row the saved tokenizer truncates at (default: the student's training "
                             "max_length; for another Hugging Face model its tokenizer's limit)")
    parser.add_argument("--quantize", default=None, choices=QUANTIZE,
                        help="int8: ONNX Runtime's dynamic quantization (int8 weights per channel, uint8 activations) "
                             "of MatMul, LSTM and embeddings; refused (exit 1) unless its logits on the check "
                             f"sentences stay within {INT8_TOLERANCE:g} x the range of the model's logits there and no "
                             "label changes beyond a near tie. Default: float32")
    parser.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def run(args: argparse.Namespace, extra: Sequence[str]) -> int:
    check_hub_model(args.model, what="--model")  # a hub name offline: one line, exit 2, nothing written
    result = export(args.model, args.output, format=args.format, opset=args.opset, max_length=args.max_length,
                    quantize=args.quantize, overwrite=args.overwrite)
    print(json.dumps(result, indent=2))
    return 0
