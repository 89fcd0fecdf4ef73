"""The Parquet contract: column names, Arrow types, metadata keys and version.

This module is the single source of truth: every other module refers to columns
through these constants, never through string literals.
"""
from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa

from transferset.errors import UserError

SCHEMA_VERSION = "1"

# --- columns ---------------------------------------------------------------
ID = "id"
SOURCE_ID = "source_id"
TEXT = "text"
TEXT_B = "text_b"
OPS = "ops"
LABEL = "label"
TEACHER_LABEL = "teacher_label"
TEACHER_LOGITS = "teacher_logits"
TEACHER_HIDDEN = "teacher_hidden"
TEACHER_HIDDEN_LAYER_PREFIX = "teacher_hidden_l"

TRANSFER_COLUMNS = (ID, SOURCE_ID, TEXT, TEXT_B, OPS, LABEL)
TEACHER_COLUMNS = (TEACHER_LABEL, TEACHER_LOGITS, TEACHER_HIDDEN)

# --- reject records (OUT/rejects/*.jsonl) ------------------------------------
REJECT_FILE = "file"
REJECT_LINE = "line"
REJECT_RAW = "raw"
REJECT_REASON = "reason"

# --- file-level metadata keys -------------------------------------------------
META_PREFIX = "transferset."
META_SCHEMA_VERSION = META_PREFIX + "schema_version"
META_LIBRARY_VERSION = META_PREFIX + "library_version"
META_LABEL_NAMES = META_PREFIX + "label_names"
META_AUGMENT_CONFIG = META_PREFIX + "augment_config"
META_SEED = META_PREFIX + "seed"
META_TEACHER_ID = META_PREFIX + "teacher_id"
META_TEACHER_SHA256 = META_PREFIX + "teacher_weights_sha256"
META_TOKENIZER = META_PREFIX + "tokenizer"
META_HIDDEN_SPEC = META_PREFIX + "hidden_spec"
META_MAX_LENGTH = META_PREFIX + "max_length"
# the scored set's input: {"path", "files", "rows", "fingerprint"} (a digest of its shards' names,
# sizes and row counts), so --resume refuses a different input before scoring anything
META_INPUT = META_PREFIX + "input"

# --- keys of the META_HIDDEN_SPEC value (what teacher_hidden and teacher_hidden_l{k} hold) ------
HIDDEN_POOLING = "pooling"              # cls | mean
HIDDEN_LAYER = "layer"                  # hidden_states index behind teacher_hidden (the last layer)
HIDDEN_EXTRA_LAYERS = "extra_layers"    # indices k of the teacher_hidden_l{k} columns
HIDDEN_NUM_LAYERS = "num_hidden_layers"  # the teacher's encoder layers
HIDDEN_SIZE = "hidden_size"
HIDDEN_DTYPE = "dtype"
HIDDEN_LAYER_INDEX = "layer_index"      # how to read the indices (0 = embeddings)

# --- output layout ------------------------------------------------------------
DATA_DIR = "data"
REJECTS_DIR = "rejects"
STATS_FILE = "stats.json"
COMPLETE_MARKER = "_COMPLETE"

# --- a trained student (`transferset train --output DIR`) --------------------
STUDENT_MODEL_DIR = "model"          # DIR/model: the student, loadable with `transferset evaluate`
METRICS_FILE = "metrics.json"        # DIR/metrics.json
CURVES_FILE = "curves.png"           # DIR/curves.png
HF_CONFIG_FILE = "config.json"       # a Hugging Face model directory's config (id2label, architecture)
WEIGHTS_FILE = "model.safetensors"   # the weights, in a student's and in a Hugging Face directory
STUDENT_SIDECAR_FILE = "transferset.json"  # family, label names and tokens of a transferset student


def hidden_layer_column(layer: int) -> str:
    """Column holding the pooled hidden state of teacher layer `layer` (e.g. teacher_hidden_l3)."""
    return f"{TEACHER_HIDDEN_LAYER_PREFIX}{layer}"


def transfer_fields() -> list[pa.Field]:
    return [
        pa.field(ID, pa.string(), nullable=False),
        pa.field(SOURCE_ID, pa.string(), nullable=False),
        pa.field(TEXT, pa.string(), nullable=False),
        pa.field(TEXT_B, pa.string(), nullable=True),
        pa.field(OPS, pa.list_(pa.string()), nullable=False),
        pa.field(LABEL, pa.int32(), nullable=True),
    ]


def teacher_fields(num_classes: int, hidden_size: int, layers: Sequence[int] = ()) -> list[pa.Field]:
    fields = [
        pa.field(TEACHER_LABEL, pa.int32(), nullable=False),
        pa.field(TEACHER_LOGITS, pa.list_(pa.float32(), num_classes), nullable=False),
        pa.field(TEACHER_HIDDEN, pa.list_(pa.float16(), hidden_size), nullable=False),
    ]
    for k in layers:
        fields.append(pa.field(hidden_layer_column(k), pa.list_(pa.float16(), hidden_size), nullable=False))
    return fields


def encode_metadata(meta: Mapping[str, Any]) -> dict[bytes, bytes]:
    """Encode metadata values as JSON so lists and dicts survive the round trip."""
    return {k.encode(): json.dumps(v, sort_keys=True).encode() for k, v in meta.items()}


def decode_metadata(raw: Mapping[bytes, bytes] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in (raw or {}).items():
        key = k.decode()
        if not key.startswith(META_PREFIX):
            continue
        try:
            out[key] = json.loads(v.decode())
        except ValueError:
            out[key] = v.decode()
    return out


def base_metadata(label_names: Sequence[str], **extra: Any) -> dict[str, Any]:
    from transferset import __version__

    meta = {
        META_SCHEMA_VERSION: SCHEMA_VERSION,
        META_LIBRARY_VERSION: __version__,
        META_LABEL_NAMES: list(label_names),
    }
    meta.update(extra)
    return meta


def transfer_schema(metadata: Mapping[str, Any] | None = None) -> pa.Schema:
    return pa.schema(transfer_fields(), metadata=encode_metadata(metadata or {}))


def scored_schema(
    num_classes: int,
    hidden_size: int,
    layers: Sequence[int] = (),
    metadata: Mapping[str, Any] | None = None,
) -> pa.Schema:
    return pa.schema(
        transfer_fields() + teacher_fields(num_classes, hidden_size, layers),
        metadata=encode_metadata(metadata or {}),
    )


class SchemaError(UserError, ValueError):
    """A Parquet file does not match the transferset contract."""


def check_schema(schema: pa.Schema, *, where: str, scored: bool = False) -> dict[str, Any]:
    """Check a file's schema and metadata; return the decoded metadata.

    Raises SchemaError naming the file and what to do when it does not match.
    """
    meta = decode_metadata(schema.metadata)
    version = meta.get(META_SCHEMA_VERSION)
    if version is None:
        raise SchemaError(
            f"{where}: no {META_SCHEMA_VERSION} in the Parquet metadata; "
            "this file was not written by transferset (run `transferset augment` / `score` to make one)"
        )
    if str(version) != SCHEMA_VERSION:
        raise SchemaError(
            f"{where}: schema version {version!r}, this transferset reads version {SCHEMA_VERSION!r}; "
            "rebuild the file with this version of transferset"
        )
    required: Iterable[str] = TRANSFER_COLUMNS + (TEACHER_COLUMNS if scored else ())
    missing = [c for c in required if c not in schema.names]
    if missing:
        hint = " (run `transferset score` on it first)" if scored and set(missing) & set(TEACHER_COLUMNS) else ""
        raise SchemaError(f"{where}: missing column(s) {missing}{hint}")
    return meta
