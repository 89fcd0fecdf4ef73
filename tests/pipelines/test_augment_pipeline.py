"""The augment pipeline on real SST-2 rows, with the real spaCy tagger and real Beam runners."""
import json
import os
import re
import shutil
from pathlib import Path

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that

from pipelines.augment import AugmentJob, build
from transferset.app.cli import main
from transferset.config import AugmentConfig
from transferset.contract import schema
from transferset.data import transfer
from transferset.sources import SourceSpec, normalize_text


def _rows(out):
    return transfer.read_table(str(out)).to_pylist()


def _stats(out):
    return json.loads((Path(out) / schema.STATS_FILE).read_text())


@pytest.fixture(scope="module")
def train_with_dev_leak(sst2_dir, tmp_path_factory, head_tsv):
    """500 train rows plus 20 dev rows, so the leak guard has something to catch."""
    d = tmp_path_factory.mktemp("leak")
    path = head_tsv(sst2_dir / "train.tsv", d / "train500.tsv", 500)
    dev = (sst2_dir / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:21]
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("\n".join(dev) + "\n")
    return path


@pytest.fixture(scope="module")
def tang_run(train_with_dev_leak, sst2_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("tang") / "out"
    rc = main(["augment", "--input", str(train_with_dev_leak), "--exclude", str(sst2_dir / "dev.tsv"),
               "--output", str(out), "--seed", "7"])
    assert rc == 0
    return out


def test_stats_reconcile_and_match_the_files(tang_run):
    s = _stats(tang_run)
    rows = _rows(tang_run)
    assert s["input_rows"] == 520 == s["accepted_rows"] + s["rejected_rows"]
    # The 20 dev sentences are dropped as sources: no variants are made of them.
    assert s["originals"] == 520 and s["variants_generated"] == 500 * 20
    assert s["originals"] + s["variants_generated"] - s["duplicates_dropped"] - s["excluded_dropped"] \
        == s["output_rows"] == len(rows)
    assert s["problems"] == []
    assert (Path(tang_run) / schema.COMPLETE_MARKER).exists()


def test_no_dev_sentence_in_the_output(tang_run, sst2_dir):
    dev = {normalize_text(l.split("\t")[0]) for l in (sst2_dir / "dev.tsv").read_text().splitlines()[1:]}
    rows = _rows(tang_run)
    assert not [r for r in rows if normalize_text(r[schema.TEXT]) in dev]
    # The 20 injected dev originals (and any variant that recreated a dev sentence) were caught.
    assert _stats(tang_run)["excluded_dropped"] >= 20
    # ...and no variant made from a dev sentence either.
    from transferset.sources import source_id_for
    dev_ids = {source_id_for(l.split("\t")[0], None) for l in (sst2_dir / "dev.tsv").read_text().splitlines()[1:]}
    assert not [r for r in rows if r[schema.SOURCE_ID] in dev_ids]


def test_rows_follow_the_contract(tang_run):
    rows = _rows(tang_run)
    ids = [r[schema.ID] for r in rows]
    assert len(ids) == len(set(ids))
    texts = [normalize_text(r[schema.TEXT]) for r in rows]
    assert len(texts) == len(set(texts))  # each distinct text once
    originals = [r for r in rows if r[schema.OPS] == []]
    assert len(originals) == 500  # the 20 dev rows were excluded
    assert all(r[schema.LABEL] in (0, 1) for r in originals)
    variants = [r for r in rows if r[schema.OPS]]
    assert all(r[schema.LABEL] is None for r in variants)
    assert {op for r in variants for op in r[schema.OPS]} == {"mask", "pos", "ngram"}
    by_source = {r[schema.SOURCE_ID]: r[schema.TEXT] for r in originals}
    assert all(r[schema.SOURCE_ID] in by_source for r in variants)  # provenance joins back
    meta = transfer.read_metadata(str(tang_run))
    assert meta[schema.META_LABEL_NAMES] == ["0", "1"]
    assert meta[schema.META_AUGMENT_CONFIG]["seed"] == 7
    f = transfer.data_files(str(tang_run))[0]
    assert pq.ParquetFile(f).metadata.row_group(0).column(0).compression == "ZSTD"


@pytest.mark.integration  # two worker processes start: the slowest pipeline test
def test_one_and_two_workers_give_the_same_rows(sst2_dir, tmp_path, head_tsv):
    path = head_tsv(sst2_dir / "train.tsv", tmp_path / "train.tsv", 200)
    outs = []
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}"
        rc = main(["augment", "--input", str(path), "--output", str(out), "--n-iter", "8",
                   "--direct_num_workers", workers, "--direct_running_mode", "multi_processing"])
        assert rc == 0
        outs.append({(r[schema.ID], r[schema.TEXT]) for r in _rows(out)})
    assert outs[0] == outs[1] and len(outs[0]) > 200


def test_malformed_rows_become_rejects_and_the_run_succeeds(sst2_dir, tmp_path, capsys, head_tsv):
    path = head_tsv(sst2_dir / "train.tsv", tmp_path / "mixed.tsv", 30)
    with open(path, "ab") as fh:
        fh.write(b"\t1\nbad \xff bytes\t0\nthree\tfields\there\nunknown label\t9\n")
    out = tmp_path / "out"
    rc = main(["augment", "--input", str(path), "--output", str(out), "--n-iter", "2", "--labels", "0,1"])
    assert rc == 0
    s = _stats(out)
    assert (s["input_rows"], s["accepted_rows"], s["rejected_rows"]) == (34, 30, 4)
    rejects = [json.loads(l) for f in sorted((out / schema.REJECTS_DIR).glob("*.jsonl"))
               for l in f.read_text().splitlines()]
    by_line = {r[schema.REJECT_LINE]: r for r in rejects}
    assert sorted(by_line) == [32, 33, 34, 35]
    assert by_line[32][schema.REJECT_REASON] == "empty text"
    assert by_line[33][schema.REJECT_REASON] == "bytes that are not valid UTF-8"
    assert "expected 2 fields" in by_line[34][schema.REJECT_REASON]
    assert "outside the label set" in by_line[35][schema.REJECT_REASON]
    assert all(r[schema.REJECT_FILE] == str(path) and r[schema.REJECT_RAW] for r in rejects)


def test_a_file_with_only_bad_rows_fails_with_a_clear_message(tmp_path, capsys):
    good = tmp_path / "good.tsv"
    good.write_text("sentence\tlabel\na fine film\t1\na dull film\t0\n")
    bad = tmp_path / "bad.tsv"
    bad.write_bytes(b"sentence\tlabel\n\t1\nx\t5\n")
    out = tmp_path / "out"
    rc = main(["augment", "--input", str(good), "--input", str(bad), "--output", str(out), "--n-iter", "1"])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"{bad}: every row was rejected (2 rows)" in err
    assert "line 2: empty text" in err and "line 3: label '5' outside the label set" in err
    assert not (out / schema.COMPLETE_MARKER).exists()
    assert _stats(out)["rejected_rows"] == 2  # still accounted for


def test_existing_complete_output_is_refused_without_overwrite(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "a fine film", "label": 1}\n{"text": "a dull film", "label": 0}\n')
    out = tmp_path / "out"
    args = ["augment", "--input", str(src), "--output", str(out), "--n-iter", "2", "--ops", "mask"]
    assert main(args) == 0
    assert main(args) == 1
    assert "already holds a complete run" in capsys.readouterr().err
    assert main(args + ["--overwrite"]) == 0


def test_augment_never_deletes_files_it_did_not_write(tmp_path, sst2_dir, capsys):
    """`mkdir -p p/data && cp D.tsv p/data/keep.tsv && transferset augment --input T.tsv --output p --n-iter 0`
    is refused and keeps keep.tsv: an output without _COMPLETE is not cleared whatever its data/, rejects/ and
    stats.json hold, and files augment did not write are never deleted, not even with --overwrite."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "a fine film", "label": 1}\n{"text": "a dull film", "label": 0}\n')
    p = tmp_path / "p"
    (p / "data").mkdir(parents=True)
    keep = p / "data" / "keep.tsv"
    keep.write_bytes((Path(sst2_dir) / "dev.tsv").read_bytes())
    before = keep.read_bytes()
    args = ["augment", "--input", str(src), "--output", str(p), "--n-iter", "0"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert f"{p} holds data/ (keep.tsv), which transferset did not write" in err
    # data/ is a folder augment writes: another's files there are never deleted, not even with --overwrite.
    assert main(args + ["--overwrite"]) == 1
    assert "never deletes files it did not write, even with --overwrite" in capsys.readouterr().err
    assert keep.read_bytes() == before and sorted(os.listdir(p)) == ["data"] and os.listdir(p / "data") == ["keep.tsv"]
    # An input inside the output is refused whatever the flags (a usage error).
    inside = p / "in.jsonl"
    inside.write_bytes(src.read_bytes())
    assert main(["augment", "--input", str(inside), "--output", str(p), "--n-iter", "0", "--overwrite"]) == 2
    assert f"--output {p} contains the input {inside}" in capsys.readouterr().err
    # A file of another's under a name augment does not write: kept, the set written beside it with --overwrite.
    inside.unlink()
    keep.rename(p / "keep.tsv")
    (p / "data").rmdir()
    assert main(args) == 1 and "pass --overwrite to write beside them (they are kept)" in capsys.readouterr().err
    assert main(args + ["--overwrite"]) == 0
    assert (p / "keep.tsv").read_bytes() == before and (p / schema.COMPLETE_MARKER).exists()
    assert len(_rows(p)) == 2
    # Replacing that set (--overwrite) still keeps keep.tsv; the set's own files are recorded as its own.
    assert main(args + ["--overwrite"]) == 0
    assert (p / "keep.tsv").read_bytes() == before and len(_rows(p)) == 2
    manifest = json.loads((p / schema.MANIFEST_FILE).read_text())
    assert manifest["command"] == "augment" and manifest["kept"] == ["keep.tsv"]
    assert set(manifest["written"]) == {schema.DATA_DIR, schema.REJECTS_DIR, schema.STATS_FILE,
                                        schema.COMPLETE_MARKER}


def _augment_with_unlabeled(tmp_path, labeled: str, unlabeled: list[str], *flags: str) -> Path:
    """Augment one labeled TSV row plus unlabeled JSONL texts with the mask op; → the output folder."""
    lab, unl, out = tmp_path / "lab.tsv", tmp_path / "unl.jsonl", tmp_path / "out"
    lab.write_text(f"sentence\tlabel\n{labeled}\t1\n")
    unl.write_text("".join(json.dumps({"text": t}) + "\n" for t in unlabeled))
    assert main(["augment", "--input", str(lab), "--unlabeled", str(unl), "--output", str(out),
                 "--ops", "mask", "--p-mask", "0.5", *flags]) == 0
    return out


def test_unlabeled_text_is_augmented_without_labels(tmp_path):
    out = _augment_with_unlabeled(tmp_path, "a fine film", ["an unlabeled review of a movie"], "--n-iter", "3")
    rows = _rows(out)
    orig = {r[schema.TEXT]: r[schema.LABEL] for r in rows if not r[schema.OPS]}
    assert orig == {"a fine film": 1, "an unlabeled review of a movie": None}


def test_unlabeled_text_may_have_its_own_number_of_variants(tmp_path):
    out = _augment_with_unlabeled(tmp_path, "a fine film with a good story",
                                  ["an unlabeled review of a long movie", "another review of a dull film"],
                                  "--n-iter", "4", "--unlabeled-n-iter", "0")
    rows = _rows(out)
    sources = {r[schema.SOURCE_ID]: r[schema.TEXT] for r in rows if not r[schema.OPS]}
    variants_of = {text: sum(1 for r in rows if r[schema.OPS] and r[schema.SOURCE_ID] == sid)
                   for sid, text in sources.items()}
    assert variants_of["an unlabeled review of a long movie"] == variants_of["another review of a dull film"] == 0
    assert variants_of["a fine film with a good story"] >= 2  # 4 drawn; a few may repeat and be deduplicated
    stats = _stats(out)
    assert (stats["n_iter"], stats["unlabeled_n_iter"], stats["variants_generated"]) == (4, 0, 4)


def test_words_per_variant_in_the_pipeline_counts_and_records_it(tmp_path):
    # 6 words -> 2 variants, 13 words -> 4 (at most --n-iter 4), 1 unlabeled word -> 1; all counted, recorded.
    out = _augment_with_unlabeled(tmp_path, "a fine film with a story",
                                  ["a long unlabeled review of a movie that goes on and on and on", "fine"],
                                  "--n-iter", "4", "--words-per-variant", "3")
    stats = _stats(out)
    assert (stats["variants_generated"], stats["words_per_variant"]) == (2 + 4 + 1, 3)
    rows = _rows(out)
    assert len(rows) == 3 + stats["variants_generated"] - stats["duplicates_dropped"]


def test_tinybert_recipe_in_a_test_pipeline(tiny_mlm_dir, tmp_path):
    src = tmp_path / "in.tsv"
    src.write_text("sentence\tlabel\nthe film was great and funny\t1\na boring plot , awful acting\t0\n")
    job = AugmentJob(inputs=(SourceSpec(path=str(src)),), output=str(tmp_path / "out"), label_names=("0", "1"),
                     augment=AugmentConfig(recipe="tinybert", n_iter=10, mlm_model=tiny_mlm_dir, mlm_top_k=4))
    with BeamTestPipeline(runner="FnApiRunner") as p:
        outs = build(p, job)
        data_dir = str(tmp_path / "out" / schema.DATA_DIR)

        def check(files):  # (path, rows) per bucket file written: rows kept in it, never an empty one
            assert files and all(n > 0 and os.path.dirname(path) == data_dir for path, n in files)
            assert len({path for path, _ in files}) == len(files)

        assert_that(outs["written"], check)
    rows = _rows(tmp_path / "out")
    variants = [r for r in rows if r[schema.OPS]]
    assert len(variants) >= 5 and all(r[schema.OPS] == ["mlm"] for r in variants)
    originals = {r[schema.SOURCE_ID]: r[schema.TEXT].split() for r in rows if not r[schema.OPS]}
    for r in variants:  # MLM replaces words one for one
        assert len(r[schema.TEXT].split()) == len(originals[r[schema.SOURCE_ID]])
    s = _stats(tmp_path / "out")
    assert s["variants_generated"] == 20 and s["problems"] == [] and s["output_rows"] == len(rows)
    assert all(re.fullmatch(r"part-000\d\d-of-00064\.parquet", name) for name in os.listdir(data_dir))


def test_the_graph_builds_with_dataflow_options(tmp_path):
    options = PipelineOptions(["--runner=DataflowRunner", "--project=my-project", "--region=europe-west4",
                               "--temp_location=gs://my-bucket/tmp", "--setup_file=./setup.py"])
    p = beam.Pipeline(options=options)
    job = AugmentJob(inputs=(SourceSpec(path="gs://my-bucket/train.tsv"),), output="gs://my-bucket/out",
                     exclude=(SourceSpec(path="gs://my-bucket/dev.tsv", label_column=None),),
                     label_names=("0", "1"))
    build(p, job)  # constructing the graph must not touch the bucket or need credentials
    proto = p.to_runner_api()
    labels = {t.unique_name for t in proto.components.transforms.values()}
    for step in ("ReadInputs", "TagPOS", "Augment", "SpillByText", "DedupBuckets", "WriteParquet",
                 "WriteRejects", "Finalize"):
        assert any(step in l for l in labels), step


def test_no_tagging_when_no_variants_are_made():
    """n_iter 0 (unlabeled text as is): the POS tagger is neither loaded nor run."""
    def labels(cfg):
        p = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
        build(p, AugmentJob(inputs=(SourceSpec(path="in.tsv"),), output="out", label_names=("0", "1"), augment=cfg))
        return {t.unique_name for t in p.to_runner_api().components.transforms.values()}

    assert any("TagPOS" in label for label in labels(AugmentConfig(n_iter=2)))
    assert not any("TagPOS" in label or "PosVocabulary" in label for label in labels(AugmentConfig(n_iter=0)))


def test_metrics_counters(tmp_path):
    """Rows read, rejected and written reach Beam's metrics (the Dataflow UI shows them)."""
    from apache_beam.metrics.metric import MetricsFilter

    from pipelines.augment import METRICS_NAMESPACE

    src = tmp_path / "in.tsv"
    src.write_text("sentence\tlabel\na fine film\t1\n\t0\nawful acting\t0\n")
    p = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    build(p, AugmentJob(inputs=(SourceSpec(path=str(src), label_names=("0", "1")),), output=str(tmp_path / "out"),
                        label_names=("0", "1"), augment=AugmentConfig(ops=("mask",), p_mask=0.5, n_iter=2)))
    result = p.run()
    result.wait_until_finish()
    found = result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))["counters"]
    counters = {c.key.metric.name: c.result for c in found}
    assert counters["rows_read"] == 3 and counters["rows_rejected"] == 1
    assert counters["rows_written"] == _stats(tmp_path / "out")["output_rows"] >= 2


# --- hardening: one owner per output, unicode, small stats --------------------------------------------
def _small_tsv(path, n=12):
    path.write_text("sentence\tlabel\n" + "".join(f"sentence number {i} is fine\t{i % 2}\n" for i in range(n)))
    return path


def _plant_lock(out, pid):
    import os
    import socket
    import time

    from transferset.fs.lock import LockInfo

    out.mkdir(parents=True, exist_ok=True)
    (out / schema.LOCK_FILE).write_bytes(LockInfo(socket.gethostname(), pid, time.time(), "augment", "t").to_json())


def test_augment_refused_while_a_live_run_owns_the_output_and_takes_over_a_dead_ones(tmp_path, capsys):
    import subprocess
    import sys

    src = _small_tsv(tmp_path / "in.tsv")
    out = tmp_path / "out"
    args = ["augment", "--input", str(src), "--output", str(out), "--ops", "mask", "--n-iter", "1"]
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _plant_lock(out, live.pid)
        assert main(args) == 1
    finally:
        live.kill()
        live.wait()
    err = capsys.readouterr().err
    assert f"transferset augment: error: {out} is in use by pid {live.pid} on host " in err
    assert f"; wait for it, or delete {out}/{schema.LOCK_FILE} if that run is dead" in err
    assert sorted(p.name for p in out.iterdir()) == [schema.LOCK_FILE]  # nothing written beside the lock
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _plant_lock(out, dead.pid)
    assert main(args) == 0  # the dead run's lock is taken over
    assert (out / schema.COMPLETE_MARKER).exists() and not (out / schema.LOCK_FILE).exists()
    assert _stats(out)["output_rows"] == len(_rows(out))


def test_lone_surrogate_rows_are_rejected_and_the_run_completes(tmp_path):
    src = tmp_path / "in.jsonl"
    lines = [json.dumps({"text": f"good sentence {i}", "label": str(i % 2)}) for i in range(10)]
    lines.insert(3, '{"text": "\\ud83d lone", "label": "1"}')
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    assert main(["augment", "--input", str(src), "--output", str(out), "--ops", "mask", "--n-iter", "2"]) == 0
    s = _stats(out)
    assert (s["input_rows"], s["accepted_rows"], s["rejected_rows"]) == (11, 10, 1)
    rejects = [json.loads(l) for f in sorted((out / schema.REJECTS_DIR).glob("*.jsonl"))
               for l in f.read_text(encoding="utf-8").splitlines()]
    assert [(r[schema.REJECT_LINE], r[schema.REJECT_REASON]) for r in rejects] == \
        [(4, "text is not valid Unicode (lone surrogate at char 1)")]
    assert (out / schema.COMPLETE_MARKER).exists()


def test_first_rejects_in_stats_keep_a_sample_of_a_long_line_and_its_length(tmp_path):
    src = _small_tsv(tmp_path / "in.tsv")
    with open(src, "a") as fh:
        fh.write("y" * 100_000 + "\t1\n")
    out = tmp_path / "out"
    assert main(["augment", "--input", str(src), "--output", str(out), "--ops", "mask", "--n-iter", "1"]) == 0
    (sample,) = _stats(out)["first_rejects"][str(src)]
    # The rejects file keeps the whole row; stats.json a sample of it and its length.
    (whole,) = [json.loads(l) for f in (out / schema.REJECTS_DIR).glob("*.jsonl") for l in f.read_text().splitlines()]
    assert len(whole[schema.REJECT_RAW]) > 100_000
    assert sample[schema.REJECT_RAW_CHARS] == len(whole[schema.REJECT_RAW]) and len(sample[schema.REJECT_RAW]) <= 301
    assert whole[schema.REJECT_RAW].startswith(sample[schema.REJECT_RAW][:-1])
    assert sample[schema.REJECT_REASON].startswith("text longer")
    assert (out / schema.STATS_FILE).stat().st_size < 5_000


def test_every_source_excluded_leaves_one_empty_readable_file_and_no_dedup_files(tmp_path):
    src = tmp_path / "in.tsv"
    src.write_text("sentence\tlabel\na fine film\t1\nawful acting\t0\n")
    out = tmp_path / "out"
    assert main(["augment", "--input", str(src), "--exclude", str(src), "--output", str(out), "--n-iter", "3",
                 "--runner", "FnApiRunner"]) == 0
    stats = _stats(out)
    assert (stats["output_rows"], stats["excluded_dropped"], stats["problems"]) == (0, 2, [])
    assert os.listdir(out / schema.DATA_DIR) == ["part-00000-of-00064.parquet"]
    assert transfer.read_table(str(out)).num_rows == 0
    assert transfer.read_metadata(str(out))[schema.META_LABEL_NAMES] == ["0", "1"]
    assert not (out / "_dedup").exists()  # the bucket files are removed once the set is written


def test_a_users_files_inside_data_and_rejects_survive_a_rerun_and_an_overwrite(tmp_path):
    """The record names augment's own files, not the whole data/ folder: a rerun onto an unfinished transfer set
    and --overwrite on a complete one keep the user's data/keep.txt and rejects/mine.jsonl."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "a fine film", "label": 1}\n{"text": "a dull film", "label": 0}\n{"text": 3}\n')
    p = tmp_path / "p"
    args = ["augment", "--input", str(src), "--output", str(p), "--n-iter", "2", "--ops", "mask"]
    assert main(args) == 0
    ids = sorted(r["id"] for r in _rows(p))
    (p / schema.COMPLETE_MARKER).unlink()
    (p / "data" / "keep.txt").write_text("x\n")
    (p / "rejects" / "mine.jsonl").write_text('{"mine": true}\n')
    assert main(args) == 0  # an unfinished run of augment: ours to redo
    assert main(args + ["--overwrite"]) == 0  # a complete one, replaced
    assert (p / "data" / "keep.txt").read_text() == "x\n"
    assert (p / "rejects" / "mine.jsonl").read_text() == '{"mine": true}\n'
    assert sorted(r["id"] for r in _rows(p)) == ids and (p / schema.COMPLETE_MARKER).exists()
    files = json.loads((p / schema.MANIFEST_FILE).read_text())["files"]
    assert "data/keep.txt" not in files and "rejects/mine.jsonl" not in files
    assert [f for f in files if f.endswith(".parquet")] and [f for f in files if f.startswith("rejects/")]


def test_a_data_folder_linked_to_another_set_is_refused_and_that_set_stays_byte_for_byte(tmp_path, capsys):
    """An unfinished augment output whose data/ is a link to another transfer set's data/: the plain rerun
    replaced that set's shards (953 → 527 rows) while its stats.json still described the old ones."""
    from transferset.testing import tree_hashes

    src = _small_tsv(tmp_path / "t.tsv")
    big, out = tmp_path / "big", tmp_path / "out"
    base = ["augment", "--input", str(src), "--n-iter", "1", "--ops", "mask", "--runner", "FnApiRunner"]
    assert main([*base, "--output", str(big)]) == 0
    assert main([*base, "--output", str(out)]) == 0
    shutil.rmtree(out / schema.DATA_DIR)
    (out / schema.COMPLETE_MARKER).unlink()
    os.symlink(big / schema.DATA_DIR, out / schema.DATA_DIR)
    before, ours = tree_hashes(str(big)), tree_hashes(str(out))
    for extra in ([], ["--overwrite"]):
        capsys.readouterr()
        assert main([*base, "--output", str(out), *extra]) == 2, extra
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"--output {out}: data is a symbolic link (to {big}/data); transferset never writes" in err
        assert tree_hashes(str(big)) == before and tree_hashes(str(out)) == ours, extra
