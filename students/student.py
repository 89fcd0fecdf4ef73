"""A trained student ready to predict, and saving / loading one.

A student directory (`transferset train --output DIR` → DIR/model) holds the family's files and a
small sidecar (transferset.json: family, label names, tokens, model settings). The transformer's
files are a plain Hugging Face model (config.json, model.safetensors, tokenizer): `from_pretrained`
and `pipeline` load it without transferset. Any other Hugging Face sequence-classifier directory
(e.g. the fine-tuned teacher) loads too, so one `transferset evaluate` compares teacher and students.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Optional, Sequence

import numpy as np
import torch

from students.build import HF_FAMILY, Family, Setup, family, load_hf_classifier
from students.losses import NO_LABEL
from transferset import __version__, schema
from transferset.errors import UserError
from transferset.loading import check_safetensors
from transferset.timing import ms_per_example


class Student:
    """model + tokens + label names + the family that knows its forward pass."""

    def __init__(self, model: torch.nn.Module, tokens, label_names: Sequence[str], family: Family):
        self.model = model
        self.tokens = tokens
        self.label_names = list(label_names)
        self.family = family

    @torch.inference_mode()
    def logits(self, texts: Sequence[str], texts_b: Optional[Sequence[Optional[str]]] = None,
               batch_size: int = 256) -> np.ndarray:
        """(N, C) logits; rows are length-sorted into batches and returned in input order."""
        self.model.eval()
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), len(self.label_names)), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            ids, mask, types = self.tokens.encode([texts[i] for i in idx],
                                                  [texts_b[i] for i in idx] if texts_b is not None else None)
            batch = {"ids": ids, "mask": mask, "type_ids": types}
            out[idx] = self.family.forward(self.model, batch)["logits"].float().numpy()
        return out

    def predict(self, texts, texts_b=None, batch_size: int = 256) -> np.ndarray:
        return self.logits(texts, texts_b, batch_size).argmax(-1)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def accuracy(pred: np.ndarray, labels: np.ndarray) -> float:
    keep = labels != NO_LABEL
    return float((pred[keep] == labels[keep]).mean()) if keep.any() else float("nan")


def latency_ms(student: Student, texts: Sequence[str], batch_size: int, limit: int) -> float:
    """CPU milliseconds per example, tokenization included, at a fixed batch size."""
    return ms_per_example(lambda chunk: student.logits(chunk, batch_size=batch_size), texts, batch_size, limit)


def save_student(model_dir: str, s: Setup) -> None:
    os.makedirs(model_dir, exist_ok=True)
    sidecar = {
        "family": s.family.name,
        "label_names": s.label_names,
        **s.family.save(model_dir, s.model, s.tokens),
        "model": asdict(s.model_config),
        "teacher_id": s.meta.get(schema.META_TEACHER_ID),
        "library_version": __version__,
    }
    with open(os.path.join(model_dir, schema.STUDENT_SIDECAR_FILE), "w", encoding="utf-8") as fh:
        json.dump(sidecar, fh, indent=2)


def load_student(path: str, max_length: Optional[int] = None) -> Student:
    """A student saved by `transferset train` (the run directory or its model/), or any Hugging Face
    sequence-classifier directory (config.json with id2label, safetensors weights, a tokenizer).

    `max_length` overrides the tokens per row (default: the student's, or the HF tokenizer's limit).
    """
    inner = os.path.join(path, schema.STUDENT_MODEL_DIR)
    model_dir = inner if os.path.isdir(inner) else path
    sidecar_path = os.path.join(model_dir, schema.STUDENT_SIDECAR_FILE)
    if os.path.isfile(sidecar_path):
        with open(sidecar_path, encoding="utf-8") as fh:
            sidecar = json.load(fh)
        fam = family(sidecar.get("family"), sidecar_path)
        for name in sorted(os.listdir(model_dir)):
            if name.endswith(".safetensors"):  # a damaged file: one clear message, not a loader traceback
                check_safetensors(os.path.join(model_dir, name))
        model, tokens = fam.load(model_dir, sidecar)
        if max_length is not None:
            tokens.max_length = max_length
        return Student(model.eval(), tokens, sidecar["label_names"], fam)
    if os.path.isfile(os.path.join(model_dir, schema.HF_CONFIG_FILE)):
        model, tokens, label_names = load_hf_classifier(model_dir, max_length)
        return Student(model, tokens, label_names, HF_FAMILY)
    raise UserError(f"{path}: neither {schema.STUDENT_MODEL_DIR}/{schema.STUDENT_SIDECAR_FILE} nor "
                    f"{schema.HF_CONFIG_FILE}; pass the --output directory of `transferset train` or a "
                    "Hugging Face model directory (e.g. the output of `transferset teacher`)")
