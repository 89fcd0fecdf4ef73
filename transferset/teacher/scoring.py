"""Batched scoring with a fine-tuned teacher: logits and pooled hidden states, Beam-free.

`Teacher.predict` is the whole scoring path; the Beam pipeline (pipelines/score.py) only
feeds it batches of rows. It tokenizes without padding, sorts the rows by length, splits them
into forward batches and returns the results in input order, so batching, sorting and padding
change no row's result. The classifiers of the encoder families packed.py serves (BERT,
RoBERTa/XLM-R/CamemBERT, ELECTRA, DistilBERT, MPNet, DeBERTa-v2/v3, ModernBERT) run padding-free (rows
laid end to end, checked against the model's own forward when loaded); any other model (DeBERTa v1, a
subclass, remote code) runs its own forward on batches padded only to their own longest row.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from transferset import packed as packed_path
from transferset.config import DEFAULT_MAX_LENGTH, POOLINGS, SCORE_PRECISIONS, check_forward_options
from transferset.contract import schema
from transferset.models import loading
from transferset.runtime.errors import UserError
from transferset.runtime.threads import set_torch_threads

# Forward passes after sorting by length: at most this many rows and tokens (padded tokens on the
# padded path). Measured with MiniLM on 2 idle CPU cores (benchmarks/score.py, 2,000 SST-2 rows in
# calls of 1,024 rows). Padded path: caps of 1,536-2,048 tokens took 4.0 s, 4,096 took 4.4-4.7 s
# (more padding) and 1,024 was slower again (smaller matmuls). Packed path (packed.py, BERT):
# 3,072-4,096 real tokens were best, 2,048 and 8,192 slower. Raise both on a GPU.
DEFAULT_FORWARD_ROWS = 128
DEFAULT_FORWARD_TOKENS = 2048
PACKED_FORWARD_ROWS = 1024
PACKED_FORWARD_TOKENS = 4096
LOG = logging.getLogger("transferset.teacher")


@dataclass
class Scores:
    """Teacher outputs for N rows, in input order."""

    logits: np.ndarray  # (N, C) float32
    hidden: np.ndarray  # (N, H) float32, pooled last layer
    layers: dict[int, np.ndarray] = field(default_factory=dict)  # layer index -> (N, H) float32
    num_tokens: int = 0  # real (unpadded) tokens, for throughput figures
    # an ensemble (teacher/ensemble.py): each member's (N, C) logits, combined into `logits`; [] for one teacher
    members: list[np.ndarray] = field(default_factory=list)

    @property
    def labels(self) -> np.ndarray:
        return self.logits.argmax(axis=1).astype(np.int32)  # (N,)


def normalize_layers(layers: Sequence[int], num_hidden_layers: int) -> list[int]:
    """Map negative layer indices to 0..L (0 = embeddings, L = last layer); refuse out-of-range ones.

    Indices follow `hidden_states` of Hugging Face models: L+1 entries, embeddings first.
    """
    out: list[int] = []
    for k in layers:
        idx = k + num_hidden_layers + 1 if k < 0 else k
        if not 0 <= idx <= num_hidden_layers:
            raise UserError(f"--layers: layer {k} does not exist; the teacher has {num_hidden_layers} layers "
                            f"(use 0..{num_hidden_layers}, or -1 for the last)")
        if idx not in out:
            out.append(idx)
    return out


def pool(hidden, mask, pooling: str):
    """(B, T, H) hidden, (B, T) mask -> (B, H): the first real token ([CLS]) or the masked mean."""
    import torch

    if pooling == "cls":
        first = mask.argmax(dim=1)  # first real token, whichever side the padding is on
        return hidden[torch.arange(hidden.shape[0]), first]
    m = mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)


class Teacher:
    """A fine-tuned sequence classifier ready to score batches of text.

    Load with `Teacher.load(dir)`; `predict(texts, texts_b)` returns `Scores` in input order.
    """

    def __init__(self, model, tokenizer, *, source: str = "", pooling: str = "cls", layers: Sequence[int] = (-1,),
                 max_length: int = DEFAULT_MAX_LENGTH, forward_rows: Optional[int] = None,
                 forward_tokens: Optional[int] = None, forward: str = "auto", sha256: Optional[str] = None,
                 precision: str = "fp32"):
        """`forward`: "packed" requires the padding-free path (packed.py), "padded" always runs
        the model's own forward on padded batches, "auto" takes the packed path on CPU for the
        classifiers packed.py serves. `forward_rows` and `forward_tokens` None pick the measured defaults of the path in use.
        `precision` bf16 casts the model's weights to bfloat16 (the logits and pooled states come back as float32)."""
        if pooling not in POOLINGS:
            raise UserError(f"--hidden {pooling!r}: choose one of {list(POOLINGS)}")
        self.precision = as_precision(model, precision)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.source = source
        self.pooling = pooling
        self.num_hidden_layers = int(model.config.num_hidden_layers)
        # layers[0] (always the last layer) feeds teacher_hidden; the others add teacher_hidden_l{k}.
        last = self.num_hidden_layers
        self.layers = [last] + [k for k in normalize_layers(layers, last) if k != last]
        self.max_length = int(max_length)
        check_forward_options(forward, forward_rows, forward_tokens)
        self.packed, self.packed_reason = None, f"--forward {forward}"
        if forward == "auto" and self.device.type != "cpu":
            self.packed_reason = f"auto picks the packed path on CPU only (this teacher is on {self.device.type})"
        elif forward != "padded":
            self.packed, self.packed_reason = packed_path.PackedClassifier.build(
                self.model, tokenizer, rows_hint=forward_tokens or PACKED_FORWARD_TOKENS)
            if forward == "packed" and self.packed is None:
                raise UserError(f"--forward packed: the padding-free forward pass is not available for this "
                                f"teacher: {self.packed_reason}")
        LOG.info("teacher forward pass: %s", self.forward_path if self.packed is not None else
                 f"{self.forward_path} ({self.packed_reason})")
        rows, tokens = ((PACKED_FORWARD_ROWS, PACKED_FORWARD_TOKENS) if self.packed is not None
                        else (DEFAULT_FORWARD_ROWS, DEFAULT_FORWARD_TOKENS))
        self.forward_rows = int(rows if forward_rows is None else forward_rows)
        self.forward_tokens = int(tokens if forward_tokens is None else forward_tokens)
        self._sha256 = sha256
        self._model_inputs = set(getattr(tokenizer, "model_input_names", ["input_ids", "attention_mask"]))

    # --- construction ---------------------------------------------------------------
    @classmethod
    def load(cls, path: str, *, allow_pickle: bool = False, trust_remote_code: bool = False,
             num_threads: Optional[int] = None, device: Optional[str] = None, **kwargs: Any) -> "Teacher":
        """Load a teacher directory (safetensors unless `allow_pickle`); `kwargs` go to __init__.

        `device` None picks the GPU when there is one.
        """
        import torch

        set_torch_threads(num_threads)
        loading.require_local_dir(path)
        model = loading.load_classifier(path, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
        model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        tokenizer = loading.load_tokenizer(path, trust_remote_code=trust_remote_code)
        return cls(model, tokenizer, source=path, **kwargs)

    # --- facts recorded in the output metadata -------------------------------------------
    @property
    def device(self):
        return next(self.model.parameters()).device

    @property
    def forward_path(self) -> str:
        """'packed' (padding-free path, packed.py) or 'padded' (the model's own forward)."""
        return "packed" if self.packed is not None else "padded"

    @property
    def label_names(self) -> list[str]:
        return loading.label_names_of(self.model.config)

    @property
    def num_classes(self) -> int:
        return len(self.label_names)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def extra_layers(self) -> list[int]:
        return self.layers[1:]

    def weights_sha256(self) -> str:
        if self._sha256 is None:
            self._sha256 = loading.weights_sha256(self.source, allow_pickle=True)
        return self._sha256

    def hidden_spec(self) -> dict:
        return hidden_spec(self.pooling, self.layers, self.hidden_size, self.num_hidden_layers)

    def tokenizer_info(self) -> dict:
        return tokenizer_info(self.tokenizer)

    # --- scoring -------------------------------------------------------------------------
    def tokenize(self, texts: Sequence[str], texts_b: Optional[Sequence[Optional[str]]] = None) -> list[dict]:
        """Token ids per row, truncated to max_length, unpadded."""
        texts = list(texts)
        if texts_b is not None and any(b is not None for b in texts_b):
            if any(b is None for b in texts_b):
                # Mixed single sentences and pairs: tokenize the two kinds separately.
                singles = [i for i, b in enumerate(texts_b) if b is None]
                pairs = [i for i, b in enumerate(texts_b) if b is not None]
                out: list = [None] * len(texts)
                for idx, feats in ((singles, self.tokenize([texts[i] for i in singles])),
                                   (pairs, self.tokenize([texts[i] for i in pairs], [texts_b[i] for i in pairs]))):
                    for i, f in zip(idx, feats):
                        out[i] = f
                return out
            enc = self.tokenizer(texts, list(texts_b), truncation=True, max_length=self.max_length)
        else:
            enc = self.tokenizer(texts, truncation=True, max_length=self.max_length)
        keys = [k for k in enc.keys() if k != "attention_mask" and k in self._model_inputs | {"input_ids"}]
        return [{k: enc[k][i] for k in keys} for i in range(len(texts))]

    def _forward_batches(self, order: Sequence[int], lengths: Sequence[int]):
        """Split rows (sorted by length, longest first) into forward batches under the row/token caps.

        Tokens are what the forward pass computes: padded (longest × rows) on the padded path,
        the real tokens on the packed one.
        """
        batch: list[int] = []
        tokens = 0
        for i in order:
            if self.packed is not None:
                after = tokens + lengths[i]
            else:
                after = (lengths[batch[0]] if batch else lengths[i]) * (len(batch) + 1)
            if batch and (len(batch) >= self.forward_rows or after > self.forward_tokens):
                yield batch
                batch, after = [], lengths[i]
            batch.append(i)
            tokens = after
        if batch:
            yield batch

    def _forward_packed(self, feats: Sequence[dict]):
        """One padding-free forward batch -> (logits (B, C), {layer: pooled (B, H)}) tensors."""
        return self.packed.score(feats, self.layers, self.pooling)

    def _forward_padded(self, feats: Sequence[dict]):
        """The model's own forward on one batch padded to its longest row; same return as _forward_packed."""
        from transformers.data.data_collator import pad_without_fast_tokenizer_warning

        # Tokenized once, sorted by length, then padded per batch: the warning that calling the
        # fast tokenizer on the texts would be faster does not apply.
        batch = pad_without_fast_tokenizer_warning(self.tokenizer, list(feats), padding=True,
                                                   return_attention_mask=True, return_tensors="pt")
        if self.device.type != "cpu":
            batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        out = self.model(**batch, output_hidden_states=True, return_dict=True)
        mask = batch["attention_mask"]  # (B, T)
        return out.logits, {k: pool(out.hidden_states[k], mask, self.pooling) for k in self.layers}

    def predict(self, texts: Sequence[str], texts_b: Optional[Sequence[Optional[str]]] = None) -> Scores:
        import torch

        n = len(texts)
        h = self.hidden_size
        logits = np.empty((n, self.num_classes), dtype=np.float32)
        pooled = {k: np.empty((n, h), dtype=np.float32) for k in self.layers}
        if n == 0:
            return Scores(logits, pooled[self.layers[0]], {k: pooled[k] for k in self.extra_layers})
        feats = self.tokenize(texts, texts_b)
        lengths = [len(f["input_ids"]) for f in feats]
        order = sorted(range(n), key=lambda i: -lengths[i])
        forward = self._forward_packed if self.packed is not None else self._forward_padded
        with torch.inference_mode():
            for idx in self._forward_batches(order, lengths):
                rows = np.asarray(idx)
                batch_logits, batch_pooled = forward([feats[i] for i in idx])
                logits[rows] = batch_logits.float().cpu().numpy()
                for k in self.layers:
                    pooled[k][rows] = batch_pooled[k].float().cpu().numpy()
        return Scores(logits, pooled[self.layers[0]], {k: pooled[k] for k in self.extra_layers},
                      num_tokens=int(sum(lengths)))


def resolved_precision(precision: str, device: Any = None) -> str:
    """`precision` (SCORE_PRECISIONS) as scoring runs it on `device` (None: the GPU when there is one, else the CPU):
    `auto` is bf16 where the device has bfloat16 arithmetic (training.engine.has_bf16), else fp32."""
    import torch

    from transferset.training import engine

    if precision not in SCORE_PRECISIONS:
        raise UserError(f"--precision {precision!r}: choose one of {list(SCORE_PRECISIONS)}")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return engine.resolved_precision(precision, torch.device(device))


def as_precision(model, precision: str) -> str:
    """Cast `model` in place to the scoring precision (SCORE_PRECISIONS; `auto` resolved on the model's device) and
    return the one it runs at; a CPU without bfloat16 arithmetic (AVX512-BF16 or AMX) runs bf16 emulated, slower
    than fp32: warned, not refused."""
    import torch

    device = next(model.parameters()).device
    precision = resolved_precision(precision, device)
    if precision == "bf16":
        if device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            LOG.warning("--precision bf16: this CPU has no bfloat16 arithmetic (AVX512-BF16 or AMX); scoring "
                        "runs emulated, slower than fp32: drop --precision bf16 here")
        model.to(torch.bfloat16)
    return precision


def hidden_spec(pooling: str, layers: Sequence[int], hidden_size: int, num_hidden_layers: int) -> dict:
    return {
        schema.HIDDEN_POOLING: pooling,
        schema.HIDDEN_LAYER: layers[0],
        schema.HIDDEN_EXTRA_LAYERS: list(layers[1:]),
        schema.HIDDEN_NUM_LAYERS: num_hidden_layers,
        schema.HIDDEN_SIZE: hidden_size,
        schema.HIDDEN_DTYPE: "float16",
        schema.HIDDEN_LAYER_INDEX: "hidden_states index: 0 = embeddings, num_hidden_layers = last layer",
    }


def tokenizer_info(tokenizer) -> dict:
    return {
        "class": type(tokenizer).__name__,
        "name_or_path": os.path.basename(str(getattr(tokenizer, "name_or_path", "")).rstrip("/")),
        "vocab_size": int(getattr(tokenizer, "vocab_size", 0) or 0),
        "do_lower_case": bool(getattr(tokenizer, "do_lower_case", False)),
        "padding_side": getattr(tokenizer, "padding_side", "right"),
    }
