"""`transferset augment`: read → accept/reject → augment → dedup → leak guard → Parquet.

Thin named PTransforms; the logic lives in transferset.sources and transferset.augment.
"""
from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field, replace
from typing import Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindows

from pipelines import runtime as opts
from transferset import fs
from transferset.augment import check_ops, join, needs, original_row, split_words, variant_rows
from transferset.augment.context import CorpusContext, RowContext, contexts_for
from transferset.augment.dedup import (SPILL_DIR, SpillWriter, bad_inputs, bucket_file, collapse,
                                      dedup_digest, dedup_spilled, pack, reconcile, write_rows)
from transferset.config import AugmentConfig, BeamConfig
from transferset.contract import schema
from transferset.models import loading
from transferset.runtime import malloc
from transferset.runtime.errors import UserError
from transferset.runtime.progress import Progress
from transferset.sources import (Example, SourceSpec, check_readable, detect_format, infer_label_names,
                                 read_source)

log = logging.getLogger("transferset")
METRICS_NAMESPACE = "transferset_augment"

@dataclass(frozen=True)
class AugmentJob:
    """Everything `build` needs: inputs, augmentation settings and the output directory."""

    inputs: tuple[SourceSpec, ...]
    output: str
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    unlabeled: tuple[SourceSpec, ...] = ()
    exclude: tuple[SourceSpec, ...] = ()
    label_names: tuple[str, ...] = ()


# --- DoFns (setup loads models once per worker) ---------------------------------

def _read(spec: SourceSpec):
    return opts.read_rows(spec, METRICS_NAMESPACE, progress=Progress(f"read {spec.path}"))


class _RowContext(beam.DoFn):
    """Batches of (example, context) → the same, with one more row context (augment.context.RowContext)
    added by its model, loaded once per worker."""

    def __init__(self, context: RowContext, cfg: AugmentConfig):
        self.context, self.cfg = context, cfg

    def setup(self):
        self.model = self.context.load(self.cfg)

    def process(self, batch):
        values = self.context.compute(self.model, [split_words(ex.text) for ex, _ in batch], self.cfg)
        for (ex, ctx), value in zip(batch, values):
            yield ex, {**ctx, self.context.name: value}


class _CorpusContext(beam.CombineFn):
    """(example, context) items → one value for the whole input (augment.context.CorpusContext)."""

    def __init__(self, context: CorpusContext):
        self.context = context

    def create_accumulator(self):
        return self.context.create()

    def add_input(self, acc, item):
        ex, ctx = item
        return self.context.add(acc, split_words(ex.text), ctx)

    def merge_accumulators(self, accs):
        accs = iter(accs)
        out = next(accs)
        for a in accs:
            out = self.context.merge(out, a)
        return out

    def extract_output(self, acc):
        return self.context.build(acc)


def _with_contexts(items, cfg: AugmentConfig) -> tuple:
    """(example, {}) items → (example, row contexts) and the corpus contexts as side inputs, for the
    contexts the configured ops need; with no variants to make (n_iter 0: unlabeled text as is), none."""
    corpus = {}
    if not cfg.makes_variants:
        return items, corpus
    for c in contexts_for(cfg.ops):
        if isinstance(c, RowContext):
            size = getattr(cfg, c.batch_size)
            items = (items
                     | f"BatchFor{c.label}" >> beam.BatchElements(min_batch_size=min(c.min_batch_size, size),
                                                                 max_batch_size=size)
                     | c.label >> beam.ParDo(_RowContext(c, cfg)))
        else:
            corpus[c.name] = beam.pvalue.AsSingleton(items | c.label >> beam.CombineGlobally(_CorpusContext(c)))
    return items, corpus


def _expand(item, cfg: AugmentConfig, **corpus):
    """An example → the list of its original and variants, keyed by text digest and packed, repeats within
    it collapsed (dedup.collapse); the number of variants generated goes to the "generated" output.
    `corpus`: the corpus contexts (e.g. pos_vocab), beside the example's own row contexts."""
    ex, ctx = item
    if corpus:
        ctx = {**ctx, **corpus}
    rows = [original_row(ex.source_id, ex.text, ex.text_b, ex.label),
            *variant_rows(ex.source_id, ex.text, ex.text_b, cfg=cfg, context=ctx, labeled=ex.label is not None)]
    yield beam.pvalue.TaggedOutput("generated", len(rows) - 1)
    # one element per example, not per row: Beam's cost is per element
    yield [(digest, pack(row, copies)) for digest, row, copies in collapse(rows)]


def _joined(examples, cfg: AugmentConfig):
    """Originals → the rows of the `join` op (augment.join): each original's entries under random keys, grouped
    into buckets of about join.BUCKET_ENTRIES, each bucket's joins; keyed packed lists as `_expand` yields them,
    the number of joined rows to the "generated" output. No join op: nothing."""
    if join.OP not in cfg.ops:
        return None
    entries = examples | "JoinEntries" >> beam.FlatMap(
        lambda ex: join.entries(ex.source_id, ex.text, ex.text_b, seed=cfg.seed, joins=cfg.joins,
                                join_max=cfg.join_max))
    total = beam.pvalue.AsSingleton(entries | "CountJoinEntries" >> beam.combiners.Count.Globally())
    return (entries
            | "JoinBuckets" >> beam.Map(lambda e, n: (join.bucket_of(e[0], n), e[1]), n=total)
            | "GroupJoinBuckets" >> beam.GroupByKey()
            | "Join" >> beam.FlatMap(_join_bucket, cfg).with_outputs("generated", main="rows"))


def _join_bucket(item, cfg: AugmentConfig):
    bucket, members = item
    rows = join.joined_rows(bucket, list(members), seed=cfg.seed, join_max=cfg.join_max)
    yield beam.pvalue.TaggedOutput("generated", len(rows))
    if rows:
        yield [(digest, pack(row, copies)) for digest, row, copies in collapse(rows)]


class _Spill(beam.DoFn):
    """Lists of keyed packed rows → files of one dedup bucket each (dedup.SpillWriter); yields (bucket, file)."""

    def __init__(self, directory: str):
        self.directory = directory

    def start_bundle(self):
        self.writer = SpillWriter(self.directory)

    def process(self, rows):
        for digest, value in rows:
            written = self.writer.add(digest, value)
            if written:
                yield written

    def finish_bundle(self):
        for written in self.writer.close():
            yield GlobalWindows.windowed_value(written)


class _DedupBucket(beam.DoFn):
    """One bucket's files → its kept rows, written as one Parquet file of the transfer set; yields
    (path, rows), and the duplicates and excluded counts to their outputs."""

    def __init__(self, data_dir: str, out_schema):
        self.data_dir, self.out_schema = data_dir, out_schema

    def setup(self):
        self.written = beam.metrics.Metrics.counter(METRICS_NAMESPACE, "rows_written")
        self.progress = Progress("rows written (originals and variants)")

    def process(self, item, excluded):
        bucket, paths = item
        excluded = set(excluded)
        kept, dups, dropped = [], 0, 0
        for winner, d, x in dedup_spilled(paths, excluded):
            dups, dropped = dups + d, dropped + x
            if winner is not None:
                kept.append(winner)
        if kept:
            written = write_rows(self.data_dir, bucket_file(bucket), kept, self.out_schema)
            self.written.inc(written[1])
            self.progress.update(written[1])
            yield written
        yield beam.pvalue.TaggedOutput("duplicates", dups)
        yield beam.pvalue.TaggedOutput("excluded", dropped)


class DedupAndGuard(beam.PTransform):
    """(digest, packed row) lists → the transfer set's Parquet files: one row per normalized text, none
    equal to an evaluation sentence.

    Outputs: (path, rows) per file written (main), "duplicates" and "excluded" counts. The rows go
    through files (dedup.SpillWriter under `spill_dir`, removed by the caller once written), not through
    a grouping: only file names are grouped, by bucket, so no runner holds the rows in memory, and each
    bucket writes its own output file (pyarrow, a column at a time, not a Beam sink's row at a time).
    """

    def __init__(self, spill_dir: str, excluded_keys, data_dir: str, out_schema):
        super().__init__()
        self.spill_dir, self.excluded_keys = spill_dir, excluded_keys
        self.data_dir, self.out_schema = data_dir, out_schema

    def expand(self, rows):
        excluded = beam.pvalue.AsList(self.excluded_keys | "ExcludedDigests" >> beam.Keys())
        return (rows
                | "SpillByText" >> beam.ParDo(_Spill(self.spill_dir))
                | "FilesByBucket" >> beam.GroupByKey()
                | "DedupBuckets" >> beam.ParDo(_DedupBucket(self.data_dir, self.out_schema), excluded).with_outputs(
                    "duplicates", "excluded", main="written"))


def _finish_data(_, written, spill_dir: str, data_dir: str, out_schema) -> int:
    """Once every bucket is written: remove the dedup files; with no row kept, write one empty file that
    still carries the schema and metadata (readers need one). Returns the number of data files."""
    fs.delete(spill_dir)
    if not written:
        write_rows(data_dir, bucket_file(0), [], out_schema)
        return 1
    return len(written)


def _guard_sources(item):
    _, groups = item
    for ex in groups["examples"]:
        if groups["exclude"]:
            yield beam.pvalue.TaggedOutput("excluded", 1)
        else:
            yield ex


def _excluded_keys(p, specs: Sequence[SourceSpec]):
    """(digest of the normalized text, True) for every sentence of the evaluation files, once each."""
    if not specs:
        return p | "NoExcludes" >> beam.Create([])
    return (p
            | "ListExcludes" >> beam.Create(list(specs))
            | "ReadExcludes" >> beam.FlatMap(
                lambda s: (dedup_digest(e.text, e.text_b) for e in read_source(s, opener=FileSystems.open)
                           if isinstance(e, Example)))
            | "DistinctExcludes" >> beam.Distinct()
            | "KeyExcludes" >> beam.Map(lambda k: (k, True)))


# --- the pipeline ---------------------------------------------------------------

def _guarded(examples, excluded_keys):
    """Sources equal to an evaluation sentence go before augmentation (tagged "excluded"): their variants
    would be near-copies of evaluation data."""
    return ({"examples": examples | "KeyExamplesByText" >> beam.Map(lambda e: (dedup_digest(e.text, e.text_b), e)),
             "exclude": excluded_keys}
            | "GroupSourcesByText" >> beam.CoGroupByKey()
            | "GuardSources" >> beam.FlatMap(_guard_sources).with_outputs("excluded", main="kept"))


def _check_stats(stats) -> bool:
    """Finalize's check: every row is accounted for and no input had all its rows rejected (stats["problems"]
    says what failed)."""
    problems = reconcile(stats) + bad_inputs(stats["inputs"], stats["first_rejects"])
    stats["problems"] = problems
    return not problems


def _static_stats(job: AugmentJob) -> dict:
    """The settings stats.json records alongside the counts."""
    cfg = job.augment
    return {"recipe": cfg.recipe, "ops": list(cfg.ops), "n_iter": cfg.n_iter,
            "unlabeled_n_iter": cfg.variants_for(False), "words_per_variant": cfg.words_per_variant,
            **({"joins": cfg.joins, "join_max": cfg.join_max} if join.OP in cfg.ops else {}),
            "seed": cfg.seed,
            "label_names": list(job.label_names)}


def build(p: beam.Pipeline, job: AugmentJob) -> dict:
    cfg = job.augment
    specs = [replace(s, label_names=job.label_names) for s in job.inputs] + list(job.unlabeled)
    read = (p
            | "ListInputs" >> beam.Create(specs)
            | "ReadInputs" >> beam.FlatMap(_read).with_outputs("rejects", main="examples"))
    examples = read.examples | "SpreadExamples" >> beam.Reshuffle()
    rejects = read.rejects

    excluded_keys = _excluded_keys(p, job.exclude)
    guarded = _guarded(examples, excluded_keys)
    items, corpus = _with_contexts(guarded.kept | "NoContext" >> beam.Map(lambda ex: (ex, {})), cfg)
    expanded = items | "Augment" >> beam.FlatMap(_expand, cfg, **corpus).with_outputs("generated", main="rows")
    joined = _joined(guarded.kept, cfg)
    rows, generated = expanded.rows, expanded.generated
    if joined is not None:
        rows = (rows, joined.rows) | "WithJoined" >> beam.Flatten()
        generated = (generated, joined.generated) | "GeneratedWithJoined" >> beam.Flatten()
    metadata = schema.base_metadata(job.label_names, **{
        schema.META_AUGMENT_CONFIG: json.loads(cfg.to_json()),
        schema.META_SEED: cfg.seed,
    })
    out_schema = schema.transfer_schema(metadata)
    spill_dir, data_dir = opts.join(job.output, SPILL_DIR), opts.join(job.output, schema.DATA_DIR)
    resolved = rows | "DedupAndGuard" >> DedupAndGuard(spill_dir, excluded_keys, data_dir, out_schema)
    written = (p
               | "StartFinishData" >> beam.Create([None])
               | "WriteParquet" >> beam.Map(_finish_data, beam.pvalue.AsList(resolved.written), spill_dir=spill_dir,
                                            data_dir=data_dir, out_schema=out_schema))
    rejects_written = rejects | "WriteRejects" >> opts.WriteRejects(job.output)

    per_file = opts.rows_by_file(read.examples, rejects, "accepted")
    samples = opts.first_rejects_by_file(rejects)
    n_accepted = opts.count(read.examples, "CountAccepted")
    n_rejected = opts.count(rejects, "CountRejected")
    n_input = opts.total((n_accepted, n_rejected) | "InputRows" >> beam.Flatten(), "SumInput")
    counts = {
        "input_rows": n_input,
        "accepted_rows": n_accepted,
        "rejected_rows": n_rejected,
        "originals": n_accepted,
        "variants_generated": opts.total(generated, "SumVariants"),  # joined rows (augment.join) included
        "duplicates_dropped": opts.total(resolved.duplicates, "SumDuplicates"),
        "excluded_dropped": opts.total((guarded.excluded, resolved.excluded) | "AllExcluded" >> beam.Flatten(),
                                 "SumExcluded"),
        "output_rows": opts.total(resolved.written | "RowsPerFile" >> beam.Map(lambda w: w[1]), "CountOutput"),
        "inputs": per_file,
        "first_rejects": samples,
    }
    finished = p | "Finalize" >> opts.Finalize(job.output, counts, wait_on=[written, rejects_written],
                                               static=_static_stats(job), check=_check_stats)
    return {"written": resolved.written, "rejects": rejects, "stats": finished}


# --- the stage function -----------------------------------------------------------

def make_job(cfg: AugmentConfig, *, inputs: Sequence[str], output: str, unlabeled: Sequence[str] = (),
             exclude: Sequence[str] = ()) -> AugmentJob:
    """Check the input paths and settle the label set: everything `build` needs."""
    if not inputs:
        raise UserError("augment: at least one labeled input is needed (--input)")
    check_ops(cfg)
    if cfg.makes_variants and needs(cfg, "candidates"):
        # refused here in one line, not as a traceback from a worker's setup after the inputs were read
        loading.check_model_dir(cfg.mlm_model, what="--mlm-model", allow_pickle=cfg.allow_pickle,
                                trust_remote_code=cfg.trust_remote_code)

    def spec(path: str, labeled: bool) -> SourceSpec:
        return SourceSpec(path=path, text_column=cfg.text_column,
                          label_column=cfg.label_column if labeled else None,
                          text_b_column=cfg.text_b_column, max_chars=cfg.max_chars, limit=cfg.limit)

    for path in [*inputs, *unlabeled, *exclude]:
        detect_format(path)
        if not path.startswith("hf:") and not FileSystems.exists(path):
            raise UserError(f"{path}: no such file")
        # A broken header or footer, an hf: split that does not load: one message, here, before the output.
        check_readable(path, opener=FileSystems.open)
    labels = cfg.labels or infer_label_names(inputs[0], cfg.label_column, opener=FileSystems.open, limit=cfg.limit)
    schema.base_metadata(labels)  # a label set readers would refuse (too many, too long) stops here, not after the run
    return AugmentJob(
        inputs=tuple(spec(p, True) for p in inputs),
        unlabeled=tuple(spec(p, False) for p in unlabeled),
        exclude=tuple(SourceSpec(path=p, text_column=cfg.text_column, label_column=None,
                                 text_b_column=cfg.text_b_column, max_chars=10**9) for p in exclude),
        output=output, augment=cfg, label_names=tuple(labels))


def run_augment(cfg: AugmentConfig, *, inputs: Sequence[str], output: str, unlabeled: Sequence[str] = (),
                exclude: Sequence[str] = (), beam_cfg: BeamConfig = BeamConfig(), extra: Sequence[str] = (),
                overwrite: bool = False) -> dict:
    """Build the transfer set in `output`; return its stats. Raises UserError when the stats show a problem.

    Paths may be file:// URLs (read as local paths). The run owns `output` while it writes and clears
    only what transferset wrote there (transferset.fs.output): a second run on it is refused instead of
    mixing its rows in, and others' files are never deleted.
    """
    inputs = [opts.normalize(p, "--input") for p in inputs]
    unlabeled = [opts.normalize(p, "--unlabeled") for p in unlabeled]
    exclude = [opts.normalize(p, "--exclude") for p in exclude]
    options = opts.pipeline_options(beam_cfg, extra)  # checked before any input is read or output touched
    out = opts.output(output, "augment", inputs=[*inputs, *unlabeled, *exclude], overwrite=overwrite)
    job = make_job(cfg, inputs=inputs, output=out.path, unlabeled=unlabeled, exclude=exclude)
    if not job.exclude:
        print("transferset augment: warning: no --exclude given; nothing guards against evaluation "
              "sentences leaking into the transfer set", file=sys.stderr)
    malloc.fix_mmap_threshold()  # a local runner's groupings (sources, bucket files) run here (transferset.runtime.malloc)
    with out.open():
        out.prepare()
        per = (f"one variant per {cfg.words_per_variant} words, at most {cfg.n_iter}, per example"
               if cfg.words_per_variant else f"{cfg.n_iter} variants per example")
        what = f"recipe {cfg.recipe} ops {','.join(cfg.ops)}, {per}" if cfg.makes_variants else \
            "the rows as they are, no variants"
        print(f"transferset augment: {what}, labels {list(job.label_names)} → {job.output}", file=sys.stderr)
        with beam.Pipeline(options=options) as p:
            build(p, job)
        out.record()
    return opts.finished_stats(job.output)
