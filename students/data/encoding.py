"""A tokenizer's arrays for one batch of texts, without the Python around a fast tokenizer's call.

`tokenizer(texts, truncation=True, max_length=L, padding=True, return_tensors="np")` spends about as long
in transformers' Python (argument checks, setting the backend's truncation and padding on every call,
building a BatchEncoding, converting it) as the Rust tokenizer spends on the text, and at batch 1 that
Python also evicts the model's weights from the core's caches: the demo's distilled BiLSTM's ONNX call
took 0.541 ms an example at batch 1 through it and 0.469 ms with the backend called directly (SST-2 dev,
one thread: `benchmarks/latency.py --tokenizer-baseline`, benchmarks/README.md). `Encoder` calls a private copy of the backend (`tokenizers.
Tokenizer`) set once to the same truncation and padding, and keeps the transformers call wherever it could
differ: pairs, a tokenizer without a Rust backend, or one whose direct call did not give the same arrays
on the probe texts (checked once per max_length, when first used).
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence

import numpy as np

log = logging.getLogger(__name__)

# The arrays a batch may hold, by the name a graph or model takes, and the backend Encoding's field for each.
FIELDS = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}
ARRAYS = tuple(FIELDS)

# Rows that exercise what the two calls must agree on: padding to the longest row, truncation at
# max_length (the last two), accents, casing, punctuation, an empty row and unknown characters.
PROBES = ("a", "The film's Ending, sadly, isn't WORTH it!", "", "naïve café ☃ 🙂 — x",
          "it " * 600, "word " * 40 + "end")


def hf_arrays(tokenizer, texts: Sequence[str], pairs: Optional[Sequence[str]], max_length: int,
              names: Sequence[str]) -> dict[str, np.ndarray]:
    """The transformers call: int64 arrays by name, padded to the longest row, truncated at max_length."""
    enc = tokenizer(list(texts), None if pairs is None else list(pairs), truncation=True, max_length=max_length,
                    padding=True, return_tensors="np", return_token_type_ids="token_type_ids" in names)
    return {name: np.asarray(enc[name], dtype=np.int64) for name in names}


class Encoder:
    """`encoder(texts, pairs, max_length, names)` → {name: (B, T) int64 array}, as `hf_arrays` gives them.

    `names`: which of input_ids, attention_mask, token_type_ids to return. Texts alone go to the backend
    copy (one `encode` at batch 1, `encode_batch` above); pairs, and a tokenizer the probe refused, go
    through transformers.
    """

    def __init__(self, tokenizer, direct: bool = True):
        self.tokenizer = tokenizer
        self.direct = direct  # False: always transformers' call (benchmarks/latency.py's baseline)
        self._backends: dict[int, object] = {}  # max_length → the backend copy set to it, or None (refused)

    def __call__(self, texts: Sequence[str], pairs: Optional[Sequence[str]], max_length: int,
                 names: Sequence[str]) -> dict[str, np.ndarray]:
        backend = self.backend(max_length) if pairs is None else None
        if backend is None:
            return hf_arrays(self.tokenizer, texts, pairs, max_length, names)
        return _arrays(backend, texts, names)

    def backend(self, max_length: int):
        """The backend copy set to truncate at max_length and pad to the longest row, or None where it would
        not give transformers' arrays."""
        if not self.direct:
            return None
        if max_length not in self._backends:
            self._backends[max_length] = self._checked_backend(max_length)
        return self._backends[max_length]

    def _checked_backend(self, max_length: int):
        tok = self.tokenizer
        source = getattr(tok, "backend_tokenizer", None)
        if source is None or tok.pad_token_id is None:
            return None
        try:
            from tokenizers import Tokenizer

            backend = Tokenizer.from_str(source.to_str())  # a copy: transformers re-sets its own on every call
            backend.enable_truncation(max_length, strategy="longest_first",
                                      direction=getattr(tok, "truncation_side", "right"))
            backend.enable_padding(direction=getattr(tok, "padding_side", "right"), pad_id=int(tok.pad_token_id),
                                   pad_type_id=int(getattr(tok, "pad_token_type_id", 0) or 0),
                                   pad_token=str(tok.pad_token))
            for batch in ([PROBES[1]], list(PROBES)):  # batch 1 (encode) and a padded batch (encode_batch)
                want = hf_arrays(tok, batch, None, max_length, ARRAYS)
                got = _arrays(backend, batch, ARRAYS)
                if any(not np.array_equal(want[n], got[n]) for n in ARRAYS):
                    log.debug("tokenizer: the direct call differs from transformers' on the probes; keeping theirs")
                    return None
        except Exception as exc:  # any surprise in the shortcut: the transformers call stays the one used
            log.debug("tokenizer: no direct call (%s); keeping transformers'", exc)
            return None
        return backend


def _arrays(backend, texts: Sequence[str], names: Sequence[str]) -> dict[str, np.ndarray]:
    encodings = [backend.encode(texts[0])] if len(texts) == 1 else backend.encode_batch(list(texts))
    return {name: np.array([getattr(e, FIELDS[name]) for e in encodings], dtype=np.int64) for name in names}
