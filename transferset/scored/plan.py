"""What `transferset score` checks and decides before any row is scored (no Beam).

Every check runs before anything under the output is touched: a refused run (another
teacher, another input, other options) leaves a complete output exactly as it was.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

import pyarrow as pa

from transferset import fs
from transferset.config import DEFAULT_MAX_LENGTH, ScoreConfig
from transferset.contract import schema
from transferset.data import transfer
from transferset.fs import remote
from transferset.fs.output import Output
from transferset.models import loading
from transferset.runtime.errors import UserError
from transferset.scored import shards
from transferset.teacher import ensemble, scoring
from transferset.teacher.train import trained_max_length

LOG = logging.getLogger("transferset.score")

# Shard metadata a resumed run must share with the shards already written.
RESUME_KEYS = (schema.META_TEACHER_SHA256, schema.META_LABEL_NAMES, schema.META_HIDDEN_SPEC, schema.META_MAX_LENGTH,
               schema.META_ENSEMBLE, schema.META_TEACHER_PRECISION)
RESUME_ABSENT = {schema.META_TEACHER_PRECISION: schema.UNRECORDED_PRECISION}  # what a key's absence means


@dataclass
class ScoreJob:
    """One scoring run: the settings (ScoreConfig) plus where to read and write."""

    input: str
    teacher: Union[str, Sequence[str]]  # one teacher, or the members of an ensemble (ScoreConfig.combine)
    output: str
    cfg: ScoreConfig = field(default_factory=ScoreConfig)
    resume: bool = False
    overwrite: bool = False
    # Test hook: a picklable callable (teacher_dir, **Teacher.load kwargs) -> Teacher.
    loader: Optional[Callable[..., Any]] = None

    @property
    def teachers(self) -> list[str]:
        return [self.teacher] if isinstance(self.teacher, str) else list(self.teacher)


@dataclass
class Plan:
    """What the driver checked and decided before the pipeline runs."""

    job: ScoreJob
    input_files: list[str]
    existing_files: list[str]
    label_names: list[str]
    num_classes: int
    hidden_size: int
    layers: list[int]  # normalised hidden_states indices; layers[0] is the last layer
    max_length: int
    metadata: dict[str, Any]
    output_schema: pa.Schema
    prefix: str
    input_rows: int  # from the input's Parquet footers: the progress total
    existing_rows: int  # rows in the shards already written (--resume)
    stats: dict[str, Any] = field(default_factory=dict)
    # (file index, path, first row, end row): the input split into ranges workers read independently
    input_units: list[tuple[int, str, int, int]] = field(default_factory=list)
    # an ensemble: each member's weights hash (the workers check the copies they load), in --teacher order
    member_sha256: list[str] = field(default_factory=list)
    precision: str = "fp32"  # the teacher's arithmetic when scoring, `auto` resolved where the pipeline is launched

    @property
    def data_dir(self) -> str:
        return fs.join(self.job.output, schema.DATA_DIR)

    @property
    def rows_to_score(self) -> int:
        """At most this many rows are scored by this run (rejects make it fewer)."""
        return max(self.input_rows - self.existing_rows, 0)


# --- the input ------------------------------------------------------------------------------------
def input_identity(directory: str, files: Sequence[str], file_rows: Optional[Sequence[int]] = None) -> dict[str, Any]:
    """The input's path and a fingerprint of its shards (names, sizes, footer row counts).

    Footers only: no row is read, so this costs one small read per shard even for gs:// inputs
    (none when `file_rows`, the footers' row counts, are given).
    """
    entries = []
    rows = 0
    for i, path in enumerate(files):
        n = transfer.shard_rows(path) if file_rows is None else file_rows[i]
        rows += n
        entries.append([fs.basename(path), fs.size(path), n])
    digest = hashlib.sha256(json.dumps(entries).encode("utf-8")).hexdigest()
    where = directory if fs.is_remote(directory) else os.path.abspath(directory)
    return {"path": where, "files": len(files), "rows": rows, "fingerprint": digest}


def _check_labels(teacher_dir: str, teacher_labels: Sequence[str], input_dir: str, input_labels: Sequence[str]) -> None:
    if list(teacher_labels) != list(input_labels):
        raise UserError(
            f"label mismatch: the teacher {teacher_dir} predicts {list(teacher_labels)} (config.json id2label) "
            f"but the transfer set {input_dir} has labels {list(input_labels)}. Fine-tune the teacher on this "
            "task's labels (`transferset teacher`), or fix id2label in the teacher's config.json if only "
            "the names differ"
        )


def dev_accuracy(teacher_dir: str) -> Optional[float]:
    """A `transferset teacher` directory's best dev accuracy (its metrics.json), None when it has none."""
    try:
        value = fs.read_json(fs.join(teacher_dir, schema.METRICS_FILE)).get("best_dev_accuracy")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# --- the output -----------------------------------------------------------------------------------
def output(path: str, *, input: str, teacher: Union[str, Sequence[str]], resume: bool = False,
           overwrite: bool = False) -> Output:
    """The score stage's output folder (transferset.fs.output): it may not contain the input or a teacher."""
    teachers = [teacher] if isinstance(teacher, str) else list(teacher)
    return Output(path, "score", inputs=[input, *teachers], resume=resume, overwrite=overwrite)


def check_resumable(path: str, expected: dict[str, Any]) -> None:
    """Refuse to resume into a shard written with another teacher, options or input (nothing is changed)."""
    meta = schema.check_schema(transfer.read_schema(path), where=path, scored=True)
    for key in RESUME_KEYS:
        have, want = (m.get(key, RESUME_ABSENT.get(key)) for m in (meta, expected))
        if have != want:
            raise UserError(
                f"--resume: {path} was written with {key} = {schema.cut(have, 300)}, this run has "
                f"{schema.cut(want, 300)}; "
                "resume with the same teacher and options, or pass --overwrite to score everything again"
            )
    have, want = meta.get(schema.META_INPUT), expected[schema.META_INPUT]
    if have is None:
        # Written before inputs were recorded: the stats check (ids not in the input) still guards it.
        return
    if have.get("fingerprint") != want["fingerprint"]:
        raise UserError(
            f"--resume: {path} was scored from the input {have.get('path')} ({have.get('files')} shard(s), "
            f"{have.get('rows')} rows), but --input {want['path']} has {want['files']} shard(s) and {want['rows']} "
            "rows with other names, sizes or row counts. Resume with the original --input, or pass --overwrite "
            "to score this input from scratch (or choose another --output)"
        )


def _rows_or_zero(path: str) -> int:
    try:
        return transfer.shard_rows(path)
    except (OSError, pa.ArrowException):  # not a whole Parquet file: nothing to count
        return 0


def prepare_output(job: ScoreJob, out: Output) -> None:
    """Clear what this run recomputes; called only once every check passed.

    --resume keeps whole shards under data/ and recomputes rejects and stats; otherwise what an
    earlier run wrote is cleared (it is not complete, or --overwrite was given).
    """
    data_dir = out.join(schema.DATA_DIR)
    if not job.resume and not out.complete:
        # A killed run's work is about to go: say how much, and how to keep it (one line).
        rows = sum(_rows_or_zero(p) for p in shards.committed_shards(data_dir))
        if rows:
            LOG.warning("%s: discarding %d row(s) already scored by a run that did not finish (no %s); "
                        "rerun with --resume to keep them and score only the rest", out.path, rows,
                        schema.COMPLETE_MARKER)
    out.prepare(keep=(schema.DATA_DIR,) if job.resume else ())
    if job.resume:
        fs.delete(shards.leftover_tmp_files(data_dir))
    fs.makedirs(data_dir)


# --- the plan -------------------------------------------------------------------------------------
@dataclass
class _Teachers:
    """The teachers as `plan` checked them: one, or the members of an ensemble (`main` speaks for it)."""

    ids: list[str]  # as given (--teacher)
    dirs: list[str]  # local copies
    hashes: list[str]  # weights' sha256, in --teacher order
    configs: list[Any]
    combine: Any  # ensemble.parse_combine's result
    main: int  # the member whose tokenizer, config and id the set records

    @property
    def ensemble(self) -> bool:
        return len(self.ids) > 1


def _load_teachers(job: ScoreJob) -> _Teachers:
    """Each teacher's local copy, weights hash and config; an ensemble's combine rule checked first."""
    cfg, teachers = job.cfg, job.teachers
    combine = ensemble.parse_combine(cfg.combine, len(teachers))  # K = 0 or an index out of range: refused
    # A remote teacher is copied fresh, so the hash recorded later is the one the workers must find.
    teacher_dirs = [remote.local_teacher(t, refresh=True) for t in teachers]
    hashes, configs = [], []
    for teacher_dir in teacher_dirs:
        loading.require_local_dir(teacher_dir)
        hashes.append(loading.sha256_of_files(loading.check_weights(teacher_dir, allow_pickle=cfg.allow_pickle)))
        configs.append(loading.load_config(teacher_dir, trust_remote_code=cfg.trust_remote_code))
    return _Teachers(teachers, teacher_dirs, hashes, configs, combine, ensemble.primary(combine))


def _where(target: str) -> str:
    """A path as the metadata records it: absolute when local, so it still names the file from elsewhere."""
    return target if fs.is_remote(target) else os.path.abspath(target)


def _metadata(input_meta: dict, t: _Teachers, teacher_labels: list[str], tokenizer, hidden_spec,
              max_length: int, identity: dict[str, Any], precision: str) -> dict[str, Any]:
    """The scored set's file metadata: the input's (its augmentation config and seed) plus this scoring's."""
    extra: dict[str, Any] = ({} if precision == schema.UNRECORDED_PRECISION
                             else {schema.META_TEACHER_PRECISION: precision})
    if t.ensemble:
        extra[schema.META_ENSEMBLE] = ensemble.ensemble_metadata(t.combine, [
            {schema.MEMBER_ID: _where(i), schema.MEMBER_SHA256: h, schema.MEMBER_DEV_ACCURACY: dev_accuracy(d)}
            for i, d, h in zip(t.ids, t.dirs, t.hashes)])
    metadata = dict(input_meta)
    metadata.update(schema.base_metadata(
        teacher_labels,
        **{
            schema.META_TEACHER_ID: _where(t.ids[t.main]),
            schema.META_TEACHER_SHA256: t.hashes[t.main],
            schema.META_TOKENIZER: scoring.tokenizer_info(tokenizer),
            schema.META_HIDDEN_SPEC: hidden_spec,
            schema.META_MAX_LENGTH: max_length,
            schema.META_INPUT: identity,
            **extra,
        },
    ))
    return metadata


def _open_output(job: ScoreJob, metadata: dict[str, Any]) -> tuple[list[str], int]:
    """Check OUT (and, with --resume, every shard already there), then prepare it: (shards kept, their rows)."""
    out = output(job.output, input=job.input, teacher=job.teachers, resume=job.resume, overwrite=job.overwrite)
    out.check()  # a complete output, or files of another's: refused before anything is changed
    existing: list[str] = []
    existing_rows = 0
    if job.resume:
        existing = shards.committed_shards(out.join(schema.DATA_DIR))
        for path in existing:
            check_resumable(path, metadata)
        existing_rows = sum(transfer.shard_rows(p) for p in existing)
    prepare_output(job, out)  # every check passed: only now is anything under OUT changed
    return existing, existing_rows


def plan(job: ScoreJob) -> Plan:
    """Check the input, the teacher and (with --resume) the shards already written; then prepare OUT."""
    cfg = job.cfg  # its values were checked when it was built (transferset.config)
    input_files = transfer.data_files(job.input)
    transfer.require_complete(job.input, allow_incomplete=cfg.allow_incomplete)
    input_meta = transfer.read_metadata(job.input)
    input_labels = list(input_meta.get(schema.META_LABEL_NAMES) or [])

    t = _load_teachers(job)
    # Members first (their classes must agree), then the set's labels against them.
    teacher_labels = ensemble.check_members(t.ids, [loading.label_names_of(c) for c in t.configs])
    _check_labels(t.ids[t.main], teacher_labels, job.input, input_labels)
    teacher_dir, config = t.dirs[t.main], t.configs[t.main]
    tokenizer = loading.load_tokenizer(teacher_dir, trust_remote_code=cfg.trust_remote_code)

    max_length = int(cfg.max_length or trained_max_length(teacher_dir) or DEFAULT_MAX_LENGTH)
    num_layers = int(config.num_hidden_layers)
    normalized = scoring.normalize_layers(cfg.layers, num_layers)
    layers = [num_layers] + [k for k in normalized if k != num_layers]
    hidden_size = int(config.hidden_size)
    input_files = sorted(input_files)  # a row's position (file index, row) orders duplicates as (path, row)
    file_rows = [transfer.shard_rows(p) for p in input_files]
    identity = input_identity(job.input, input_files, file_rows)

    precision = scoring.resolved_precision(cfg.precision)
    metadata = _metadata(input_meta, t, teacher_labels, tokenizer,
                         scoring.hidden_spec(cfg.hidden, layers, hidden_size, num_layers), max_length, identity,
                         precision)
    output_schema = schema.scored_schema(len(teacher_labels), hidden_size, layers[1:], metadata,
                                         members=len(t.ids))
    existing, existing_rows = _open_output(job, metadata)

    prefix = shards.run_prefix()
    stats = {
        "input": job.input, "teacher": t.ids[t.main], "teacher_sha256": metadata[schema.META_TEACHER_SHA256],
        "input_fingerprint": identity["fingerprint"], "input_rows_in_footers": identity["rows"],
        "hidden": cfg.hidden, "layers": layers, "max_length": max_length, "precision": precision,
        "resumed": job.resume,
        "existing_shards": len(existing), "shard_prefix": prefix,
        **({"teachers": t.ids, "combine": t.combine} if t.ensemble else {}),
    }
    return Plan(job, input_files, existing, teacher_labels, len(teacher_labels), hidden_size, layers, max_length,
                metadata, output_schema, prefix, identity["rows"], existing_rows, stats,
                shards.input_units(input_files, file_rows), t.hashes if t.ensemble else [], precision)
