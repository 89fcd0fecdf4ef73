"""Export a student, or any Hugging Face sequence classifier (e.g. the teacher), to ONNX (`transferset export`).

    transferset export --model runs/sst2/students/bilstm --output runs/sst2/onnx/bilstm --format onnx

OUT holds model.onnx (dynamic batch and sequence length, opset 17), the tokenizer (save_pretrained,
truncating at the student's max_length) and config.json with id2label as Hugging Face writes it. The
graph's inputs are named as the tokenizer names its outputs (input_ids, attention_mask and
token_type_ids where the tokenizer emits them; the BiLSTM accepts token_type_ids and ignores them),
its output is `logits`, so onnxruntime and the tokenizer run it without transferset:

    import json
    import onnxruntime as ort
    from transformers import AutoTokenizer

    d = "runs/sst2/onnx/bilstm"                      # the --output of `transferset export`
    tokenizer = AutoTokenizer.from_pretrained(d)
    id2label = json.load(open(f"{d}/config.json"))["id2label"]
    session = ort.InferenceSession(f"{d}/model.onnx")
    batch = tokenizer(["a gripping film", "dull"], truncation=True, padding=True, return_tensors="np")
    logits = session.run(None, dict(batch))[0]       # (N, C)
    print([id2label[str(i)] for i in logits.argmax(-1)])

`Student.from_pretrained(OUT)`, `transferset evaluate --model OUT` and `transferset predict --model OUT`
take the directory too (students/student.py: OnnxStudent). Every export is checked before it is
kept: onnxruntime's logits on a few sentences and pairs must match PyTorch's within TOLERANCE.

`--quantize int8` (INT8 below) quantizes that checked float32 graph with ONNX Runtime's dynamic
quantization and keeps it as model.onnx in place of the float32 one, so every reader above takes it
unchanged; it is checked again, against PyTorch, with a tolerance of its own. A graph the check refuses
is quantized again the next way of INT8_VARIANTS (MatMul alone, 8-bit weights) and checked again; the
config's `quantization.variant` says which was kept, `refused_before` why the earlier ones were not.

Why the TorchScript-based exporter (dynamo=False): the dynamo exporter needs onnxscript (not a
dependency), and the traced graphs below run in onnxruntime and match PyTorch to ~1e-6.
"""
from __future__ import annotations

import inspect
import json
import logging
import os
import shutil
import tempfile
import warnings
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn as nn

from students.data.tokens import WordPieceTokens
from students.student import EXPORT_KEY, ONNX_FILE, OnnxStudent, Student
from transferset import __version__, fs
from transferset.contract import schema
from transferset.data.card import write_card
from transferset.fs.output import MODEL_NAMES, WHAT, Output
from transferset.fs.remote import local_teacher
from transferset.runtime.errors import ConfigError, UserError

FORMATS = ("onnx",)
QUANTIZE = ("int8",)
OPSET = 17
# The commands whose folder holds a model of their own (weights, metrics): an export never replaces one.
MODEL_COMMANDS = ("teacher", "train", "prune", "exits")
TOLERANCE = 1e-4  # max |logit difference| between onnxruntime and PyTorch on CHECK_TEXTS, per unit of logit
TOKENIZER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT = "logits"
# Sentences of several lengths (padding inside a batch must not leak into a row) and pairs.
CHECK_TEXTS = [
    "a gripping, beautifully acted film",
    "dull",
    "it 's a charming and often affecting journey , though the second half drags on far too long "
    "and the ending feels unearned .",
    "not bad at all",
]
CHECK_PAIRS = ["the film is good", None, "a short second text", "the story"]

# int8: ONNX Runtime's dynamic quantization (onnxruntime.quantization.quantize_dynamic). Weights int8,
# per output channel (one scale per row of a weight matrix: per tensor was 3x further from PyTorch on
# the MiniLM teacher below); activations uint8 with a scale computed per tensor at run time, so no
# calibration set. reduce_range (7-bit weights): on x86 without VNNI (AVX2, this project's machine)
# the uint8 x int8 kernel (VPMADDUBSW) sums pairs of products in int16 and saturates with full-range
# weights; 7 bits cannot overflow. Max |logit difference| on 100 SST-2 dev rows, 8 → 7 bits: the tiny
# test transformers 0.29 → 0.09 (a 2-layer student), 0.47 → 0.16 (its teacher); the MiniLM teacher
# below 0.62 → 0.67 (no change beyond noise). ONNX Runtime's own advice for this saturation.
# Quantized: MatMul (every linear layer of a transformer: MatMulInteger), LSTM (DynamicQuantizeLSTM:
# its input and recurrent weights in int8), Gather (embedding tables stored in int8, dequantized
# row by row: most of a BiLSTM's file). Gemm (the BiLSTM's small head), LayerNorm, softmax and
# the activations stay float32.
INT8_OPS = ("MatMul", "LSTM", "Gather")
# The int8 check, against PyTorch on the same probe rows as the float32 one (alone and as pairs, batched
# and one row at a time: 16 rows), in units of the range of PyTorch's logits there (largest - smallest, at
# least 1). Sound int8 MiniLM-L6 SST-2 teachers differ by 0.04-0.14 of that range (accuracy on SST-2 dev
# unchanged or higher), the test models by 0.001-0.048 (tests/students/test_export_int8.py); weights
# quantized per tensor instead of per channel do harm (0.32-0.37, up to -3.4 accuracy), and a broken graph
# (saturation, a wrong scale) errs by the size of the logits themselves. INT8_TOLERANCE sits between the
# two. No probe row may change its label unless PyTorch's margin between its two best classes is under
# INT8_TIE of the range: a flip on a near tie is quantization noise, a flip beyond it a changed prediction.
# The measurements behind these figures: docs/history.md, "int8".
INT8_TOLERANCE = 0.20
INT8_TIE = 0.02
# The quantizations tried in order; the first whose graph passes the check is kept. The second is for a
# model the first changes too much (a MiniLM SST-2 teacher at 0.644 of its range: MatMul alone in 8-bit
# weights, its embeddings float32, gave 0.512 with no label changed and kept its test accuracy).
INT8_VARIANTS = ({"ops": INT8_OPS, "reduce_range": True},
                 {"ops": ("MatMul",), "reduce_range": False})


class HFGraph(nn.Module):
    """A Hugging Face sequence classifier called with the tokenizer's named arrays → logits."""

    def __init__(self, model: nn.Module, input_names: Sequence[str]):
        super().__init__()
        self.model = model
        self.input_names = list(input_names)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.input_names, inputs))).logits


def tokenizer_inputs(tokenizer) -> list[str]:
    """The arrays `tokenizer(texts)` returns, among those a graph takes, in TOKENIZER_INPUTS order."""
    emitted = set(tokenizer(["a"], ["b"], return_tensors="np").keys())
    return [name for name in TOKENIZER_INPUTS if name in emitted]


def graph_of(student: Student) -> tuple[nn.Module, list[str], list[str]]:
    """→ (module to trace, the inputs it takes, the inputs the graph declares: the tokenizer's)."""
    tokens = student.tokens
    if not isinstance(tokens, WordPieceTokens):
        raise UserError(f"export: this {student.family.name} student uses `vocab: {{tokens: {tokens.kind}}}`, which has no "
                        "Hugging Face tokenizer to save beside the graph; export a student trained with "
                        "`vocab: {tokens: wordpiece}` (the default)")
    declared = tokenizer_inputs(tokens.tokenizer)
    if student.family.export_graph is not None:  # the family's own graph (the BiLSTM's: students/families/bilstm_onnx.py)
        return student.family.export_graph(student.model, tokens).eval(), ["input_ids", "attention_mask"], declared
    takes = inspect.signature(student.model.forward).parameters
    used = [name for name in declared if name in takes]
    return HFGraph(student.model, used).eval(), used, declared


def _declare_unused_inputs(path: str, declared: Sequence[str], used: Sequence[str]) -> None:
    """Add the inputs the tokenizer emits but the graph ignores (the BiLSTM's token_type_ids): the exporter
    drops unused inputs, and `session.run(None, dict(tokenizer(...)))` must find every name it feeds."""
    missing = [name for name in declared if name not in used]
    if not missing:
        return
    import onnx

    model = onnx.load(path)
    for name in missing:
        model.graph.input.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.INT64,
                                                                    ["batch", "sequence"]))
    onnx.save(model, path)


def _config(student: Student, declared: Sequence[str], opset: int, source: str, max_abs_diff: float,
            int8: Optional[dict] = None) -> dict:
    """config.json: Hugging Face's own config for a Hugging Face model, else id2label / label2id; both with
    what the export records (EXPORT_KEY)."""
    names = student.label_names
    config = student.model.config
    base = json.loads(config.to_json_string()) if hasattr(config, "to_json_string") else {}
    base.update({"id2label": {str(i): n for i, n in enumerate(names)},
                 "label2id": {n: i for i, n in enumerate(names)}, "num_labels": len(names)})
    base[EXPORT_KEY] = {"format": "onnx", "file": ONNX_FILE, "family": student.family.name,
                        "max_length": student.tokens.max_length, "inputs": list(declared), "output": OUTPUT,
                        "opset": opset, "source": source, "check_max_abs_diff": max_abs_diff,
                        "quantize": None, "parameters": student.num_parameters(), "library_version": __version__}
    if int8 is not None:
        base[EXPORT_KEY].update(int8)
    return base


def check_export(student: Student, exported: OnnxStudent) -> tuple[float, float]:
    """(max |logit difference| between onnxruntime and PyTorch, max |logit|) on CHECK_TEXTS, alone, batched
    and as pairs."""
    diffs, scale = [], 0.0
    for texts_b in (None, CHECK_PAIRS):
        ref = student.logits(CHECK_TEXTS, texts_b)
        scale = max(scale, float(np.abs(ref).max()))
        diffs.append(np.abs(exported.logits(CHECK_TEXTS, texts_b) - ref).max())
        diffs.append(np.abs(exported.logits(CHECK_TEXTS[:1], texts_b and texts_b[:1]) - ref[:1]).max())
    return float(max(diffs)), scale


def quantize_int8(src: str, dst: str, ops: Sequence[str] = INT8_OPS, reduce_range: bool = True) -> dict[str, int]:
    """Quantize the float32 graph at `src` into `dst` (`ops`, dynamic, int8 weights per channel, 7-bit with
    `reduce_range`); → how many nodes of each integer kind the graph holds (e.g. {"DynamicQuantizeLSTM": 1})."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # quantize_dynamic logs on the root logger (installing a stderr handler when there is none) its advice to
    # run quant_pre_process first; the exporter has already folded the graph, and every MatMul and LSTM of
    # our graphs is quantized without it (the MiniLM teacher: 38 MatMulInteger, all its linear layers).
    root, null, before = logging.getLogger(), logging.NullHandler(), logging.root.manager.disable
    root.addHandler(null)
    logging.disable(logging.WARNING)
    try:
        quantize_dynamic(src, dst, op_types_to_quantize=list(ops), per_channel=True, reduce_range=reduce_range,
                         weight_type=QuantType.QInt8)
    finally:
        logging.disable(before)
        root.removeHandler(null)
    kinds: dict[str, int] = {}
    for node in onnx.load(dst).graph.node:
        if node.op_type.startswith("DynamicQuantize") or node.op_type in ("MatMulInteger", "DequantizeLinear"):
            kinds[node.op_type] = kinds.get(node.op_type, 0) + 1
    return dict(sorted(kinds.items()))


def _variant_name(variant: dict) -> str:
    bits = "7-bit" if variant["reduce_range"] else "8-bit"
    return f"{'+'.join(variant['ops'])} with {bits} weights"


def check_int8(student: Student, exported: OnnxStudent) -> dict:
    """The int8 graph against PyTorch on CHECK_TEXTS (alone and as pairs, batched and one row at a time):
    max |logit difference|, the range of PyTorch's logits (largest - smallest, over every row and class), and
    the probe rows whose label changed."""
    diff, lo, hi, rows, flips = 0.0, float("inf"), float("-inf"), 0, []
    for texts_b in (None, CHECK_PAIRS):
        ref = student.logits(CHECK_TEXTS, texts_b)
        lo, hi = min(lo, float(ref.min())), max(hi, float(ref.max()))
        # One row at a time, against PyTorch one row at a time: a None beside pairs is an empty second text
        # in a batch and no second text alone, so the inputs differ from the batched ones.
        singles = [([t], texts_b and [texts_b[i]]) for i, t in enumerate(CHECK_TEXTS)]
        ref_one = np.concatenate([student.logits(*row) for row in singles])
        lo, hi = min(lo, float(ref_one.min())), max(hi, float(ref_one.max()))
        runs = ((ref, exported.logits(CHECK_TEXTS, texts_b)),
                (ref_one, np.concatenate([exported.logits(*row) for row in singles])))
        for ref_run, run in runs:
            diff = max(diff, float(np.abs(run - ref_run).max()))
            for i, (r, g) in enumerate(zip(ref_run, run)):
                rows += 1
                top = np.sort(r)[::-1]
                margin = float(top[0] - top[1]) if len(top) > 1 else float("inf")
                if int(r.argmax()) != int(g.argmax()):
                    flips.append({"text": CHECK_TEXTS[i], "text_b": texts_b and texts_b[i],
                                  "pytorch": student.label_names[int(r.argmax())],
                                  "int8": student.label_names[int(g.argmax())], "margin": margin})
    return {"max_abs_diff": diff, "range": hi - lo, "rows": rows, "flips": flips}


class Int8Refused(UserError):
    """No int8 graph of the model passed the check (its message says by how much); nothing was written."""


def refuse_int8(model_path: str, check: dict) -> Optional[str]:
    """Why the int8 graph is not kept (None: it is), from check_int8's result."""
    return _int8_refusal(model_path, int8_problems(check))


def _int8_refusal(model_path: str, problems: list[str]) -> Optional[str]:
    if not problems:
        return None
    return (f"export: the int8 graph of {model_path} does not agree with the model: " + "; ".join(problems)
            + ". Nothing was written; export it in float32 (without --quantize), which keeps its predictions")


def int8_problems(check: dict) -> list[str]:
    """What check_int8's result shows wrong with the int8 graph (empty: nothing)."""
    unit = max(1.0, check["range"])
    allowed = INT8_TOLERANCE * unit
    problems = []
    if not check["max_abs_diff"] <= allowed:
        problems.append(f"its logits differ from PyTorch's by up to {check['max_abs_diff']:.3g} where {allowed:.3g} "
                        f"is allowed ({INT8_TOLERANCE:g} of the check logits' range, {check['range']:.3g})")
    changed = [f for f in check["flips"] if f["margin"] >= INT8_TIE * unit]
    if changed:
        f = changed[0]
        problems.append(f"{len(changed)} of {check['rows']} check rows change label, e.g. {f['text']!r}"
                        + (f" / {f['text_b']!r}" if f["text_b"] else "")
                        + f": {f['pytorch']} in PyTorch (margin {f['margin']:.3g}), {f['int8']} in int8")
    return problems


def export(model_path: str, output: str, *, format: str = "onnx", opset: int = OPSET,
           max_length: Optional[int] = None, quantize: Optional[str] = None, overwrite: bool = False) -> dict:
    """Export the model at `model_path` (a `transferset train` output, its model/, or any Hugging Face
    sequence-classifier directory; local or a URL) to `output` (local or a URL); → what was written."""
    if format not in FORMATS:
        raise UserError(f"export: unknown --format {format!r}; known: {', '.join(FORMATS)}")
    if quantize is not None and quantize not in QUANTIZE:
        raise UserError(f"export: unknown --quantize {quantize!r}; known: {', '.join(QUANTIZE)}")
    # A folder holding a model (a teacher's config.json and tokenizer) is refused like every output.
    out = Output(output, "export", names=MODEL_NAMES, overwrite=overwrite, inputs=[model_path])
    refuse_a_model_folder(out)
    with out.writing():
        result = _export(model_path, out, format=format, opset=opset, max_length=max_length, quantize=quantize)
    return result


def refuse_a_model_folder(out: Output) -> None:
    """A teacher's or a student's folder is never an export's to replace, --overwrite or not (its weights and
    metrics would go): one usage error naming what it holds, before anything is changed. Told by its record
    (the command that wrote it) or, with no record, by a model's files (config.json, a student's sidecar or
    model/ folder) without an ONNX graph."""
    try:
        if not fs.isdir(out.path):
            return
        manifest = out.manifest()
        names = {fs.basename(p) for p in fs.listdir(out.path)}
    except UserError:  # a URL fsspec cannot read: the protocol says what it does with it
        return
    command = manifest["command"] if manifest is not None else None
    model_files = sorted(names & {schema.HF_CONFIG_FILE, schema.STUDENT_SIDECAR_FILE, schema.STUDENT_MODEL_DIR})
    if command in MODEL_COMMANDS:
        what = f"{WHAT.get(command, 'a model')} written by `transferset {command}`"
    elif command != "export" and ONNX_FILE not in names and model_files:
        what = f"a model ({', '.join(model_files)})"
    else:
        return
    raise ConfigError(f"--output {out.path} holds {what}: an export never replaces a teacher or student folder; "
                      f"choose another --output (e.g. {out.path.rstrip('/')}-onnx)")


def _export(model_path: str, out: Output, *, format: str, opset: int, max_length: Optional[int],
            quantize: Optional[str] = None) -> dict:
    output = out.path
    student = Student.from_pretrained(local_teacher(model_path) if fs.is_remote(model_path) else model_path,
                                      max_length=max_length)
    if not isinstance(student, Student):
        raise UserError(f"{model_path} is already an ONNX export; pass the directory it was exported from")
    if student.exits is not None:
        # A row's depth is decided while it runs (rows leave the batch between layers): one graph cannot
        # hold that, and a graph per layer segment with a driver loop is not built.
        raise UserError(f"{model_path}: a model with early exits ({schema.EXITS_FILE}); they run in PyTorch only "
                        "(`transferset evaluate` / `predict --speed`, Student.from_pretrained): a row's depth is "
                        "decided while it runs, which one ONNX graph cannot express. To export the model without "
                        "exits, pass the model the exits were trained on (`transferset exits --model`)")
    graph, used, declared = graph_of(student)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, ONNX_FILE)
        _trace(student, graph, used, path, opset)
        _declare_unused_inputs(path, declared, used)
        _save_tokenizer(student, tmp)
        diff = _check_float32(student, tmp, model_path)
        int8 = _quantize_int8(student, tmp, model_path, diff) if quantize == "int8" else None
        with open(os.path.join(tmp, schema.HF_CONFIG_FILE), "w", encoding="utf-8") as fh:
            json.dump(_config(student, declared, opset, model_path, diff, int8), fh, indent=2)
        out.prepare()  # the export was checked: only now is anything under OUT changed
        with out.local() as work:
            for name in os.listdir(tmp):
                shutil.copy2(os.path.join(tmp, name), os.path.join(work, name))
            write_card(work, shown_as=output)  # README.md: the source's card, with what the export changed
    result = {"output": output, "format": format, "family": student.family.name, "inputs": declared,
              "output_name": OUTPUT, "opset": opset, "labels": student.label_names,
              "check_max_abs_diff": diff, "onnx_bytes": fs.size(fs.join(output, ONNX_FILE)), "quantize": quantize}
    if int8 is not None:
        result.update({k: int8[k] for k in ("check_max_abs_diff", "check_tolerance", "check_labels_changed",
                                            "fp32_check_max_abs_diff", "fp32_bytes")})
        result["int8_nodes"] = int8["quantization"]["nodes"]
    return result


def _trace(student: Student, graph: nn.Module, used: Sequence[str], path: str, opset: int) -> None:
    """Write `graph` as ONNX to `path`, batch and sequence length dynamic.

    Traced on a padded batch of pairs: every branch that padding or a second segment takes is in the graph.
    """
    example = student.tokens.tokenizer(CHECK_TEXTS[:2], ["the film is good", "a short second text"], padding=True,
                                       return_tensors="pt")
    axes = {name: {0: "batch", 1: "sequence"} for name in used}
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(graph, tuple(example[name] for name in used), path, input_names=used,
                          output_names=[OUTPUT], dynamic_axes={**axes, OUTPUT: {0: "batch"}},
                          opset_version=opset, dynamo=False)


def _save_tokenizer(student: Student, folder: str) -> None:
    """The student's tokenizer, truncating where the student did, and config.json's id2label, in `folder`."""
    tokenizer = student.tokens.tokenizer
    limit = tokenizer.model_max_length
    tokenizer.model_max_length = student.tokens.max_length  # truncation=True then cuts where the student did
    try:
        tokenizer.save_pretrained(folder)
    finally:
        tokenizer.model_max_length = limit
    with open(os.path.join(folder, schema.HF_CONFIG_FILE), "w", encoding="utf-8") as fh:
        json.dump({"id2label": {str(i): n for i, n in enumerate(student.label_names)}}, fh)


def _check_float32(student: Student, folder: str, model_path: str) -> float:
    """The largest |logit difference| of the export in `folder` from PyTorch; refused beyond TOLERANCE."""
    diff, scale = check_export(student, OnnxStudent.from_dir(folder, student.tokens.max_length))
    # Relative to the logits' scale: float32 kernels of two runtimes differ in proportion to the values.
    if not diff <= TOLERANCE * max(1.0, scale):
        raise UserError(f"export: onnxruntime's logits differ from PyTorch's by {diff:.2e} (logits up to "
                        f"{scale:.2f}; allowed {TOLERANCE} per unit) on the check sentences; the graph of "
                        f"{model_path} does not export faithfully")
    return diff


def _quantize_int8(student: Student, folder: str, model_path: str, fp32_diff: float) -> dict:
    """Quantize the float32 graph in `folder` in place, the first of INT8_VARIANTS that passes the int8
    check; → the config's int8 record. Int8Refused when none passes."""
    # Quantized from the float32 graph just checked, then checked again: a refusal is the int8 step's.
    path = os.path.join(folder, ONNX_FILE)
    fp32_bytes = os.path.getsize(path)
    with tempfile.TemporaryDirectory() as keep:
        fp32 = shutil.copy2(path, os.path.join(keep, ONNX_FILE))
        reasons: list[str] = []
        for variant in INT8_VARIANTS:  # the first that passes the check is kept
            # one model.onnx: every reader of an export takes it unchanged
            nodes = quantize_int8(fp32, path, **variant)
            check = check_int8(student, OnnxStudent.from_dir(folder, student.tokens.max_length))
            problems = int8_problems(check)
            if not problems:
                break
            reasons.append(f"{_variant_name(variant)}: " + ", and ".join(problems))
        else:
            raise Int8Refused(_int8_refusal(model_path, reasons))
    return {"quantize": "int8", "check_max_abs_diff": check["max_abs_diff"],
            "check_tolerance": INT8_TOLERANCE * max(1.0, check["range"]),
            "check_tolerance_rule": f"{INT8_TOLERANCE:g} x max(1, range of the check logits); no label "
                                    f"change where PyTorch's margin >= {INT8_TIE:g} x that",
            "check_logit_range": check["range"], "check_rows": check["rows"],
            "check_labels_changed": len(check["flips"]), "fp32_check_max_abs_diff": fp32_diff,
            "fp32_bytes": fp32_bytes,
            "quantization": {"method": "onnxruntime.quantization.quantize_dynamic", "weights": "int8",
                             "per_channel": True, "reduce_range": variant["reduce_range"],
                             "activations": "uint8, dynamic", "ops": list(variant["ops"]), "nodes": nodes,
                             "variant": _variant_name(variant),
                             "refused_before": reasons}}
