"""The Parquet contract: column names, Arrow types, metadata keys and version.

This module is the single source of truth: every other module refers to columns
through these constants, never through string literals.
"""
from __future__ import annotations

import json
import os
from typing import Annotated, Any, Iterable, Mapping, Optional, Sequence, Union

import pyarrow as pa
import pydantic
from pydantic import Field, StringConstraints, TypeAdapter
from typing_extensions import NotRequired, TypedDict

from transferset import __version__
from transferset.runtime.errors import UserError

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
# A set scored by a teacher ensemble (several `score --teacher`): teacher_logits_{k} holds member k's raw
# logits, in the order of META_ENSEMBLE's teachers; teacher_logits holds their combination. Absent with one teacher.
TEACHER_LOGITS_MEMBER_PREFIX = "teacher_logits_"

# `transferset predict`'s output (with ID, SOURCE_ID, TEXT and TEXT_B): where each row was read, the
# predicted name and one float32 probability column per label name, in class order. INPUT_FILE is the
# input as given on the command line; INPUT_LINE its line there as `sed -n Np` counts (a TSV/CSV's header
# is line 1), or the row number from 1 in a Parquet file or hf: dataset: the same two fields as a reject's.
INPUT_FILE = "file"
INPUT_LINE = "line"
PREDICTED_LABEL = "predicted_label"
PROB_PREFIX = "prob_"

TRANSFER_COLUMNS = (ID, SOURCE_ID, TEXT, TEXT_B, OPS, LABEL)
TEACHER_COLUMNS = (TEACHER_LABEL, TEACHER_LOGITS, TEACHER_HIDDEN)

# --- reject records (OUT/rejects/*.jsonl) ------------------------------------
REJECT_FILE = INPUT_FILE
REJECT_LINE = INPUT_LINE
REJECT_RAW = "raw"
REJECT_REASON = "reason"
REJECT_RAW_CHARS = "raw_chars"  # in stats.json's first_rejects: the length of a raw row cut to a sample

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
# the teacher's precision when scoring ("bf16"); absent: UNRECORDED_PRECISION, which is never written, so a set
# scored at it has the same metadata (and `run` the same score key) as one scored without the setting
META_TEACHER_PRECISION = META_PREFIX + "teacher_precision"
UNRECORDED_PRECISION = "fp32"
# the scored set's input: {"path", "files", "rows", "fingerprint"} (a digest of its shards' names,
# sizes and row counts), so --resume refuses a different input before scoring anything
META_INPUT = META_PREFIX + "input"
META_MODEL = META_PREFIX + "model"  # predictions: the --model they came from
# a set scored by a teacher ensemble: {combine, primary, teachers: [{id, sha256, dev_accuracy}]} (ENSEMBLE_*
# keys); absent with one teacher. teacher_id, teacher_weights_sha256, the tokenizer and the hidden spec
# are the primary member's (the student's online teacher and the source of teacher_hidden)
META_ENSEMBLE = META_PREFIX + "ensemble"

# --- keys of the META_HIDDEN_SPEC value (what teacher_hidden and teacher_hidden_l{k} hold) ------
HIDDEN_POOLING = "pooling"              # cls | mean
HIDDEN_LAYER = "layer"                  # hidden_states index behind teacher_hidden (the last layer)
HIDDEN_EXTRA_LAYERS = "extra_layers"    # indices k of the teacher_hidden_l{k} columns
HIDDEN_NUM_LAYERS = "num_hidden_layers"  # the teacher's encoder layers
HIDDEN_SIZE = "hidden_size"
HIDDEN_DTYPE = "dtype"
HIDDEN_LAYER_INDEX = "layer_index"      # how to read the indices (0 = embeddings)

# --- keys of the META_ENSEMBLE value ------------------------------------------------------------
ENSEMBLE_COMBINE = "combine"    # how teacher_logits combines the members: mean | probs | a member's index
ENSEMBLE_PRIMARY = "primary"    # index of the member whose hidden states, tokenizer and id the set records
ENSEMBLE_TEACHERS = "teachers"  # one entry per member, in teacher_logits_{k} order:
MEMBER_ID = "id"                # its directory or URL
MEMBER_SHA256 = "sha256"        # its weights' hash
MEMBER_DEV_ACCURACY = "dev_accuracy"  # its best dev accuracy from `transferset teacher`'s metrics.json (None: unknown)

# --- output layout ------------------------------------------------------------
DATA_DIR = "data"
REJECTS_DIR = "rejects"
STATS_FILE = "stats.json"
COMPLETE_MARKER = "_COMPLETE"
LOCK_FILE = ".transferset.lock"  # the run writing into a folder (transferset.fs.lock); absent when none
MANIFEST_FILE = ".transferset-output.json"  # which command wrote the folder, and what it wrote (transferset.fs.output)
# `transferset run`'s record of a stage in its folder: the key, and whether it is still running (app/run/runner.py)
STAGE_FILE = ".stage.json"

# --- a trained student (`transferset train --output DIR`) --------------------
STUDENT_MODEL_DIR = "model"          # DIR/model: the student, loadable with `transferset evaluate`
METRICS_FILE = "metrics.json"        # DIR/metrics.json
PRUNE_FILE = "prune.json"            # a pruned model's folder: heads removed, importances, accuracies
SEARCH_CHOICE_FILE = "chosen_by.json"  # a searched student's folder: its budget and what it was chosen against
CURVES_FILE = "curves.png"           # DIR/curves.png
HF_CONFIG_FILE = "config.json"       # a Hugging Face model directory's config (id2label, architecture)
WEIGHTS_FILE = "model.safetensors"   # the weights, in a student's and in a Hugging Face directory
STUDENT_SIDECAR_FILE = "transferset.json"  # family, label names and tokens of a transferset student
EXITS_FILE = "exits.json"              # a model with early exits: the branches' shape and training
EXITS_WEIGHTS_FILE = "exits.safetensors"  # ... and their weights (students/families/exits.py)


def model_dir(path: str) -> str:
    """The folder holding a model's files: a `transferset train` output's model/, else `path` itself (local)."""
    inner = os.path.join(path, STUDENT_MODEL_DIR)
    return inner if os.path.isdir(inner) else path


def prob_column(label_name: str) -> str:
    """The predictions' probability column of one class."""
    return PROB_PREFIX + str(label_name)


def hidden_layer_column(layer: int) -> str:
    """Column holding the pooled hidden state of teacher layer `layer` (e.g. teacher_hidden_l3)."""
    return f"{TEACHER_HIDDEN_LAYER_PREFIX}{layer}"


def member_logits_column(k: int) -> str:
    """Column holding ensemble member k's raw logits (e.g. teacher_logits_0)."""
    return f"{TEACHER_LOGITS_MEMBER_PREFIX}{k}"


def member_columns(names: Iterable[str]) -> list[str]:
    """The member logits columns among `names`, in member order."""
    start = len(TEACHER_LOGITS_MEMBER_PREFIX)
    found = [n for n in names if n.startswith(TEACHER_LOGITS_MEMBER_PREFIX) and n[start:].isdigit()]
    return sorted(found, key=lambda n: int(n[start:]))


def transfer_fields() -> list[pa.Field]:
    return [
        pa.field(ID, pa.string(), nullable=False),
        pa.field(SOURCE_ID, pa.string(), nullable=False),
        pa.field(TEXT, pa.string(), nullable=False),
        pa.field(TEXT_B, pa.string(), nullable=True),
        pa.field(OPS, pa.list_(pa.string()), nullable=False),
        pa.field(LABEL, pa.int32(), nullable=True),
    ]


def teacher_fields(num_classes: int, hidden_size: int, layers: Sequence[int] = (), members: int = 0) -> list[pa.Field]:
    """`members`: the number of ensemble members (0 or 1: one teacher, no member columns)."""
    fields = [
        pa.field(TEACHER_LABEL, pa.int32(), nullable=False),
        pa.field(TEACHER_LOGITS, pa.list_(pa.float32(), num_classes), nullable=False),
        pa.field(TEACHER_HIDDEN, pa.list_(pa.float16(), hidden_size), nullable=False),
    ]
    for k in layers:
        fields.append(pa.field(hidden_layer_column(k), pa.list_(pa.float16(), hidden_size), nullable=False))
    if members > 1:
        fields += [pa.field(member_logits_column(k), pa.list_(pa.float32(), num_classes), nullable=False)
                   for k in range(members)]
    return fields


def encode_metadata(meta: Mapping[str, Any]) -> dict[bytes, bytes]:
    """Encode metadata values as JSON so lists and dicts survive the round trip."""
    return {k.encode(): json.dumps(v, sort_keys=True).encode() for k, v in meta.items()}


# --- what a reader accepts in the metadata (a crafted or damaged footer is refused, never trusted) ------
MAX_META_VALUE_BYTES = 1_000_000  # one metadata value, as JSON
MAX_META_DEPTH = 32  # nesting of lists and mappings in one value
MAX_LABELS = 1_000  # classes
MAX_LABEL_CHARS = 200  # characters of one label name
MAX_MAX_LENGTH = 100_000  # tokens per row
SHOWN_CHARS = 100  # characters of a bad value quoted in a message


def cut(value: Any, limit: int = SHOWN_CHARS) -> str:
    """repr(value) for a message, cut to `limit` characters (with the full length when cut)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters)"


def _metadata_types() -> dict[str, Any]:
    """The pydantic type of each known metadata key (strict: "5" is not an int, True is not a number)."""
    def text(n: int) -> Any:
        return Annotated[str, StringConstraints(max_length=n)]

    def count(low: int, high: int) -> Any:
        return Annotated[int, Field(ge=low, le=high)]

    layer = count(0, MAX_MAX_LENGTH)
    hidden_spec = TypedDict("HiddenSpec", {  # keys: the HIDDEN_* constants above
        HIDDEN_POOLING: text(32),
        HIDDEN_LAYER: layer,
        HIDDEN_EXTRA_LAYERS: Annotated[list[layer], Field(max_length=MAX_LABELS)],
        HIDDEN_NUM_LAYERS: count(1, MAX_MAX_LENGTH),
        HIDDEN_SIZE: count(1, 10_000_000),
        HIDDEN_DTYPE: text(32),
        HIDDEN_LAYER_INDEX: NotRequired[text(1_000)],
    })
    member = TypedDict("EnsembleMember", {
        MEMBER_ID: text(4_096), MEMBER_SHA256: text(200),
        MEMBER_DEV_ACCURACY: Optional[Annotated[float, Field(ge=0.0, le=1.0)]],
    })
    ensemble = TypedDict("Ensemble", {  # keys: the ENSEMBLE_* constants above
        ENSEMBLE_COMBINE: Union[text(32), count(0, MAX_LABELS)],
        ENSEMBLE_PRIMARY: count(0, MAX_LABELS),
        ENSEMBLE_TEACHERS: Annotated[list[member], Field(min_length=2, max_length=MAX_LABELS)],
    })
    input_identity = TypedDict("InputIdentity", {
        "path": text(4_096), "files": count(0, 10**12), "rows": count(0, 10**15), "fingerprint": text(200),
    })
    return {
        META_SCHEMA_VERSION: Union[text(20), int],
        META_LIBRARY_VERSION: text(100),
        META_LABEL_NAMES: Annotated[list[text(MAX_LABEL_CHARS)], Field(max_length=MAX_LABELS)],
        META_AUGMENT_CONFIG: dict[str, Any],
        META_SEED: int,
        META_TEACHER_ID: text(4_096),
        META_TEACHER_SHA256: text(200),
        META_TOKENIZER: Union[dict[str, Any], text(4_096)],
        META_HIDDEN_SPEC: hidden_spec,
        META_MAX_LENGTH: count(1, MAX_MAX_LENGTH),
        META_TEACHER_PRECISION: text(20),
        META_INPUT: input_identity,
        META_ENSEMBLE: ensemble,
    }


_ADAPTERS: dict[str, Any] = {}


def _adapter(key: str):
    if not _ADAPTERS:
        _ADAPTERS.update({k: TypeAdapter(tp) for k, tp in _metadata_types().items()})
    return _ADAPTERS.get(key)


def _depth(value: Any) -> int:
    """Nesting depth of lists and mappings, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, d = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, d)
            if d > MAX_META_DEPTH:
                break
            stack.extend((v, d + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _refuse(where: str, key: str, value: Any, problem: str, writing: bool = False) -> "SchemaError":
    shown = f" = {cut(value)}" if value is not None else ""
    advice = ("readers would refuse it: keep within the limits of transferset.contract.schema" if writing else
              "the file is damaged or was not written by transferset: write it again (`transferset augment` / `score`)")
    return SchemaError(f"{where}: Parquet metadata {key}{shown}: {problem}; {advice}")


def check_metadata_value(key: str, value: Any, *, where: str, writing: bool = False) -> Any:
    """`value` when it fits the contract for `key` (known keys by type and size), else a SchemaError."""
    if _depth(value) > MAX_META_DEPTH:
        raise _refuse(where, key, value, f"nested deeper than {MAX_META_DEPTH} levels", writing)
    adapter = _adapter(key)
    if adapter is None:  # a key of a later version or an extension: its size was checked
        return value
    try:
        return adapter.validate_python(value, strict=True)
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        loc = "".join(f"[{p!r}]" for p in err["loc"])
        raise _refuse(where, key, value, f"{loc + ': ' if loc else ''}{err['msg'].lower()}", writing) from None


def decode_metadata(raw: Mapping[bytes, bytes] | None, *, where: str = "Parquet file") -> dict[str, Any]:
    """The transferset.* keys of a file's metadata, decoded and checked against the contract.

    Every value must be UTF-8 JSON of at most MAX_META_VALUE_BYTES, nested at most MAX_META_DEPTH
    levels, and of the type the contract gives its key (label names: at most MAX_LABELS names of at
    most MAX_LABEL_CHARS characters; max_length 1..MAX_MAX_LENGTH; a hidden spec with the HIDDEN_*
    keys). Anything else is a SchemaError naming `where`, the key and the value (cut), never a
    traceback or a silently accepted value.
    """
    out: dict[str, Any] = {}
    prefix = META_PREFIX.encode()
    for k, v in (raw or {}).items():
        if not k.startswith(prefix):
            continue
        try:
            key = k.decode("utf-8")
        except UnicodeDecodeError:
            raise _refuse(where, cut(k), None, "the key is not UTF-8") from None
        if len(v) > MAX_META_VALUE_BYTES:
            start = v[:SHOWN_CHARS].decode("utf-8", "replace")
            raise _refuse(where, key, None, f"{len(v):,} bytes (starting {start!r}…), more than the "
                          f"{MAX_META_VALUE_BYTES:,} a value may have")
        try:
            text = v.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _refuse(where, key, v[:SHOWN_CHARS], f"not UTF-8 (byte {exc.start})") from None
        try:
            value = json.loads(text)
        except RecursionError:
            raise _refuse(where, key, text, "nested too deeply") from None
        except ValueError as exc:
            raise _refuse(where, key, text, f"not JSON ({exc})") from None
        out[key] = check_metadata_value(key, value, where=where)
    return out


def base_metadata(label_names: Sequence[str], **extra: Any) -> dict[str, Any]:
    meta = {
        META_SCHEMA_VERSION: SCHEMA_VERSION,
        META_LIBRARY_VERSION: __version__,
        META_LABEL_NAMES: list(label_names),
    }
    meta.update(extra)
    # What a reader would refuse is refused here, before a run writes a set nobody can read back.
    for key, value in meta.items():
        if key.startswith(META_PREFIX):
            check_metadata_value(key, value, where="the metadata to write", writing=True)
        if len(json.dumps(value)) > MAX_META_VALUE_BYTES:
            raise _refuse("the metadata to write", key, None, f"more than {MAX_META_VALUE_BYTES:,} bytes", True)
    return meta


def transfer_schema(metadata: Mapping[str, Any] | None = None) -> pa.Schema:
    return pa.schema(transfer_fields(), metadata=encode_metadata(metadata or {}))


def scored_schema(
    num_classes: int,
    hidden_size: int,
    layers: Sequence[int] = (),
    metadata: Mapping[str, Any] | None = None,
    members: int = 0,
) -> pa.Schema:
    return pa.schema(
        transfer_fields() + teacher_fields(num_classes, hidden_size, layers, members),
        metadata=encode_metadata(metadata or {}),
    )


class SchemaError(UserError, ValueError):
    """A Parquet file does not match the transferset contract."""


def check_schema(schema: pa.Schema, *, where: str, scored: bool = False) -> dict[str, Any]:
    """Check a file's schema and metadata; return the decoded metadata.

    Raises SchemaError naming the file and what to do when it does not match.
    """
    meta = decode_metadata(schema.metadata, where=where)
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
