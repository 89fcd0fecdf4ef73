"""A trained student: predicting, and saving / loading one as a pair, as Hugging Face models do.

    student = Student.from_pretrained("runs/sst2/bilstm")      # or its model/, or any HF classifier dir
    out = student.predict(["a gripping film", "dull"])
    out.labels          # ['1', '0']: label names
    out.probabilities   # (2, C) float32, rows sum to 1; column j is out.label_names[j]

    Student.from_pretrained("runs/sst2/onnx/bilstm")  # a `transferset export --format onnx` directory:
                                                       # an OnnxStudent, the same predict API on onnxruntime

A student directory (`transferset train --output DIR` → DIR/model, or `save_pretrained(dir)`) holds
the family's files and a small sidecar (transferset.json: family, label names, tokens, model
settings). The transformer's files are a plain Hugging Face model (config.json, model.safetensors,
tokenizer): `AutoModelForSequenceClassification.from_pretrained` and `pipeline` load it without
transferset. Any other Hugging Face sequence-classifier directory (e.g. the fine-tuned teacher)
loads too, so one `transferset evaluate` compares teacher and students. So does a directory that
`transferset export --format onnx` wrote (students/compress/export.py): it runs on onnxruntime, with the
tokenizer saved beside the graph.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any, Optional, Sequence

import numpy as np
import torch

from students.build import HF_FAMILY, Family, Setup, family
from students.data import NO_LABEL
from students.data.encoding import Encoder
from students.data.files import JSON_KINDS, RESAVE, StudentFileError, json_kind, read_json_object
from students.data.teacher_files import NO_CODE_LOAD
from students.families.exits import (Branches, adaptive_forward, check_speed, has_exits, load_branches, save_branches,
                                     saved_speed)
from students.families.transformer import load_hf_classifier
from transferset import __version__
from transferset.contract import schema
from transferset.models.loading import check_safetensors, label_names_of, load_tokenizer
from transferset.runtime.errors import ConfigError, UserError
from transferset.runtime.registry import RegistryError


@dataclass
class Predictions:
    """What `Student.predict` returns for N texts, in input order."""

    labels: list[str]             # (N,) the name of the most probable class
    probabilities: np.ndarray     # (N, C) float32 softmax of the logits; column j is label_names[j]
    label_names: list[str]        # (C,) the student's label names, in class-index order


# An exported directory (students/compress/export.py): the graph, beside config.json (id2label and this
# key's entry: family, max_length, inputs, opset) and the tokenizer.
ONNX_FILE = "model.onnx"
EXPORT_KEY = "transferset_export"


class Predictor:
    """What every loaded classifier shares: label names, logits in input order, predictions.

    Subclasses give `_batch_logits(texts, texts_b) -> (B, C)` for one batch; rows are length-sorted
    into batches here (less padding) and returned in input order. A model with early exits (a Student
    whose `exits` are set, students/families/exits.py) gives `_batch_exits(texts, texts_b, speed) -> ((B, C), (B,))`:
    its logits and the layer each row left at.

    `speed` (every method): the normalised entropy below which a row of a model with exits leaves at a
    layer's branch; None runs at `self.speed` (None: 0, every layer). A model without exits takes only None or 0.
    """

    label_names: list[str]
    exits = None  # a model's early-exit branches, when it has them (students/families/exits.py)
    # the speed of calls that give none (`transferset predict --speed`, or the one the folder's exits.json records)
    speed: Optional[float] = None

    def _batch_logits(self, texts: list[str], texts_b: Optional[list[Optional[str]]]) -> np.ndarray:
        raise NotImplementedError

    def _batch_exits(self, texts: list[str], texts_b: Optional[list[Optional[str]]],
                     speed: float) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def check_speed(self, speed: Optional[float]) -> float:
        """`speed` as a float, refused (ConfigError) out of [0, 1] and above 0 for a model without exits."""
        try:
            value = check_speed(speed)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if value > 0 and self.exits is None:
            raise ConfigError(f"speed {speed}: this model has no early exits (no {schema.EXITS_FILE} beside it), so "
                              "every row runs every layer; train them with `transferset exits`, or drop speed")
        return value

    def logits_and_layers(self, texts: Sequence[str], texts_b: Optional[Sequence[Optional[str]]] = None,
                          batch_size: int = 256, speed: Optional[float] = None) -> tuple[np.ndarray, np.ndarray]:
        """(N, C) logits and (N,) the layer each row left at (0 for a model without exits); rows are
        length-sorted into batches and returned in input order."""
        if isinstance(texts, str):
            raise TypeError("texts is one str; pass a list of texts (e.g. [text])")
        if texts_b is not None and len(texts_b) != len(texts):
            raise ValueError(f"texts_b has {len(texts_b)} rows for {len(texts)} texts; pass one second text "
                             "(or None) per text")
        value = self.check_speed(self.speed if speed is None else speed)
        out = np.zeros((len(texts), len(self.label_names)), dtype=np.float32)
        layers = np.zeros(len(texts), dtype=np.int64)

        def batch(idx: Sequence[int]) -> None:
            t = [texts[i] for i in idx]
            tb = [texts_b[i] for i in idx] if texts_b is not None else None
            if self.exits is None:
                out[idx] = self._batch_logits(t, tb)
            else:
                out[idx], layers[idx] = self._batch_exits(t, tb, value)

        if len(texts) == 1:  # batch 1 (an online request): nothing to sort or scatter
            batch([0])
            return out, layers
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), batch_size):
            batch(order[start:start + batch_size])
        return out, layers

    def logits(self, texts: Sequence[str], texts_b: Optional[Sequence[Optional[str]]] = None,
               batch_size: int = 256, speed: Optional[float] = None) -> np.ndarray:
        """(N, C) logits; rows are length-sorted into batches and returned in input order."""
        return self.logits_and_layers(texts, texts_b, batch_size, speed)[0]

    def predict_ids(self, texts: Sequence[str], texts_b: Optional[Sequence[Optional[str]]] = None,
                    batch_size: int = 256, speed: Optional[float] = None) -> np.ndarray:
        """(N,) class indices (into label_names) of the most probable class: what accuracy compares."""
        return self.logits(texts, texts_b, batch_size, speed).argmax(-1)

    def predict(self, texts: Sequence[str], texts_b: Optional[Sequence[Optional[str]]] = None,
                batch_size: int = 256, speed: Optional[float] = None) -> Predictions:
        """Label names and class probabilities of `texts` (with `texts_b`, sentence pairs)."""
        logits = self.logits(texts, texts_b, batch_size, speed)                  # (N, C)
        z = np.exp(logits - logits.max(axis=1, keepdims=True, initial=-np.inf))
        probabilities = z / z.sum(axis=1, keepdims=True)
        return Predictions([self.label_names[i] for i in logits.argmax(-1)], probabilities, list(self.label_names))


class Student(Predictor):
    """model + tokens + label names + the family that knows its forward pass.

    `config` is the model's own config dataclass and `teacher_id` the teacher that scored its
    training set: both are recorded in the sidecar by `save_pretrained` (None for a Hugging Face
    classifier that transferset did not train).
    """

    def __init__(self, model: torch.nn.Module, tokens, label_names: Sequence[str], family: Family,
                 config: Any = None, teacher_id: Optional[str] = None, exits: Optional[Branches] = None):
        self.model = model
        self.exits = exits
        self.tokens = tokens
        self.label_names = list(label_names)
        self.family = family
        self.config = config
        self.teacher_id = teacher_id

    @classmethod
    def from_setup(cls, s: Setup) -> "Student":
        """The student being trained in `s` (sharing its model and tokens)."""
        return cls(s.model, s.tokens, s.label_names, s.family, s.model_config, s.meta.get(schema.META_TEACHER_ID))

    # ------------------------------------------------------------------ predicting

    def logits_and_layers(self, texts: Sequence[str], texts_b: Optional[Sequence[Optional[str]]] = None,
                          batch_size: int = 256, speed: Optional[float] = None) -> tuple[np.ndarray, np.ndarray]:
        # eval() walks every submodule (0.22 ms for the MiniLM teacher's 123: a fortieth of its batch-1 call), so
        # only a model left in training mode (the trainer's, shared by from_setup) is switched.
        if self.model.training:
            self.model.eval()
        if self.exits is not None and self.exits.training:
            self.exits.eval()
        return super().logits_and_layers(texts, texts_b, batch_size, speed)

    def _batch(self, texts: list[str], texts_b: Optional[list[Optional[str]]]) -> dict:
        ids, mask, types = self.tokens.encode(texts, texts_b)
        # The tokens are made on the CPU; a model moved to an accelerator gets them there, and its
        # logits come back to the CPU for numpy.
        device = next(self.model.parameters(), torch.empty(0)).device
        return {"ids": ids.to(device), "mask": mask.to(device), "type_ids": types.to(device)}

    @torch.inference_mode()
    def _batch_logits(self, texts: list[str], texts_b: Optional[list[Optional[str]]]) -> np.ndarray:
        return self.family.forward(self.model, self._batch(texts, texts_b))["logits"].float().detach().cpu().numpy()

    def _batch_exits(self, texts: list[str], texts_b: Optional[list[Optional[str]]],
                     speed: float) -> tuple[np.ndarray, np.ndarray]:
        b = self._batch(texts, texts_b)
        logits, layers = adaptive_forward(self.model, self.exits, b["ids"], b["mask"], b["type_ids"], speed)
        return logits.cpu().numpy(), layers.cpu().numpy()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    # ------------------------------------------------------------------ saving and loading

    def save_pretrained(self, model_dir: str) -> None:
        """Write the student to `model_dir` (created if needed); `from_pretrained(model_dir)` reads it back."""
        os.makedirs(model_dir, exist_ok=True)
        sidecar = {
            "family": self.family.name,
            "label_names": self.label_names,
            **self.family.save(model_dir, self.model, self.tokens),
            "model": asdict(self.config) if self.config is not None else None,
            "teacher_id": self.teacher_id,
            "library_version": __version__,
        }
        with open(os.path.join(model_dir, schema.STUDENT_SIDECAR_FILE), "w", encoding="utf-8") as fh:
            json.dump(sidecar, fh, indent=2)
        if self.exits is not None:  # a re-save keeps the exits (how they were trained is exits_training's to say)
            save_branches(model_dir, self.exits, {"speed": self.speed} if self.speed else {})

    @classmethod
    def from_pretrained(cls, path: str, max_length: Optional[int] = None) -> "Student | OnnxStudent":
        """A student saved by `save_pretrained` or `transferset train` (the run directory or its model/),
        or any Hugging Face sequence-classifier directory (config.json with id2label, safetensors
        weights, a tokenizer), or an exported ONNX directory (then an OnnxStudent: the same
        logits / predict / predict_ids, run by onnxruntime).

        `max_length` overrides the tokens per row (default: the student's, or the HF tokenizer's limit).
        A folder written by `transferset exits` (exits.json beside the model) loads with its early exits:
        `predict(..., speed=S)` then lets rows leave at a layer's branch (students/families/exits.py); a call that
        gives no speed runs at the one exits.json records (a search's chosen student), else every layer.
        """
        model_dir = schema.model_dir(path)
        if os.path.isfile(os.path.join(model_dir, ONNX_FILE)):
            return OnnxStudent.from_dir(model_dir, max_length)
        sidecar_path = os.path.join(model_dir, schema.STUDENT_SIDECAR_FILE)
        if os.path.isfile(sidecar_path):
            sidecar = read_sidecar(sidecar_path)
            fam = family(sidecar["family"], sidecar_path)
            for name in sorted(os.listdir(model_dir)):
                if name.endswith(".safetensors"):  # a damaged file: one clear message, not a loader traceback
                    check_safetensors(os.path.join(model_dir, name))
            model, tokens, config = fam.load(model_dir, sidecar)
            refuse_non_finite(model, os.path.join(model_dir, schema.WEIGHTS_FILE))
            classes = _num_classes(model, config)
            if classes is not None and classes != len(sidecar["label_names"]):
                raise StudentFileError(f"{sidecar_path}: {len(sidecar['label_names'])} label names for a model of "
                                       f"{classes} classes; {RESAVE}")
            if max_length is not None:
                tokens.max_length = max_length
            return _with_exits(cls(model.eval(), tokens, sidecar["label_names"], fam, config,
                                   sidecar.get("teacher_id")), model_dir)
        if os.path.isfile(os.path.join(model_dir, schema.HF_CONFIG_FILE)):
            model, tokens, label_names = load_hf_classifier(model_dir, max_length)
            refuse_non_finite(model, os.path.join(model_dir, schema.WEIGHTS_FILE))
            return _with_exits(cls(model, tokens, label_names, HF_FAMILY), model_dir)
        raise UserError(f"{path}: neither {schema.STUDENT_MODEL_DIR}/{schema.STUDENT_SIDECAR_FILE} nor "
                        f"{schema.HF_CONFIG_FILE} nor {ONNX_FILE}; pass the --output directory of `transferset "
                        "train`, a Hugging Face model directory (e.g. the output of `transferset teacher`) or "
                        "the --output directory of `transferset export`")


def _with_exits(student: Student, model_dir: str) -> Student:
    """The student with the early-exit branches saved beside its model (`transferset exits`), if any, and the speed
    exits.json records for calls that give none."""
    if has_exits(model_dir):
        student.exits = load_branches(model_dir, student.model)
        student.speed = saved_speed(model_dir)
    return student


def refuse_non_finite(model: torch.nn.Module, where: str) -> None:
    """Refuse weights holding NaN or infinity: such a model predicts NaN probabilities for every row."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise StudentFileError(f"{where}: weight {name} holds NaN or infinite values, so every prediction "
                                   "would be NaN: the training that wrote it diverged; train the model again")


# A sidecar's entries that loading needs, with their JSON types (the model's settings are checked by its
# family; a transformer's are null when it was not trained by transferset).
SIDECAR_KEYS = {"family": (str,), "label_names": (list,), "tokens": (dict,), "model": (dict, type(None))}


def read_sidecar(path: str) -> dict:
    """A student's sidecar (transferset.json), checked for what loading needs; a damaged one is one
    StudentFileError naming the file, never a KeyError or a JSON traceback from deep in a loader."""
    sidecar = read_json_object(path, holds=f"a student's sidecar holds {', '.join(SIDECAR_KEYS)}", remedy=RESAVE)
    if isinstance(sidecar.get("family"), str):
        try:  # first: another family's sidecar (a newer version's, a plugin's) may hold other keys
            family(sidecar["family"], path)
        except RegistryError as exc:  # the folder, not a setting, names it: exit 1, as a damaged file
            raise StudentFileError(f"{exc}; install the package that provides it, or {RESAVE}") from None
    missing = [k for k in SIDECAR_KEYS if k not in sidecar]
    if missing:
        raise StudentFileError(f"{path}: lacks {', '.join(repr(k) for k in missing)} (a student's sidecar holds "
                               f"{', '.join(SIDECAR_KEYS)}); {RESAVE}")
    for key, kinds in SIDECAR_KEYS.items():
        if not isinstance(sidecar[key], kinds):
            raise StudentFileError(f"{path}: {key} is {json_kind(sidecar[key])} ({schema.cut(sidecar[key], 100)}), "
                                   f"not {' or '.join(JSON_KINDS[k] for k in kinds)}; {RESAVE}")
    names = sidecar["label_names"]
    if not names or not all(isinstance(n, str) for n in names):
        raise StudentFileError(f"{path}: label_names {schema.cut(names, 100)} is not a list of label names; {RESAVE}")
    tokens = sidecar["tokens"]
    length = tokens.get("max_length")
    if not isinstance(tokens.get("kind"), str) or type(length) is not int or length < 1:
        raise StudentFileError(f"{path}: tokens {schema.cut(tokens, 100)} needs kind (a string) and max_length (a "
                               f"positive integer); {RESAVE}")
    return sidecar


def _num_classes(model: torch.nn.Module, config: Any) -> Optional[int]:
    """How many classes a loaded model predicts, where its config says."""
    if hasattr(config, "num_classes"):
        return int(config.num_classes)
    hf = getattr(model, "config", None)
    return int(hf.num_labels) if hf is not None and hasattr(hf, "num_labels") else None


class OnnxStudent(Predictor):
    """A classifier exported by `transferset export --format onnx` (students/compress/export.py), run by onnxruntime.

    Tokenizes as Student does (the saved tokenizer, truncation at the export's max_length, pairs as
    the tokenizer joins them) and feeds the graph the tokenizer's arrays by name.
    """

    def __init__(self, session, tokenizer, label_names: Sequence[str], max_length: int, family_name: str):
        self.session = session
        self.tokenizer = tokenizer
        self.encoder = Encoder(tokenizer)
        self.label_names = list(label_names)
        self.max_length = max_length
        self.family_name = family_name  # the family it was exported from ("bilstm", "transformer", ...)
        self.input_names = [i.name for i in session.get_inputs()]
        self.parameters: Optional[int] = None  # the exported model's parameter count (the export records it)
        self.model_file: Optional[str] = None  # model.onnx, when loaded from a directory

    @classmethod
    def from_dir(cls, model_dir: str, max_length: Optional[int] = None,
                 threads: Optional[int] = None) -> "OnnxStudent":
        """Load an exported directory. `threads`: onnxruntime's intra-op threads (None: torch's setting,
        so one torch.set_num_threads pins both runtimes)."""
        try:
            import onnxruntime as ort  # the onnx extra: only exported directories need it
        except ImportError as exc:
            raise UserError(f"{model_dir} is an ONNX export: running it needs onnxruntime "
                            "(pip install 'transferset[onnx]')") from exc
        config_path = os.path.join(model_dir, schema.HF_CONFIG_FILE)
        config = read_json_object(config_path, holds="an export's config.json holds id2label",
                                  remedy="export the model again with `transferset export`")
        info = config.get(EXPORT_KEY) or {}
        if not isinstance(info, dict):
            raise StudentFileError(f"{config_path}: {EXPORT_KEY} is {json_kind(info)}, not an object; export the "
                                   "model again with `transferset export`")
        label_names = label_names_of(SimpleNamespace(id2label=config.get("id2label") or {},
                                                     num_labels=config.get("num_labels")))
        tokenizer = load_tokenizer(model_dir, remedy=NO_CODE_LOAD)
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(threads or torch.get_num_threads())
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(os.path.join(model_dir, ONNX_FILE), options,
                                       providers=["CPUExecutionProvider"])
        length = max_length or info.get("max_length") or int(tokenizer.model_max_length)
        exported = cls(session, tokenizer, label_names, int(length), str(info.get("family", "onnx")))
        exported.parameters = info.get("parameters")
        exported.model_file = os.path.join(model_dir, ONNX_FILE)
        return exported

    def num_parameters(self) -> int:
        """The parameters of the model it was exported from (int8 weights count one each), as the export
        recorded them; for an export that predates the record, the graph's weights counted."""
        if self.parameters is None and self.model_file is not None:
            import onnx  # installed with onnxruntime by the onnx extra

            graph = onnx.load(self.model_file, load_external_data=False).graph
            self.parameters = sum(int(np.prod(t.dims)) for t in graph.initializer if len(t.dims) > 1)
        return int(self.parameters or 0)

    def _batch_logits(self, texts: list[str], texts_b: Optional[list[Optional[str]]]) -> np.ndarray:
        pairs = None
        if texts_b is not None and any(t is not None for t in texts_b):
            pairs = [t or "" for t in texts_b]
        feed = self.encoder(texts, pairs, self.max_length, self.input_names)
        return self.session.run(None, feed)[0].astype(np.float32, copy=False)


def accuracy(pred: np.ndarray, labels: np.ndarray) -> float:
    keep = labels != NO_LABEL
    return float((pred[keep] == labels[keep]).mean()) if keep.any() else float("nan")
