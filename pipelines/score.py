"""`transferset score`: score a transfer set once with the teacher (Apache Beam).

    input units ─HashInputIds─▶ id hashes ─┐
    OUT/data (--resume) ─HashExistingIds───┴─FindRepeatedIds─▶ sorted hashes seen twice or done ─┐ side input
    input units ─ReadRepeatedIds (those hashes only)─▶ (id, position) ─┐                          │
    OUT/data (--resume) ─ReadExistingIds─▶ (id) ───────────────────────┴─CountIds─▶ ids to look up ─┐ side input
    input units ─ReadAndRoute─┬─▶ ScoreWithTeacher ─▶ WriteScoredShards ─▶ CleanUpShards ─┐
                              └─▶ rejects ─▶ OUT/rejects/*.jsonl ──────────────────────────┴─▶ Finalize (stats.json, _COMPLETE)

The duplicate-id check first combines 64-bit id hashes in numpy arrays (8 bytes a row;
shards.suspect_hashes); only the ids whose hash repeats, or is already in the output (--resume),
are read again and counted by id, a grouping a local runner holds in memory (~0.4 KB an id), so a
fresh run with unique ids holds 8 bytes a row. The rows stream from the input, read once more,
straight into the routing and the teacher: reading and routing are one step, so no row waits in
the runner for the routing's side input.
The input is read in units of 1/16 of its rows (1,000 to 50,000 rows; shards.input_units), the work
the runner spreads over its workers. Measured in benchmarks/README.md (scale).

The logic lives in the library and is tested without Beam: the checks before a run in
transferset.scored.plan, routing and the shard protocol in transferset.scored.shards, the
teacher in transferset.teacher.scoring; this module wires them into steps. Scored rows are
committed in shards as they are produced (every shard_rows rows or shard_seconds seconds),
so a killed run leaves whole shards behind and `--resume` scores only the ids not in them.
"""
from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import Any, Callable, Optional, Sequence, Union

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.ml.inference.base import KeyedModelHandler, ModelHandler, RunInference
from apache_beam.options.pipeline_options import DirectOptions
from apache_beam.transforms.window import GlobalWindows

from pipelines import runtime as opts
from transferset import fs
from transferset.config import DEFAULT_MAX_LENGTH, BeamConfig, ScoreConfig
from transferset.contract import schema
from transferset.fs import remote
from transferset.runtime import malloc
from transferset.runtime.progress import Progress
from transferset.runtime.threads import set_torch_threads
from transferset.scored import plan as score_plan
from transferset.scored import shards
from transferset.teacher import ensemble, scoring

LOG = logging.getLogger("transferset.score")
METRICS_NAMESPACE = "transferset_score"

# The library (transferset.scored.plan / .shards) holds the checks, routing and shard protocol;
# these names stay importable from here for callers of the pipeline module.
ScoreJob, Plan, plan = score_plan.ScoreJob, score_plan.Plan, score_plan.plan
check_stats = shards.check_stats


def counter(name: str):
    """A Beam metrics counter of this pipeline (shown in the Dataflow UI, queryable from the result)."""
    return Metrics.counter(METRICS_NAMESPACE, name)


# Counter names: rows read from the input, rejected, already in the output (--resume), scored by
# the teacher in this run, and written to committed shards.
ROWS_READ, ROWS_REJECTED, ROWS_ALREADY_SCORED, ROWS_SCORED, ROWS_WRITTEN, SHARDS_WRITTEN = (
    "rows_read", "rows_rejected", "rows_already_scored", "rows_scored", "rows_written", "shards_written")


# --- reading and routing --------------------------------------------------------------------------
def hash_input_ids(unit):
    file_index, path, start, stop = unit
    return "input", shards.read_input_hashes(path, start, stop, file_index)


def hash_existing_ids(path: str):
    return "existing", shards.read_existing_hashes(path)


class SuspectIds(beam.CombineFn):
    """("input" | "existing", id hashes) arrays → one sorted array of the hashes that may need a look-up
    (shards.suspect_hashes): 8 bytes a row cross the combine, never a Python object per id."""

    def create_accumulator(self):
        return [], []

    def add_input(self, acc, item):
        kind, hashes = item
        acc[0 if kind == "input" else 1].append(hashes)
        return acc

    def merge_accumulators(self, accs):
        inputs, existing = [], []
        for i, e in accs:
            inputs.extend(i)
            existing.extend(e)
        return inputs, existing

    def extract_output(self, acc):
        return shards.suspect_hashes(*acc)


def read_suspect_ids(unit, suspects):
    file_index, path, start, stop = unit
    return shards.read_suspect_ids(path, start, stop, file_index, suspects)


def read_existing_ids(path: str):
    return ((key, None) for key in shards.read_ids(path))


class CountIds(beam.CombineFn):
    """Per id: scorable input rows, the first one's position, times already in the output (shards.IdCount)."""

    def create_accumulator(self):
        return shards.NO_ROWS

    def add_input(self, acc, position):
        return shards.count_id(acc, position)

    def merge_accumulators(self, accs):
        return shards.merge_counts(accs)

    def extract_output(self, acc):
        return acc


def id_routes(item):
    key, count = item
    for tag, value in shards.id_routes(key, count):
        yield beam.pvalue.TaggedOutput(tag, value)
    if shards.needs_lookup(count):
        yield key, count


class ReadAndRoute(beam.DoFn):
    """Per input unit: read its rows and route each one: skip it when already written (--resume), reject
    invalid rows and duplicate ids, else score. The number of rows read goes to the READ output.

    Reading and routing are one step so that the rows stream from the file to the teacher: the
    routing waits for its side input (the ids to look up), and a local runner would hold in memory
    every row read before that side input is ready (~1 KB a row: benchmarks/README.md, scale).
    """

    REJECT, DONE, STALE, DUPLICATED, READ = shards.REJECT, shards.DONE, shards.STALE, shards.DUPLICATED, "read"

    def __init__(self, files: Sequence[str]):
        self.files = list(files)

    def setup(self):
        self.rows_read = counter(ROWS_READ)
        self.counters = {shards.REJECT: counter(ROWS_REJECTED), shards.DONE: counter(ROWS_ALREADY_SCORED)}

    def process(self, unit, lookup):
        file_index, path, start, stop = unit
        n = 0
        for key, (row, path, row_number, position) in shards.read_input_rows(path, start, stop, file_index):
            n += 1
            self.rows_read.inc()
            tag, value = shards.route_row(key, row, path, row_number, position, lookup.get(key), self.files)
            if tag in self.counters:
                self.counters[tag].inc()
            yield value if tag == shards.SCORE else beam.pvalue.TaggedOutput(tag, value)
        yield beam.pvalue.TaggedOutput(self.READ, n)


# --- scoring ------------------------------------------------------------------------------------
def load_teacher(path: str, **kwargs) -> scoring.Teacher:
    return scoring.Teacher.load(path, **kwargs)


class TeacherModelHandler(ModelHandler):
    """Rows (dicts with text, text_b) -> the same rows plus teacher_label, teacher_logits, teacher_hidden
    (and, for an ensemble, each member's teacher_logits_{k}).

    Beam's Hugging Face handlers import TensorFlow and split `hidden_states` wrongly, hence this one.
    `teacher_dir`: one teacher, or a list of them: an ensemble (transferset.teacher.ensemble) whose
    logits are combined by `combine`; `sha256` then lists each member's hash.
    """

    def __init__(self, teacher_dir: Union[str, Sequence[str]], *, combine: str = "mean", pooling: str = "cls",
                 layers: Sequence[int] = (-1,),
                 max_length: int = DEFAULT_MAX_LENGTH, min_batch_size: Optional[int] = None,
                 max_batch_size: int = 1024,
                 forward_rows: Optional[int] = None, forward_tokens: Optional[int] = None, forward: str = "auto",
                 large_model: bool = False, torch_threads: Optional[int] = None, allow_pickle: bool = False,
                 trust_remote_code: bool = False, sha256: Optional[str] = None, precision: str = "fp32",
                 loader: Optional[Callable[..., Any]] = None):
        super().__init__(min_batch_size=min(min_batch_size or max_batch_size, max_batch_size),
                         max_batch_size=max_batch_size, large_model=large_model)
        self.teacher_dir = teacher_dir
        self.combine = combine
        self.load_kwargs = dict(pooling=pooling, layers=list(layers), max_length=max_length,
                                forward_rows=forward_rows, forward_tokens=forward_tokens,
                                forward=forward, allow_pickle=allow_pickle,
                                trust_remote_code=trust_remote_code, sha256=sha256, precision=precision)
        self.torch_threads = torch_threads
        self.loader = loader

    def load_model(self) -> scoring.Teacher:
        # Before torch runs anything: oneDNN reads its cache size once (transferset.runtime.malloc).
        malloc.limit_primitive_cache()
        # On the worker, once: the launcher that builds the graph (e.g. for Dataflow) never needs torch.
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one bar per worker is noise in pipeline logs
        set_torch_threads(self.torch_threads)  # several workers on one machine must not each use every core
        malloc.fix_mmap_threshold()  # or the heap grows ~4 KB per row scored (transferset.runtime.malloc)
        if isinstance(self.teacher_dir, str):
            return self._load(self.teacher_dir, self.load_kwargs["sha256"])
        # An ensemble: every member on this worker, each scoring every row (memory: the sum of the members).
        # Only the primary's hidden states are stored: the others pool their last layer only, whatever
        # their depth (the stored layer indices are the primary's).
        main = ensemble.primary(ensemble.parse_combine(self.combine, len(self.teacher_dir)))
        return ensemble.Ensemble([self._load(d, h, **({} if k == main else {"layers": [-1]}))
                                  for k, (d, h) in enumerate(zip(self.teacher_dir, self.load_kwargs["sha256"]))],
                                 self.combine)

    def _load(self, teacher_dir: str, sha256: Optional[str], **overrides: Any) -> scoring.Teacher:
        # A gs:// (any remote) teacher: copied once per machine, checked against the planned weights hash.
        local = remote.local_teacher(teacher_dir, sha256=sha256, allow_pickle=self.load_kwargs["allow_pickle"])
        return (self.loader or load_teacher)(local, **dict(self.load_kwargs, sha256=sha256, **overrides))

    def run_inference(self, batch: Sequence[dict], model: Union[scoring.Teacher, ensemble.Ensemble],
                      inference_args=None) -> list[dict]:
        texts = [row[schema.TEXT] for row in batch]
        texts_b = [row.get(schema.TEXT_B) for row in batch]
        scores = model.predict(texts, texts_b if any(b is not None for b in texts_b) else None)
        labels = scores.labels
        hidden = scores.hidden.astype(np.float16)  # (N, H): stored as float16; cast once, here
        extra = {schema.hidden_layer_column(k): v.astype(np.float16) for k, v in scores.layers.items()}
        extra.update({schema.member_logits_column(k): v for k, v in enumerate(scores.members)})
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
class WriteShards(beam.DoFn):
    """Commit scored rows in shards (transferset.scored.shards.ShardBuffer decides when) and at each bundle end.

    Yields (path, rows) per committed shard; reports progress against `total` rows.
    """

    def __init__(self, data_dir: str, prefix: str, out_schema: pa.Schema, shard_rows: int,
                 shard_seconds: float, total: Optional[int] = None):
        self.data_dir, self.prefix, self.out_schema = data_dir, prefix, out_schema
        self.shard_rows, self.shard_seconds, self.total = shard_rows, shard_seconds, total

    def setup(self):
        self.buffer = shards.ShardBuffer(self.shard_rows, self.shard_seconds)
        self.progress = Progress("rows scored", total=self.total)
        self.scored, self.written, self.shards = counter(ROWS_SCORED), counter(ROWS_WRITTEN), counter(SHARDS_WRITTEN)

    def start_bundle(self):
        self.buffer.take()  # rows of a failed bundle attempt are scored again by its retry

    def process(self, element):
        _, row = element
        self.scored.inc()
        self.progress.update()
        rows = self.buffer.add(row)
        if rows:
            yield self._commit(rows)

    def finish_bundle(self):
        if len(self.buffer):
            yield GlobalWindows.windowed_value(self._commit(self.buffer.take()))

    def _commit(self, rows: list) -> tuple[str, int]:
        path, n = shards.write_shard(self.data_dir, self.prefix, rows, self.out_schema)
        self.written.inc(n)
        self.shards.inc()
        return path, n


def clean_up_shards(_, committed: Sequence[tuple[str, int]], data_dir: str, prefix: str,
                    out_schema: pa.Schema) -> int:
    return shards.clean_up_shards([path for path, _ in committed], data_dir, prefix, out_schema)


def _local_workers(pipeline: beam.Pipeline) -> int:
    return max(1, int(pipeline.options.view_as(DirectOptions).direct_num_workers or 1))


def _read_and_route(pipeline: beam.Pipeline, p: Plan):
    """(id counts, routed rows): each input row read once and routed to scoring, done (--resume), or rejects,
    after the ids repeated in the input or already in the output are counted."""
    units = pipeline | "ListInputUnits" >> beam.Create(p.input_units)
    existing_files = pipeline | "ListExistingShards" >> beam.Create(p.existing_files)
    suspects = (((units | "HashInputIds" >> beam.Map(hash_input_ids)),
                 (existing_files | "HashExistingIds" >> beam.Map(hash_existing_ids)))
                | "AllIdHashes" >> beam.Flatten()
                | "FindRepeatedIds" >> beam.CombineGlobally(SuspectIds()))
    # Each reading step lists the units itself: steps that wait on a side input must not share their
    # input with the steps that compute it (the local runner would stall on the fused stage).
    positions = (pipeline | "ListUnitsForIds" >> beam.Create(p.input_units)
                 | "ReadRepeatedIds" >> beam.FlatMap(read_suspect_ids, beam.pvalue.AsSingleton(suspects)))
    existing = existing_files | "ReadExistingIds" >> beam.FlatMap(read_existing_ids)
    counted = ((positions, existing)
               | "InputAndExistingIds" >> beam.Flatten()
               | "CountIds" >> beam.CombinePerKey(CountIds())
               | "IdRoutes" >> beam.FlatMap(id_routes).with_outputs(ReadAndRoute.STALE, ReadAndRoute.DUPLICATED,
                                                                    main="lookup"))
    routed = (pipeline
              | "ListUnitsToRoute" >> beam.Create(p.input_units)
              | "ReadAndRoute" >> beam.ParDo(ReadAndRoute(p.input_files), lookup=beam.pvalue.AsDict(counted.lookup)
                                             ).with_outputs(ReadAndRoute.REJECT, ReadAndRoute.DONE, ReadAndRoute.READ,
                                                            main="score"))
    return counted, routed


def _teacher_handler(job: ScoreJob, p: Plan) -> KeyedModelHandler:
    """RunInference's handler: the teacher (or ensemble) as the plan checked it, ids travelling with rows."""
    cfg, teachers = job.cfg, job.teachers
    return KeyedModelHandler(TeacherModelHandler(
        teachers[0] if len(teachers) == 1 else teachers, combine=cfg.combine, pooling=cfg.hidden, layers=p.layers,
        max_length=p.max_length,
        min_batch_size=cfg.min_batch_size or cfg.batch_size, max_batch_size=cfg.batch_size,
        forward_rows=cfg.forward_rows, forward_tokens=cfg.forward_tokens, forward=cfg.forward,
        large_model=cfg.large_model,
        torch_threads=cfg.torch_threads,
        allow_pickle=cfg.allow_pickle, trust_remote_code=cfg.trust_remote_code,
        sha256=p.member_sha256 or p.metadata[schema.META_TEACHER_SHA256], precision=p.precision,
        loader=job.loader))


def build(pipeline: beam.Pipeline, job: ScoreJob, p: Optional[Plan] = None) -> Plan:
    """Add the scoring steps to `pipeline`; returns the checked plan (schema, metadata, prefix).

    `p`: a plan already made (checks done): graph-building tests pass one for a gs:// output.
    """
    p = p or plan(job)
    cfg = job.cfg
    data_dir = p.data_dir
    counted, routed = _read_and_route(pipeline, p)
    handler = _teacher_handler(job, p)
    written = (routed.score
               | "ScoreWithTeacher" >> RunInference(handler)
               | "WriteScoredShards" >> beam.ParDo(WriteShards(
                   data_dir, p.prefix, p.output_schema, cfg.shard_rows, cfg.shard_seconds,
                   # each local worker scores about its share; a Dataflow job shows the counters instead
                   total=max(1, p.rows_to_score // _local_workers(pipeline)))))
    shards = (pipeline
              | "StartCleanUp" >> beam.Create([None])
              | "CleanUpShards" >> beam.Map(clean_up_shards, committed=beam.pvalue.AsList(written),
                                            data_dir=data_dir, prefix=p.prefix, out_schema=p.output_schema))
    rejects_written = routed[ReadAndRoute.REJECT] | "WriteRejects" >> opts.WriteRejects(job.output)

    scored_now = opts.total(written | "ShardRowCounts" >> beam.Map(lambda w: w[1]), "CountScoredNow")
    already = opts.count(routed[ReadAndRoute.DONE], "CountAlreadyScored")
    scored_total = opts.total((scored_now, already) | "ScoredParts" >> beam.Flatten(), "CountScored")
    counts = {
        "input_rows": opts.total(routed[ReadAndRoute.READ], "CountInputRows"),
        "scored": scored_total,
        "scored_this_run": scored_now,
        "already_scored": already,
        "rejected": opts.count(routed[ReadAndRoute.REJECT], "CountRejected"),
        "existing_ids_not_in_input": opts.count(counted[ReadAndRoute.STALE], "CountStale"),
        "existing_ids_written_twice": opts.count(counted[ReadAndRoute.DUPLICATED], "CountDuplicatedInOutput"),
        "shards": shards,
    }
    _ = pipeline | "Finalize" >> opts.Finalize(job.output, counts, wait_on=[shards, rejects_written],
                                               static=p.stats, check=check_stats)
    return p


# --- the stage function ----------------------------------------------------------------------------
def default_threads(options) -> Optional[int]:
    workers = options.view_as(DirectOptions).direct_num_workers or 1
    if workers <= 1:
        return None
    return max(1, (os.cpu_count() or 1) // workers)


def run_score(cfg: ScoreConfig, *, input: str, teacher: Union[str, Sequence[str]], output: str,
              beam_cfg: BeamConfig = BeamConfig(), extra: Sequence[str] = (), resume: bool = False,
              overwrite: bool = False) -> dict:
    """Score `input` with `teacher` into `output`; return the stats.

    `teacher`: one directory, or a list of them (one is the same as a str): an ensemble, scored once by
    each member, whose logits ScoreConfig.combine combines (transferset.teacher.ensemble).

    Paths may be file:// URLs (read as local paths). The run owns `output` from its first check
    to its last write (transferset.fs.output): a second run on it is refused before it reads anything.
    """
    # Everything here also goes through transferset.fs (fsspec): Beam-only schemes would not do.
    input = fs.normalize(input, "--input")
    teachers = [teacher] if isinstance(teacher, str) else list(teacher)
    teachers = [fs.normalize(t, "--teacher") for t in teachers]
    teacher = teachers[0] if len(teachers) == 1 else teachers
    out = score_plan.output(output, input=input, teacher=teacher, resume=resume, overwrite=overwrite)
    output = out.path
    options = opts.pipeline_options(beam_cfg, extra)
    if cfg.torch_threads is None:
        threads = default_threads(options)
        if threads is not None:
            cfg = replace(cfg, torch_threads=threads)
    job = ScoreJob(input=input, teacher=teacher, output=output, cfg=cfg, resume=resume, overwrite=overwrite)
    with out.open():
        with beam.Pipeline(options=options) as pipeline:
            build(pipeline, job)
        out.record()
        return opts.read_json_file(opts.join(output, schema.STATS_FILE))

