"""`transferset score`: score a transfer set once with the teacher (Apache Beam).

    input shards ─ReadInputRows─▶ (id, row) ─JoinExistingIds─▶ Route ─┬─▶ ScoreWithTeacher ─▶ WriteScoredShards
    OUT/data (--resume) ─ReadExistingIds─┘                            └─▶ rejects ─▶ OUT/rejects/*.jsonl
                                           CleanUpShards + rejects ─▶ Finalize (stats.json, _COMPLETE)

The scoring logic lives in transferset.teacher.scoring (tested without Beam); this module
only routes rows. Scored rows are committed in shards as they are produced (each written to
a temporary name, then renamed), so a killed run leaves whole shards behind and `--resume`
scores only the ids not in them.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Optional, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.ml.inference.base import KeyedModelHandler, ModelHandler, RunInference
from apache_beam.transforms.window import GlobalWindows

from pipelines import options as opts
from transferset import config, schema, transfer
from transferset.config import BeamConfig, ScoreConfig
from transferset.errors import UserError
from transferset.sources import Reject
from transferset.teacher import loading, scoring

EPILOG = (
    "Example:\n"
    "  transferset score --input runs/transfer --teacher runs/teacher --output runs/scored \\\n"
    "      --runner FnApiRunner --direct_num_workers 2\n\n"
    "Writes zstd Parquet under OUT/data/ (the input columns plus teacher_label, teacher_logits and\n"
    "teacher_hidden), rejects under OUT/rejects/, then OUT/stats.json and OUT/_COMPLETE.\n"
    "After an interrupted run, rerun the same command with --resume: only ids not yet written are scored."
)

LOG = logging.getLogger("transferset.score")
SHARD_PREFIX = "part"
TMP_PREFIX = "_tmp-"
METRICS_NAMESPACE = "transferset_score"


# --- configuration ------------------------------------------------------------------------------
@dataclass
class ScoreJob:
    """One scoring run: the settings (ScoreConfig) plus where to read and write."""

    input: str
    teacher: str
    output: str
    cfg: ScoreConfig = field(default_factory=ScoreConfig)
    resume: bool = False
    overwrite: bool = False
    # Test hook: a picklable callable (teacher_dir, **Teacher.load kwargs) -> Teacher.
    loader: Optional[Callable[..., Any]] = None


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
    stats: dict[str, Any] = field(default_factory=dict)


def _check_labels(teacher_dir: str, teacher_labels: Sequence[str], input_dir: str, input_labels: Sequence[str]) -> None:
    if list(teacher_labels) != list(input_labels):
        raise UserError(
            f"label mismatch: the teacher {teacher_dir} predicts {list(teacher_labels)} (config.json id2label) "
            f"but the transfer set {input_dir} has labels {list(input_labels)}. Fine-tune the teacher on this "
            "task's labels (`transferset teacher`), or fix id2label in the teacher's config.json if only "
            "the names differ"
        )


def _shard_metadata_matches(path: str, expected: dict[str, Any]) -> None:
    meta = schema.check_schema(pq.read_schema(path), where=path, scored=True)
    keys = (schema.META_TEACHER_SHA256, schema.META_LABEL_NAMES, schema.META_HIDDEN_SPEC, schema.META_MAX_LENGTH)
    for key in keys:
        if meta.get(key) != expected.get(key):
            raise UserError(
                f"--resume: {path} was written with {key} = {meta.get(key)!r}, this run has {expected.get(key)!r}; "
                "resume with the same teacher and options, or pass --overwrite to score everything again"
            )


def _list_dir(directory: str) -> list[str]:
    if not FileSystems.exists(directory):
        return []
    return sorted(m.path for m in FileSystems.match([opts.join(directory, "*")])[0].metadata_list)


def plan(job: ScoreJob) -> Plan:
    """Check the input, the teacher and (with --resume) the shards already written; prepare OUT."""
    cfg = job.cfg  # its values were checked when it was built (transferset.config)
    input_files = transfer.data_files(job.input)
    input_meta = transfer.read_metadata(job.input)
    input_labels = list(input_meta.get(schema.META_LABEL_NAMES) or [])

    loading.require_local_dir(job.teacher)
    weights = loading.check_weights(job.teacher, allow_pickle=cfg.allow_pickle)
    config = loading.load_config(job.teacher, trust_remote_code=cfg.trust_remote_code)
    teacher_labels = loading.label_names_of(config)
    _check_labels(job.teacher, teacher_labels, job.input, input_labels)
    tokenizer = loading.load_tokenizer(job.teacher, trust_remote_code=cfg.trust_remote_code)

    from transferset.teacher.train import trained_max_length

    max_length = int(cfg.max_length or trained_max_length(job.teacher) or scoring.DEFAULT_MAX_LENGTH)
    num_layers = int(config.num_hidden_layers)
    normalized = scoring.normalize_layers(cfg.layers, num_layers)
    layers = [num_layers] + [k for k in normalized if k != num_layers]
    hidden_size = int(config.hidden_size)

    metadata = dict(input_meta)  # keeps the augmentation config and seed of the input
    metadata.update(schema.base_metadata(
        teacher_labels,
        **{
            schema.META_TEACHER_ID: os.path.abspath(job.teacher),
            schema.META_TEACHER_SHA256: loading.sha256_of_files(weights),
            schema.META_TOKENIZER: scoring.tokenizer_info(tokenizer),
            schema.META_HIDDEN_SPEC: scoring.hidden_spec(cfg.hidden, layers, hidden_size, num_layers),
            schema.META_MAX_LENGTH: max_length,
        },
    ))
    output_schema = schema.scored_schema(len(teacher_labels), hidden_size, layers[1:], metadata)

    opts.prepare_output(job.output, overwrite=job.overwrite, resume=job.resume)
    data_dir = opts.join(job.output, schema.DATA_DIR)
    existing: list[str] = []
    if job.resume:
        # Rejects and stats are recomputed in full; only scored shards are kept.
        for name in (schema.REJECTS_DIR, schema.STATS_FILE):
            path = opts.join(job.output, name)
            if FileSystems.exists(path):
                FileSystems.delete([path])
        leftovers = [p for p in _list_dir(data_dir) if os.path.basename(p).startswith(TMP_PREFIX)]
        if leftovers:
            FileSystems.delete(leftovers)
        existing = [p for p in _list_dir(data_dir) if p.endswith(".parquet")]
        for path in existing:
            _shard_metadata_matches(path, metadata)
    if "://" not in data_dir:
        os.makedirs(data_dir, exist_ok=True)
    # A distinct prefix per run: shards of an earlier (interrupted) run are never overwritten.
    prefix = f"{SHARD_PREFIX}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"
    stats = {
        "input": job.input, "teacher": job.teacher, "teacher_sha256": metadata[schema.META_TEACHER_SHA256],
        "hidden": cfg.hidden, "layers": layers, "max_length": max_length, "resumed": job.resume,
        "existing_shards": len(existing), "shard_prefix": prefix,
    }
    return Plan(job, input_files, existing, teacher_labels, len(teacher_labels), hidden_size, layers, max_length,
                metadata, output_schema, prefix, stats)


# --- reading ------------------------------------------------------------------------------------
def read_input_rows(path: str) -> Iterable[tuple[str, tuple[dict, str, int]]]:
    """(id, (row, file, row number)) for every row of one input shard; empty shards yield nothing."""
    with FileSystems.open(path) as fh:
        pf = pq.ParquetFile(fh)
        n = 0
        for batch in pf.iter_batches(batch_size=4096, columns=list(schema.TRANSFER_COLUMNS)):
            for row in batch.to_pylist():
                n += 1
                yield row[schema.ID], (row, path, n)


def read_ids(path: str) -> Iterable[tuple[str, None]]:
    with FileSystems.open(path) as fh:
        pf = pq.ParquetFile(fh)
        for batch in pf.iter_batches(batch_size=65536, columns=[schema.ID]):
            for value in batch.column(0).to_pylist():
                yield value, None


def _reject(row: dict, path: str, n: int, reason: str) -> dict:
    raw = json.dumps({k: row.get(k) for k in schema.TRANSFER_COLUMNS}, ensure_ascii=False)
    return Reject(path, n, raw, reason).to_dict()


class Route(beam.DoFn):
    """Per id: skip it when already written (--resume), reject invalid rows and duplicate ids, else score."""

    REJECT, DONE, STALE, DUPLICATED = "reject", "done", "stale", "duplicated"

    def process(self, element):
        key, grouped = element
        rows = sorted(grouped["input"], key=lambda r: (r[1], r[2]))  # deterministic: first by file, row
        existing = list(grouped["existing"])
        already = bool(existing)
        if len(existing) > 1:
            yield beam.pvalue.TaggedOutput(self.DUPLICATED, key)
        if not rows:
            if already:
                yield beam.pvalue.TaggedOutput(self.STALE, key)
            return
        kept = None
        for row, path, n in rows:
            text_b = row.get(schema.TEXT_B)
            if key is None or not str(key).strip():
                yield beam.pvalue.TaggedOutput(self.REJECT, _reject(row, path, n, "missing id"))
            elif not (row.get(schema.TEXT) or "").strip() or (text_b is not None and not text_b.strip()):
                yield beam.pvalue.TaggedOutput(self.REJECT, _reject(row, path, n, "empty text"))
            elif kept is not None:
                reason = f"duplicate id {key} (kept {kept[1]} row {kept[2]})"
                yield beam.pvalue.TaggedOutput(self.REJECT, _reject(row, path, n, reason))
            else:
                kept = (row, path, n)
        if kept is None:
            if already:
                yield beam.pvalue.TaggedOutput(self.STALE, key)
        elif already:
            yield beam.pvalue.TaggedOutput(self.DONE, key)
        else:
            yield key, kept[0]


# --- scoring ------------------------------------------------------------------------------------
def load_teacher(path: str, **kwargs) -> scoring.Teacher:
    return scoring.Teacher.load(path, **kwargs)


class TeacherModelHandler(ModelHandler):
    """Rows (dicts with text, text_b) -> the same rows plus teacher_label, teacher_logits, teacher_hidden.

    Beam's Hugging Face handlers import TensorFlow and split `hidden_states` wrongly, hence this one.
    """

    def __init__(self, teacher_dir: str, *, pooling: str = "cls", layers: Sequence[int] = (-1,),
                 max_length: int = scoring.DEFAULT_MAX_LENGTH, min_batch_size: Optional[int] = None,
                 max_batch_size: int = 1024,
                 forward_rows: Optional[int] = None, forward_tokens: Optional[int] = None, forward: str = "auto",
                 large_model: bool = False, torch_threads: Optional[int] = None, allow_pickle: bool = False,
                 trust_remote_code: bool = False, sha256: Optional[str] = None,
                 loader: Optional[Callable[..., Any]] = None):
        super().__init__(min_batch_size=min(min_batch_size or max_batch_size, max_batch_size),
                         max_batch_size=max_batch_size, large_model=large_model)
        self.teacher_dir = teacher_dir
        self.load_kwargs = dict(pooling=pooling, layers=list(layers), max_length=max_length,
                                forward_rows=forward_rows, forward_tokens=forward_tokens,
                                forward=forward, allow_pickle=allow_pickle,
                                trust_remote_code=trust_remote_code, sha256=sha256)
        self.torch_threads = torch_threads
        self.loader = loader

    def load_model(self) -> scoring.Teacher:
        import torch
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one bar per worker is noise in pipeline logs
        # Several workers on one machine must not each use every core.
        if self.torch_threads:
            torch.set_num_threads(int(self.torch_threads))
        return (self.loader or load_teacher)(self.teacher_dir, **self.load_kwargs)

    def run_inference(self, batch: Sequence[dict], model: scoring.Teacher, inference_args=None) -> list[dict]:
        texts = [row[schema.TEXT] for row in batch]
        texts_b = [row.get(schema.TEXT_B) for row in batch]
        scores = model.predict(texts, texts_b if any(b is not None for b in texts_b) else None)
        labels = scores.labels
        hidden = scores.hidden.astype(np.float16)  # (N, H): stored as float16; cast once, here
        extra = {schema.hidden_layer_column(k): v.astype(np.float16) for k, v in scores.layers.items()}
        out = []
        for i, row in enumerate(batch):
            scored = dict(row)
            scored[schema.TEACHER_LABEL] = int(labels[i])
            scored[schema.TEACHER_LOGITS] = scores.logits[i]
            scored[schema.TEACHER_HIDDEN] = hidden[i]
            for col, values in extra.items():
                scored[col] = values[i]
            out.append(scored)
        return out

    def get_num_bytes(self, batch: Sequence[dict]) -> int:
        # The default pickles the whole batch just to measure it.
        return sum(len(r[schema.TEXT]) + len(r.get(schema.TEXT_B) or "") for r in batch)

    def get_metrics_namespace(self) -> str:
        return METRICS_NAMESPACE


# --- writing ------------------------------------------------------------------------------------
def rows_to_table(rows: Sequence[dict], out_schema: pa.Schema) -> pa.Table:
    """Scored row dicts -> an Arrow table of `out_schema` (vector columns built from stacked numpy)."""
    arrays = []
    for f in out_schema:
        values = [r[f.name] for r in rows]
        if pa.types.is_fixed_size_list(f.type):
            size = f.type.list_size
            flat = np.stack(values).astype(f.type.value_type.to_pandas_dtype()) if values else \
                np.empty((0, size), dtype=f.type.value_type.to_pandas_dtype())
            if flat.shape[1:] != (size,):
                raise ValueError(f"column {f.name}: vectors of shape {flat.shape[1:]}, the schema says ({size},)")
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), size))
        else:
            arrays.append(pa.array(values, type=f.type))
    return pa.Table.from_arrays(arrays, schema=out_schema)


def write_shard(data_dir: str, prefix: str, rows: Sequence[dict], out_schema: pa.Schema) -> tuple[str, int]:
    """Write rows as one zstd shard, atomically: a temporary name first, then a rename.

    The name hashes the shard's ids, so a retried bundle that rewrites the same rows replaces
    its earlier file instead of adding a copy.
    """
    table = rows_to_table(rows, out_schema)
    digest = hashlib.sha1("\n".join(r[schema.ID] for r in rows).encode("utf-8")).hexdigest()[:16]
    final = opts.join(data_dir, f"{prefix}-{digest}.parquet")
    tmp = opts.join(data_dir, f"{TMP_PREFIX}{uuid.uuid4().hex}.partial")
    with FileSystems.create(tmp) as fh:
        pq.write_table(table, fh, compression="zstd")
    FileSystems.rename([tmp], [final])
    return final, table.num_rows


class WriteShards(beam.DoFn):
    """Buffer scored rows; commit a shard every `shard_rows` rows and at the end of each bundle."""

    def __init__(self, data_dir: str, prefix: str, out_schema: pa.Schema, shard_rows: int):
        self.data_dir, self.prefix, self.out_schema, self.shard_rows = data_dir, prefix, out_schema, shard_rows
        self.buffer: list[dict] = []

    def start_bundle(self):
        self.buffer = []

    def process(self, element):
        _, row = element
        self.buffer.append(row)
        if len(self.buffer) >= self.shard_rows:
            yield self._flush()

    def finish_bundle(self):
        if self.buffer:
            yield GlobalWindows.windowed_value(self._flush())

    def _flush(self) -> tuple[str, int]:
        rows, self.buffer = self.buffer, []
        return write_shard(self.data_dir, self.prefix, rows, self.out_schema)


def clean_up_shards(_, committed: Sequence[tuple[str, int]], data_dir: str, prefix: str,
                    out_schema: pa.Schema) -> int:
    """Delete shards of this run that no committed bundle produced (failed attempts); return shard count.

    When nothing at all was written (every row rejected), an empty shard keeps the schema and
    metadata readable.
    """
    keep = {path for path, _ in committed}
    files = _list_dir(data_dir)
    stray = [p for p in files if (os.path.basename(p).startswith(prefix) and p not in keep)
             or os.path.basename(p).startswith(TMP_PREFIX)]
    if stray:
        LOG.warning("deleting %d shard(s) left by failed bundle attempts", len(stray))
        FileSystems.delete(stray)
    shards = [p for p in files if p.endswith(".parquet") and p not in stray]
    if not shards:
        write_shard(data_dir, f"{prefix}-empty", [], out_schema)
        shards = [None]
    return len(shards)


def _sum(pcoll, label: str):
    return pcoll | label >> beam.CombineGlobally(sum)


def check_stats(stats: dict) -> None:
    if stats["existing_ids_not_in_input"]:
        raise ValueError(f"{stats['existing_ids_not_in_input']} id(s) in the output are not in the input: "
                         "this output was resumed with a different input; rerun with --overwrite")
    if stats["existing_ids_written_twice"]:
        raise ValueError(f"{stats['existing_ids_written_twice']} id(s) appear in more than one shard of the output; "
                         "rerun with --overwrite")
    if stats["input_rows"] != stats["scored"] + stats["rejected"]:
        raise ValueError(f"stats do not reconcile: input_rows {stats['input_rows']} != scored {stats['scored']} "
                         f"+ rejected {stats['rejected']}")


def build(pipeline: beam.Pipeline, job: ScoreJob) -> Plan:
    """Add the scoring steps to `pipeline`; returns the checked plan (schema, metadata, prefix)."""
    p = plan(job)
    cfg = job.cfg
    data_dir = opts.join(job.output, schema.DATA_DIR)

    rows = (pipeline
            | "ListInputShards" >> beam.Create(p.input_files)
            | "ReadInputRows" >> beam.FlatMap(read_input_rows))
    existing = (pipeline
                | "ListExistingShards" >> beam.Create(p.existing_files)
                | "ReadExistingIds" >> beam.FlatMap(read_ids))
    routed = ({"input": rows, "existing": existing}
              | "JoinExistingIds" >> beam.CoGroupByKey()
              | "Route" >> beam.ParDo(Route()).with_outputs(Route.REJECT, Route.DONE, Route.STALE,
                                                               Route.DUPLICATED, main="score"))

    handler = KeyedModelHandler(TeacherModelHandler(
        job.teacher, pooling=cfg.hidden, layers=p.layers, max_length=p.max_length,
        min_batch_size=cfg.min_batch_size or cfg.batch_size, max_batch_size=cfg.batch_size,
        forward_rows=cfg.forward_rows, forward_tokens=cfg.forward_tokens, forward=cfg.forward,
        large_model=cfg.large_model,
        torch_threads=cfg.torch_threads,
        allow_pickle=cfg.allow_pickle, trust_remote_code=cfg.trust_remote_code,
        sha256=p.metadata[schema.META_TEACHER_SHA256], loader=job.loader))
    written = (routed.score
               | "ScoreWithTeacher" >> RunInference(handler)
               | "WriteScoredShards" >> beam.ParDo(WriteShards(data_dir, p.prefix, p.output_schema, cfg.shard_rows)))
    shards = (pipeline
              | "StartCleanUp" >> beam.Create([None])
              | "CleanUpShards" >> beam.Map(clean_up_shards, committed=beam.pvalue.AsList(written),
                                            data_dir=data_dir, prefix=p.prefix, out_schema=p.output_schema))
    rejects_written = (routed[Route.REJECT]
                       | "RejectsToJson" >> beam.Map(lambda r: json.dumps(r, ensure_ascii=False, sort_keys=True))
                       | "WriteRejects" >> beam.io.WriteToText(
                           opts.join(job.output, schema.REJECTS_DIR, "rejects"), file_name_suffix=".jsonl"))

    scored_now = _sum(written | "ShardRowCounts" >> beam.Map(lambda w: w[1]), "CountScoredNow")
    already = opts.count(routed[Route.DONE], "CountAlreadyScored")
    scored_total = _sum((scored_now, already) | "ScoredParts" >> beam.Flatten(), "CountScored")
    counts = {
        "input_rows": opts.count(rows, "CountInputRows"),
        "scored": scored_total,
        "scored_this_run": scored_now,
        "already_scored": already,
        "rejected": opts.count(routed[Route.REJECT], "CountRejected"),
        "existing_ids_not_in_input": opts.count(routed[Route.STALE], "CountStale"),
        "existing_ids_written_twice": opts.count(routed[Route.DUPLICATED], "CountDuplicatedInOutput"),
        "shards": shards,
    }
    _ = pipeline | "Finalize" >> opts.Finalize(job.output, counts, wait_on=[shards, rejects_written],
                                               static=p.stats, check=check_stats)
    return p


# --- the stage function and the command line ----------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="transfer set directory (the output of `transferset augment`)")
    parser.add_argument("--teacher", required=True,
                        help="fine-tuned teacher directory (`transferset teacher` output or any save_pretrained dir)")
    parser.add_argument("--output", required=True, help="output directory for the scored transfer set")
    parser.add_argument("--resume", action="store_true", help="keep OUT/data and score only the ids not in it")
    config.add_arguments(parser, ScoreConfig, title="settings (the run config's score: section)")
    opts.add_runner_arguments(parser)


def default_threads(options) -> Optional[int]:
    from apache_beam.options.pipeline_options import DirectOptions

    workers = options.view_as(DirectOptions).direct_num_workers or 1
    if workers <= 1:
        return None
    return max(1, (os.cpu_count() or 1) // workers)


def run_score(cfg: ScoreConfig, *, input: str, teacher: str, output: str, beam_cfg: BeamConfig = BeamConfig(),
              extra: Sequence[str] = (), resume: bool = False, overwrite: bool = False) -> dict:
    """Score `input` with `teacher` into `output`; return the stats."""
    options = opts.pipeline_options(beam_cfg, extra)
    if cfg.torch_threads is None:
        threads = default_threads(options)
        if threads is not None:
            cfg = replace(cfg, torch_threads=threads)
    job = ScoreJob(input=input, teacher=teacher, output=output, cfg=cfg, resume=resume, overwrite=overwrite)
    with beam.Pipeline(options=options) as pipeline:
        build(pipeline, job)
    return opts.read_json_file(opts.join(output, schema.STATS_FILE))


def run(args: argparse.Namespace, extra: Sequence[str]) -> int:
    cfg = config.from_args(ScoreConfig, args)
    started = time.time()
    stats = run_score(cfg, input=args.input, teacher=args.teacher, output=args.output,
                      beam_cfg=opts.beam_config(args), extra=extra, resume=args.resume, overwrite=args.overwrite)
    summary = {k: stats.get(k) for k in ("input_rows", "scored", "scored_this_run", "already_scored", "rejected")}
    summary["output"] = args.output
    summary["elapsed_s"] = round(time.time() - started, 1)
    print(json.dumps(summary, indent=2))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:  # pragma: no cover - `transferset score` is the entry
    from transferset.cli import main as cli_main

    return cli_main(["score", *(argv or [])])
