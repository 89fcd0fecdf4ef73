"""`transferset augment`: read → accept/reject → augment → dedup → leak guard → Parquet.

Thin named PTransforms; the logic lives in transferset.sources and transferset.augment.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from transferset import config, schema
from transferset.augment import original_row, split_words, variant_rows
from transferset.config import AugmentConfig, BeamConfig
from transferset.augment.dedup import STAT_KEYS, bad_inputs, dedup_key, reconcile, resolve, to_record
from transferset.errors import UserError
from transferset.progress import Progress
from transferset.sources import Example, Reject, SourceSpec, detect_format, infer_label_names, read_source
from pipelines import options as opts

log = logging.getLogger("transferset")
METRICS_NAMESPACE = "transferset_augment"

EPILOG = """examples:
  transferset augment --input ../shared/data/sst2/train.tsv --exclude ../shared/data/sst2/dev.tsv \\
      --output runs/sst2_transfer --limit 2000
  transferset augment --input train.csv --text-column review --recipe tinybert --mlm-model bert-base-uncased \\
      --output out/ --runner FnApiRunner --direct_num_workers 2"""


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
    progress = Progress(f"read {spec.path}")
    read = beam.metrics.Metrics.counter(METRICS_NAMESPACE, "rows_read")
    rejected = beam.metrics.Metrics.counter(METRICS_NAMESPACE, "rows_rejected")
    for rec in read_source(spec, opener=FileSystems.open):
        progress.update()
        read.inc()
        if isinstance(rec, Reject):
            rejected.inc()
            yield beam.pvalue.TaggedOutput("rejects", rec)
        else:
            yield rec


class _Tag(beam.DoFn):
    def __init__(self, model: str, batch_size: int):
        self.model, self.batch_size = model, batch_size

    def setup(self):
        from transferset.augment.pos import Tagger

        self.tagger = Tagger(self.model)

    def process(self, batch):
        tags = self.tagger.tag([split_words(ex.text) for ex, _ in batch], batch_size=self.batch_size)
        for (ex, ctx), t in zip(batch, tags):
            yield ex, {**ctx, "tags": t}


class _MlmCandidates(beam.DoFn):
    def __init__(self, model: str, top_k: int, batch_size: int, threads: Optional[int]):
        self.model, self.top_k, self.batch_size, self.threads = model, top_k, batch_size, threads

    def setup(self):
        from transferset.augment.mlm import MlmCandidates

        self.mlm = MlmCandidates(self.model, top_k=self.top_k, batch_size=self.batch_size, threads=self.threads)

    def process(self, batch):
        cands = self.mlm.candidates([split_words(ex.text) for ex, _ in batch])
        for (ex, ctx), c in zip(batch, cands):
            yield ex, {**ctx, "candidates": c}


class _PosVocab(beam.CombineFn):
    """Corpus unigram counts per (tag, word) → PosVocab, built once from the originals."""

    def create_accumulator(self):
        from collections import Counter

        return Counter()

    def add_input(self, acc, item):
        ex, ctx = item
        acc.update(zip(ctx["tags"], split_words(ex.text)))
        return acc

    def merge_accumulators(self, accs):
        accs = iter(accs)
        out = next(accs)
        for a in accs:
            out.update(a)
        return out

    def extract_output(self, acc):
        from transferset.augment.pos import PosVocab

        return PosVocab.from_counts(acc)


def _expand(item, cfg: AugmentConfig, pos_vocab=None):
    ex, ctx = item
    if pos_vocab is not None:
        ctx = {**ctx, "pos_vocab": pos_vocab}
    yield original_row(ex.source_id, ex.text, ex.text_b, ex.label)
    for row in variant_rows(ex.source_id, ex.text, ex.text_b, cfg=cfg, context=ctx, labeled=ex.label is not None):
        yield beam.pvalue.TaggedOutput("variants", row)


def _resolve(item):
    _, groups = item
    winner, dups, excluded = resolve(groups["rows"], bool(groups["exclude"]))
    if dups:
        yield beam.pvalue.TaggedOutput("duplicates", dups)
    if excluded:
        yield beam.pvalue.TaggedOutput("excluded", excluded)
    if winner is not None:
        yield winner


class _ToRecords(beam.DoFn):
    def setup(self):
        self.written = beam.metrics.Metrics.counter(METRICS_NAMESPACE, "rows_written")

    def start_bundle(self):
        self.progress = Progress("rows written (originals and variants)")

    def process(self, row):
        self.progress.update()
        self.written.inc()
        yield to_record(row)


def _guard_sources(item):
    _, groups = item
    for ex in groups["examples"]:
        if groups["exclude"]:
            yield beam.pvalue.TaggedOutput("excluded", 1)
        else:
            yield ex


def _excluded_keys(p, specs: Sequence[SourceSpec]):
    """(normalized text, True) for every sentence of the evaluation files, once each."""
    if not specs:
        return p | "NoExcludes" >> beam.Create([])
    return (p
            | "ListExcludes" >> beam.Create(list(specs))
            | "ReadExcludes" >> beam.FlatMap(
                lambda s: (dedup_key(e.text, e.text_b) for e in read_source(s, opener=FileSystems.open)
                           if isinstance(e, Example)))
            | "DistinctExcludes" >> beam.Distinct()
            | "KeyExcludes" >> beam.Map(lambda k: (k, True)))


def _sum(pcoll, label):
    return pcoll | label >> beam.CombineGlobally(sum)


# --- the pipeline ---------------------------------------------------------------

def build(p: beam.Pipeline, job: AugmentJob) -> dict:
    cfg = job.augment
    specs = [replace(s, label_names=job.label_names) for s in job.inputs] + list(job.unlabeled)
    read = (p
            | "ListInputs" >> beam.Create(specs)
            | "ReadInputs" >> beam.FlatMap(_read).with_outputs("rejects", main="examples"))
    examples = read.examples | "SpreadExamples" >> beam.Reshuffle()
    rejects = read.rejects

    excluded_keys = _excluded_keys(p, job.exclude)
    # Sources equal to an evaluation sentence go before augmentation: their variants would
    # be near-copies of evaluation data.
    guarded = ({"examples": examples | "KeyExamplesByText" >> beam.Map(lambda e: (dedup_key(e.text, e.text_b), e)),
                "exclude": excluded_keys}
               | "GroupSourcesByText" >> beam.CoGroupByKey()
               | "GuardSources" >> beam.FlatMap(_guard_sources).with_outputs("excluded", main="kept"))
    items = guarded.kept | "NoContext" >> beam.Map(lambda ex: (ex, {}))
    pos_vocab = None
    # With no variants to make (n_iter 0: unlabeled text as is), tagging and the MLM are skipped.
    if cfg.makes_variants and cfg.needs("tags"):
        items = (items
                 | "BatchForTagger" >> beam.BatchElements(min_batch_size=min(64, cfg.tag_batch_size),
                                                         max_batch_size=cfg.tag_batch_size)
                 | "TagPOS" >> beam.ParDo(_Tag(cfg.spacy_model, cfg.tag_batch_size)))
        pos_vocab = beam.pvalue.AsSingleton(items | "PosVocabulary" >> beam.CombineGlobally(_PosVocab()))
    if cfg.makes_variants and cfg.needs("candidates"):
        items = (items
                 | "BatchForMLM" >> beam.BatchElements(min_batch_size=min(8, cfg.mlm_batch_size),
                                                       max_batch_size=cfg.mlm_batch_size)
                 | "MLMCandidates" >> beam.ParDo(_MlmCandidates(cfg.mlm_model, cfg.mlm_top_k, cfg.mlm_batch_size,
                                                            cfg.torch_threads)))

    kwargs = {"pos_vocab": pos_vocab} if pos_vocab is not None else {}
    expanded = items | "Augment" >> beam.FlatMap(_expand, cfg, **kwargs).with_outputs("variants", main="originals")
    rows = (expanded.originals, expanded.variants) | "AllRows" >> beam.Flatten()

    keyed_rows = rows | "KeyByText" >> beam.Map(lambda r: (dedup_key(r.text, r.text_b), r))
    resolved = ({"rows": keyed_rows, "exclude": excluded_keys}
                | "GroupByText" >> beam.CoGroupByKey()
                | "DedupAndGuard" >> beam.FlatMap(_resolve).with_outputs("duplicates", "excluded", main="kept"))

    metadata = schema.base_metadata(job.label_names, **{
        schema.META_AUGMENT_CONFIG: json.loads(cfg.to_json()),
        schema.META_SEED: cfg.seed,
    })
    written = (resolved.kept
               | "ToRecords" >> beam.ParDo(_ToRecords())
               | "WriteParquet" >> beam.io.WriteToParquet(
                   opts.join(job.output, schema.DATA_DIR, "part"), schema.transfer_schema(metadata),
                   codec="zstd", file_name_suffix=".parquet"))
    rejects_written = (rejects
                       | "RejectsToJson" >> beam.Map(lambda r: json.dumps(r.to_dict(), ensure_ascii=False))
                       | "WriteRejects" >> beam.io.WriteToText(opts.join(job.output, schema.REJECTS_DIR, "rejects"),
                                                               file_name_suffix=".jsonl"))

    per_file = ({"accepted": read.examples | "AcceptedByFile" >> beam.Map(lambda e: (e.file, 1)),
                 "rejected": rejects | "RejectedByFile" >> beam.Map(lambda r: (r.file, 1))}
                | "GroupByFile" >> beam.CoGroupByKey()
                | "CountByFile" >> beam.Map(lambda kv: (kv[0], {"accepted": sum(kv[1]["accepted"]),
                                                               "rejected": sum(kv[1]["rejected"])}))
                | "ByFileDict" >> beam.combiners.ToDict())
    samples = (rejects
               | "RejectByFile" >> beam.Map(lambda r: (r.file, r.to_dict()))
               | "FirstRejects" >> beam.combiners.Top.PerKey(3, key=lambda d: -d[schema.REJECT_LINE])
               | "FirstRejectsDict" >> beam.combiners.ToDict())
    n_accepted = opts.count(read.examples, "CountAccepted")
    n_rejected = opts.count(rejects, "CountRejected")
    n_input = ((n_accepted, n_rejected) | "InputRows" >> beam.Flatten() | "SumInput" >> beam.CombineGlobally(sum))
    counts = {
        "input_rows": n_input,
        "accepted_rows": n_accepted,
        "rejected_rows": n_rejected,
        "originals": n_accepted,
        "variants_generated": opts.count(expanded.variants, "CountVariants"),
        "duplicates_dropped": _sum(resolved.duplicates, "SumDuplicates"),
        "excluded_dropped": _sum((guarded.excluded, resolved.excluded) | "AllExcluded" >> beam.Flatten(),
                                 "SumExcluded"),
        "output_rows": opts.count(resolved.kept, "CountOutput"),
        "inputs": per_file,
        "first_rejects": samples,
    }

    def check(stats):
        problems = reconcile(stats) + bad_inputs(stats["inputs"], stats["first_rejects"])
        stats["problems"] = problems
        return not problems

    static = {"recipe": cfg.recipe, "ops": list(cfg.ops), "n_iter": cfg.n_iter,
              "unlabeled_n_iter": cfg.variants_for(False), "seed": cfg.seed,
              "label_names": list(job.label_names)}
    finished = p | "Finalize" >> opts.Finalize(job.output, counts, wait_on=[written, rejects_written],
                                               static=static, check=check)
    return {"kept": resolved.kept, "rejects": rejects, "stats": finished}


# --- the stage function and the command line -----------------------------------

def make_job(cfg: AugmentConfig, *, inputs: Sequence[str], output: str, unlabeled: Sequence[str] = (),
             exclude: Sequence[str] = ()) -> AugmentJob:
    """Check the input paths and settle the label set: everything `build` needs."""
    if not inputs:
        raise UserError("augment: at least one labeled input is needed (--input)")

    def spec(path: str, labeled: bool) -> SourceSpec:
        return SourceSpec(path=path, text_column=cfg.text_column,
                          label_column=cfg.label_column if labeled else None,
                          text_b_column=cfg.text_b_column, max_chars=cfg.max_chars, limit=cfg.limit)

    for path in [*inputs, *unlabeled, *exclude]:
        detect_format(path)
        if not path.startswith("hf:") and not FileSystems.exists(path):
            raise UserError(f"{path}: no such file")
    labels = cfg.labels or infer_label_names(inputs[0], cfg.label_column, opener=FileSystems.open, limit=cfg.limit)
    return AugmentJob(
        inputs=tuple(spec(p, True) for p in inputs),
        unlabeled=tuple(spec(p, False) for p in unlabeled),
        exclude=tuple(SourceSpec(path=p, text_column=cfg.text_column, label_column=None,
                                 text_b_column=cfg.text_b_column, max_chars=10**9) for p in exclude),
        output=output, augment=cfg, label_names=tuple(labels))


def run_augment(cfg: AugmentConfig, *, inputs: Sequence[str], output: str, unlabeled: Sequence[str] = (),
                exclude: Sequence[str] = (), beam_cfg: BeamConfig = BeamConfig(), extra: Sequence[str] = (),
                overwrite: bool = False) -> dict:
    """Build the transfer set in `output`; return its stats. Raises UserError when the stats show a problem."""
    job = make_job(cfg, inputs=inputs, output=output, unlabeled=unlabeled, exclude=exclude)
    if not job.exclude:
        print("transferset augment: warning: no --exclude given; nothing guards against evaluation "
              "sentences leaking into the transfer set", file=sys.stderr)
    opts.prepare_output(job.output, overwrite=overwrite)
    print(f"transferset augment: recipe {cfg.recipe} ops {','.join(cfg.ops)}, "
          f"{cfg.n_iter} variants per example, labels {list(job.label_names)} → {job.output}",
          file=sys.stderr)
    with beam.Pipeline(options=opts.pipeline_options(beam_cfg, extra)) as p:
        build(p, job)
    stats = opts.read_json_file(opts.join(job.output, schema.STATS_FILE))
    if stats.get("problems"):
        raise UserError("\n".join(stats["problems"]) + f"\n(rejected rows with reasons: "
                        f"{opts.join(job.output, schema.REJECTS_DIR)}/)")
    return stats


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("inputs and output")
    g.add_argument("--input", action="append", required=True, metavar="PATH",
                   help="labeled input: .tsv/.csv/.jsonl/.parquet or hf:NAME[:CONFIG]:SPLIT (repeatable)")
    g.add_argument("--unlabeled", action="append", default=[], metavar="PATH",
                   help="in-domain text without labels, augmented too (repeatable)")
    g.add_argument("--exclude", action="append", default=[], metavar="PATH",
                   help="evaluation data (dev/test): rows whose text equals one of its sentences are dropped")
    g.add_argument("--output", required=True, metavar="OUT", help="output directory (local or gs://...)")
    config.add_arguments(parser, AugmentConfig, title="settings (the run config's augment: section)")
    opts.add_runner_arguments(parser)


def run(args, extra: Sequence[str]) -> int:
    cfg = config.from_args(AugmentConfig, args)
    stats = run_augment(cfg, inputs=args.input, output=args.output, unlabeled=args.unlabeled,
                        exclude=args.exclude, beam_cfg=opts.beam_config(args), extra=extra,
                        overwrite=args.overwrite)
    print(json.dumps({k: stats[k] for k in STAT_KEYS}, indent=2))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    from transferset.cli import main as cli_main

    return cli_main(["augment", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
