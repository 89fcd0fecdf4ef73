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

Why the legacy TorchScript exporter (dynamo=False): the dynamo exporter needs onnxscript (not a
dependency), and the traced graphs below run in onnxruntime and match PyTorch to ~1e-6.
"""
from __future__ import annotations

import inspect
import json
import os
import shutil
import tempfile
import warnings
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from students.bilstm import BiLSTM
from students.student import EXPORT_KEY, ONNX_FILE, OnnxStudent, Student
from students.tokens import WordPieceTokens
from transferset import __version__, fs, schema
from transferset.errors import UserError
from transferset.fs.output import MODEL_NAMES, Output
from transferset.fs.remote import local_teacher

FORMATS = ("onnx",)
OPSET = 17
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


class BiLSTMGraph(nn.Module):
    """The BiLSTM student's forward pass as one exportable graph, on the student's own weights.

    students.bilstm.BiLSTM runs each direction over padded rows (reversing each row within its length
    for the backward one); here the rows are packed by length, so the export is one bidirectional
    ONNX LSTM with sequence lengths: the same values, fewer nodes. A trimmed vocabulary's remapping
    (WordPiece id → student row) is inside the graph, so it takes the tokenizer's ids as they are.
    """

    def __init__(self, model: BiLSTM, remap: Optional[torch.Tensor]):
        super().__init__()
        self.model = model
        self.register_buffer("remap", remap.clone() if remap is not None else None)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        m, cfg = self.model, self.model.config
        ids = self.remap[input_ids] if self.remap is not None else input_ids            # (B, T)
        T = ids.shape[1]
        lengths = (attention_mask != 0).sum(1).clamp(min=1)                              # (B,)
        x = m.embed(ids)                                                                 # (B, T, E)
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = pad_packed_sequence(m.lstm(packed)[0], batch_first=True, total_length=T)  # (B, T, 2H)
        if cfg.pool == "max":
            valid = torch.arange(T, device=ids.device).unsqueeze(0) < lengths.unsqueeze(1)  # (B, T)
            # The exported padding is 0, not -inf: mask it as the model does.
            pooled = out.masked_fill(~valid.unsqueeze(-1), float("-inf")).max(dim=1).values  # (B, 2H)
        else:
            # The last layer's final states: forward at each row's last token, backward at position 0.
            H = cfg.hidden
            last = (lengths - 1).view(-1, 1, 1).expand(-1, 1, H)                       # (B, 1, H)
            pooled = torch.cat([out[:, :, :H].gather(1, last).squeeze(1), out[:, 0, H:]], dim=-1)
        z = m.head(pooled)                                                               # (B, D)
        rep = F.gelu(z) if cfg.head_act == "gelu" else F.relu(z)
        return m.classifier(rep)                                                         # (B, C)


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
        raise UserError(f"export: this {student.family.name} student uses `tokens: {tokens.kind}`, which has no "
                        "Hugging Face tokenizer to save beside the graph; export a student trained with "
                        "`tokens: wordpiece` (the default)")
    declared = tokenizer_inputs(tokens.tokenizer)
    if isinstance(student.model, BiLSTM):
        return BiLSTMGraph(student.model, tokens.remap).eval(), ["input_ids", "attention_mask"], declared
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


def _config(student: Student, declared: Sequence[str], opset: int, source: str, max_abs_diff: float) -> dict:
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
                        "library_version": __version__}
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


def export(model_path: str, output: str, *, format: str = "onnx", opset: int = OPSET,
           max_length: Optional[int] = None, overwrite: bool = False) -> dict:
    """Export the model at `model_path` (a `transferset train` output, its model/, or any Hugging Face
    sequence-classifier directory; local or a URL) to `output` (local or a URL); → what was written."""
    if format not in FORMATS:
        raise UserError(f"export: unknown --format {format!r}; known: {', '.join(FORMATS)}")
    # A folder holding a model (a teacher's config.json and tokenizer) is refused like every output.
    out = Output(output, "export", names=MODEL_NAMES, overwrite=overwrite, inputs=[model_path])
    with out.open():
        out.check()
        result = _export(model_path, out, format=format, opset=opset, max_length=max_length)
        out.finish()
    return result


def _export(model_path: str, out: Output, *, format: str, opset: int, max_length: Optional[int]) -> dict:
    output = out.path
    student = Student.from_pretrained(local_teacher(model_path) if fs.is_remote(model_path) else model_path,
                                      max_length=max_length)
    if not isinstance(student, Student):
        raise UserError(f"{model_path} is already an ONNX export; pass the directory it was exported from")
    graph, used, declared = graph_of(student)
    example = student.tokens.tokenizer(CHECK_TEXTS[:2], ["the film is good", "a short second text"], padding=True,
                                       return_tensors="pt")
    axes = {name: {0: "batch", 1: "sequence"} for name in used}
    # Traced on a padded batch of pairs: every branch that padding or a second segment takes is in the graph.
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, ONNX_FILE)
        with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
            warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer warnings
            torch.onnx.export(graph, tuple(example[name] for name in used), path, input_names=used,
                              output_names=[OUTPUT], dynamic_axes={**axes, OUTPUT: {0: "batch"}},
                              opset_version=opset, dynamo=False)
        _declare_unused_inputs(path, declared, used)
        tokenizer = student.tokens.tokenizer
        limit = tokenizer.model_max_length
        tokenizer.model_max_length = student.tokens.max_length  # truncation=True then cuts where the student did
        try:
            tokenizer.save_pretrained(tmp)
        finally:
            tokenizer.model_max_length = limit
        with open(os.path.join(tmp, schema.HF_CONFIG_FILE), "w", encoding="utf-8") as fh:
            json.dump({"id2label": {str(i): n for i, n in enumerate(student.label_names)}}, fh)
        diff, scale = check_export(student, OnnxStudent.from_dir(tmp, student.tokens.max_length))
        # Relative to the logits' scale: float32 kernels of two runtimes differ in proportion to the values.
        if not diff <= TOLERANCE * max(1.0, scale):
            raise UserError(f"export: onnxruntime's logits differ from PyTorch's by {diff:.2e} (logits up to "
                            f"{scale:.2f}; allowed {TOLERANCE} per unit) on the check sentences; the graph of "
                            f"{model_path} does not export faithfully")
        with open(os.path.join(tmp, schema.HF_CONFIG_FILE), "w", encoding="utf-8") as fh:
            json.dump(_config(student, declared, opset, model_path, diff), fh, indent=2)
        out.prepare()  # the export was checked: only now is anything under OUT changed
        with out.local() as work:
            for name in os.listdir(tmp):
                shutil.copy2(os.path.join(tmp, name), os.path.join(work, name))
    return {"output": output, "format": format, "family": student.family.name, "inputs": declared,
            "output_name": OUTPUT, "opset": opset, "labels": student.label_names,
            "check_max_abs_diff": diff, "onnx_bytes": fs.size(fs.join(output, ONNX_FILE))}
