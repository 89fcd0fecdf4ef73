"""`transferset score` with several teachers: the Beam pipeline end to end on three tiny real BERT teachers."""
import hashlib
import json
import os

import apache_beam as beam
import numpy as np
import pyarrow.parquet as pq
import pytest

import builders as testing
from pipelines import score
from transferset.app import cli
from transferset.config import ScoreConfig
from transferset.contract import schema
from transferset.data import transfer
from transferset.runtime.errors import ConfigError, UserError
from tolerances import assert_reordered, tiny_bert

# A float16 column holds the float32 value rounded to 2**-11 relative (F16), on top of sums reordered by other
# batches (tests/tolerances.py: the 4-layer bound, scaled by the reference's largest value).
F16 = 2.0 ** -11
LABELS = ("0", "1")
TEXTS = ["the movie was great", "bad", "i love it !", "not good , not bad , just fine", "awful",
         "the best film ever made , with brilliant acting", "dull dull dull", "funny and charming"]
# The columns and metadata keys of a one-teacher scored set before ensembles existed: K = 1 keeps them.
OLD_COLUMNS = [schema.ID, schema.SOURCE_ID, schema.TEXT, schema.TEXT_B, schema.OPS, schema.LABEL,
               schema.TEACHER_LABEL, schema.TEACHER_LOGITS, schema.TEACHER_HIDDEN, schema.hidden_layer_column(1)]
OLD_META_KEYS = {schema.META_SCHEMA_VERSION, schema.META_LIBRARY_VERSION, schema.META_LABEL_NAMES,
                 schema.META_TEACHER_ID, schema.META_TEACHER_SHA256, schema.META_TOKENIZER, schema.META_HIDDEN_SPEC,
                 schema.META_MAX_LENGTH, schema.META_INPUT}


@pytest.fixture(scope="module")
def teachers(tmp_path_factory):
    """Three tiny BERT classifiers, different seeds; the second carries a `transferset teacher` metrics.json."""
    base = tmp_path_factory.mktemp("teachers")
    dirs = [testing.tiny_classifier(str(base / f"seed{s}"), seed=s) for s in range(3)]
    with open(os.path.join(dirs[1], schema.METRICS_FILE), "w") as fh:
        json.dump({"best_dev_accuracy": 0.75}, fh)
    return dirs


@pytest.fixture(scope="module")
def transfer_dir(tmp_path_factory):
    rows = testing.transfer_rows(TEXTS, labels=[i % 2 if i < 6 else None for i in range(len(TEXTS))])
    d = str(tmp_path_factory.mktemp("transfer"))
    testing.write_transfer_set(d, [rows[:5], rows[5:]], LABELS)
    return d, rows


def plain(teacher_dir):
    """The plain Hugging Face forward, one row at a time: text -> (logits (C,), [CLS] of every layer)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(teacher_dir)
    model = AutoModelForSequenceClassification.from_pretrained(teacher_dir).eval()

    def run(text):
        with torch.no_grad():
            out = model(**tok(text, truncation=True, max_length=128, return_tensors="pt"), output_hidden_states=True)
        return out.logits[0].numpy(), [h[0, 0].numpy() for h in out.hidden_states]

    return run


def by_id(directory):
    table = transfer.read_table(directory)
    return {r[schema.ID]: r for r in table.to_pylist()}


@pytest.fixture(scope="module")
def ensemble_scored(tmp_path_factory, transfer_dir, teachers):
    """One run through the command line: three --teacher, the default combination (mean)."""
    out = str(tmp_path_factory.mktemp("scored"))
    rc = cli.main(["score", "--input", transfer_dir[0], "--teacher", teachers[0], "--teacher", teachers[1],
                   "--teacher", teachers[2], "--output", out, "--layers=-1,1", "--batch-size", "4",
                   "--runner", "FnApiRunner"])
    assert rc == 0
    return out


def test_each_members_logits_stored_and_the_target_is_their_mean(ensemble_scored, transfer_dir, teachers):
    refs = [plain(t) for t in teachers]
    rows = by_id(ensemble_scored)
    assert set(rows) == {r[schema.ID] for r in transfer_dir[1]}
    for src in transfer_dir[1]:
        row = rows[src[schema.ID]]
        members = [refs[k](src[schema.TEXT]) for k in range(3)]
        for k, (logits, _) in enumerate(members):
            assert_reordered(row[schema.member_logits_column(k)], logits, layers=4)
        stored = np.array([row[schema.member_logits_column(k)] for k in range(3)], dtype=np.float32)
        np.testing.assert_allclose(row[schema.TEACHER_LOGITS], stored.mean(axis=0), atol=1e-6, rtol=0)
        assert row[schema.TEACHER_LABEL] == int(np.argmax(row[schema.TEACHER_LOGITS]))
        # the members disagree somewhere: the mean is not one member's logits in disguise
        assert not np.allclose(stored[0], stored[1], atol=1e-3)
        # hidden states: the primary (first) teacher's [CLS], last layer and layer 1
        _, hidden = members[0]
        np.testing.assert_allclose(np.asarray(row[schema.TEACHER_HIDDEN], np.float32), hidden[-1], rtol=F16,
                                   atol=tiny_bert(hidden[-1], layers=4))
        np.testing.assert_allclose(np.asarray(row[schema.hidden_layer_column(1)], np.float32), hidden[1],
                                   rtol=F16, atol=tiny_bert(hidden[1], layers=4))


def test_schema_and_metadata_name_each_teacher(ensemble_scored, teachers):
    expected = schema.scored_schema(2, 32, [1], members=3)
    assert expected.names == OLD_COLUMNS + [f"teacher_logits_{k}" for k in range(3)]
    for path in transfer.data_files(ensemble_scored):
        assert pq.ParquetFile(path).schema_arrow.remove_metadata().equals(expected), path
    meta = transfer.read_metadata(ensemble_scored, scored=True)
    ens = meta[schema.META_ENSEMBLE]
    hashes = [hashlib.sha256(open(os.path.join(t, "model.safetensors"), "rb").read()).hexdigest() for t in teachers]
    assert ens == {"combine": "mean", "primary": 0, "teachers": [
        {"id": os.path.abspath(t), "sha256": h, "dev_accuracy": acc}
        for t, h, acc in zip(teachers, hashes, (None, 0.75, None))]}
    assert meta[schema.META_TEACHER_ID] == os.path.abspath(teachers[0])
    assert meta[schema.META_TEACHER_SHA256] == hashes[0]
    stats = json.load(open(os.path.join(ensemble_scored, schema.STATS_FILE)))
    assert stats["teachers"] == teachers and stats["combine"] == "mean" and stats["scored"] == len(TEXTS)


def test_a_chosen_member_is_the_target_and_the_primary(tmp_path, transfer_dir, teachers):
    job = score.ScoreJob(input=transfer_dir[0], teacher=teachers, output=str(tmp_path / "out"),
                         cfg=ScoreConfig(combine="2", batch_size=8))
    with beam.Pipeline(runner="FnApiRunner") as p:
        score.build(p, job)
    ref = plain(teachers[2])
    for src in transfer_dir[1]:
        row = by_id(str(tmp_path / "out"))[src[schema.ID]]
        assert row[schema.TEACHER_LOGITS] == row[schema.member_logits_column(2)]
        logits, hidden = ref(src[schema.TEXT])
        assert_reordered(row[schema.TEACHER_LOGITS], logits, layers=4)
        np.testing.assert_allclose(np.asarray(row[schema.TEACHER_HIDDEN], np.float32), hidden[-1], rtol=F16,
                                   atol=tiny_bert(hidden[-1], layers=4))
    meta = transfer.read_metadata(str(tmp_path / "out"), scored=True)
    assert meta[schema.META_ENSEMBLE]["combine"] == 2 and meta[schema.META_ENSEMBLE]["primary"] == 2
    assert meta[schema.META_TEACHER_ID] == os.path.abspath(teachers[2])


def test_one_teacher_keeps_the_single_teacher_schema(tmp_path, transfer_dir, teachers):
    plans = [score.plan(score.ScoreJob(input=transfer_dir[0], teacher=t, output=str(tmp_path / f"out{i}"),
                                       cfg=ScoreConfig(layers=(-1, 1))))
             for i, t in enumerate((teachers[0], [teachers[0]]))]
    single, listed = (p.output_schema for p in plans)
    assert single.names == listed.names == OLD_COLUMNS
    assert single.remove_metadata().equals(schema.scored_schema(2, 32, [1]))
    assert listed.remove_metadata().equals(single.remove_metadata())
    assert plans[0].metadata == plans[1].metadata
    assert {k for k in plans[0].metadata if k.startswith(schema.META_PREFIX)} == OLD_META_KEYS
    assert plans[1].member_sha256 == [] and "teachers" not in plans[1].stats


@pytest.mark.parametrize("labels, message", [
    (("1", "0"), r"predicts \['1', '0'\].*predicts \['0', '1'\].*same names in the same order"),
    (("0", "1", "2"), r"predicts 3 classes.*predicts 2"),
])
def test_members_with_other_classes_refused(tmp_path, transfer_dir, teachers, labels, message):
    other = testing.tiny_classifier(str(tmp_path / "other"), labels)
    job = score.ScoreJob(input=transfer_dir[0], teacher=[teachers[0], other], output=str(tmp_path / "out"))
    with pytest.raises(UserError, match=message):
        score.plan(job)
    assert not os.path.exists(tmp_path / "out")


def test_no_teacher_and_an_index_out_of_range_refused(tmp_path, transfer_dir, teachers):
    with pytest.raises(UserError, match="no teacher"):
        score.plan(score.ScoreJob(input=transfer_dir[0], teacher=[], output=str(tmp_path / "a")))
    with pytest.raises(ConfigError, match=r"--combine 3: there are 3 teacher\(s\), so a member index is 0..2"):
        score.plan(score.ScoreJob(input=transfer_dir[0], teacher=teachers, output=str(tmp_path / "b"),
                                  cfg=ScoreConfig(combine="3")))
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")


def test_unknown_combine_is_a_usage_error(tmp_path, transfer_dir, teachers, capsys):
    rc = cli.main(["score", "--input", transfer_dir[0], "--teacher", teachers[0], "--teacher", teachers[1], "--output",
                   str(tmp_path / "o"),
                   "--combine", "median"])
    assert rc == 2
    assert "--combine 'median': choose one of ['mean', 'probs']" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "o")


def test_a_student_trains_on_the_ensemble(ensemble_scored, tmp_path, capsys):
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\n" + "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(TEXTS)))
    testing.write_student_config(str(tmp_path / "small.yaml"), vocab={"embed_init": "random"})
    out = tmp_path / "student"
    rc = cli.main(["train", "--no-progress", "--transfer", ensemble_scored, "--dev", str(dev), "--output", str(out),
                   "--epochs", "1", "--config", str(tmp_path / "small.yaml")])
    assert rc == 0, capsys.readouterr().err
    metrics = json.load(open(out / schema.METRICS_FILE))
    assert metrics["transfer"]["rows"] == len(TEXTS)
    assert metrics["history"][0]["losses"]["mse"] > 0  # trained on the ensemble's logits


def _models(teachers):
    return [arg for t in teachers for arg in ("--model", t)]


def test_evaluate_shows_the_ensemble_and_each_member(tmp_path, teachers, capsys):
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\n" + "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(TEXTS)))
    gold = np.array([i % 2 for i in range(len(TEXTS))])
    logits = np.array([[plain(t)(text)[0] for text in TEXTS] for t in teachers])  # (K, N, C)
    assert cli.main(["evaluate", *_models(teachers), "--data", str(dev), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["accuracy"] == pytest.approx(float((logits.mean(0).argmax(1) == gold).mean()))
    assert result["combine"] == "mean"
    assert [m["model"] for m in result["members"]] == teachers
    assert [m["accuracy"] for m in result["members"]] == pytest.approx(
        [float((member.argmax(1) == gold).mean()) for member in logits])
    assert cli.main(["evaluate", *_models(teachers), "--data", str(dev), "--combine", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"ensemble of 3 (1) accuracy {(logits[1].argmax(1) == gold).mean():.4f}")
    assert f"member 2: accuracy {(logits[2].argmax(1) == gold).mean():.4f}" in text
    assert cli.main(["evaluate", *_models(teachers), "--data", str(dev), "--combine", "5"]) == 2
    assert "--combine 5: there are 3 teacher(s), so a member index is 0..2 (in the order of --model)" \
        in capsys.readouterr().err


def test_accuracies_read_back_from_a_scored_set(ensemble_scored):
    from transferset.teacher import ensemble

    rows = [r for r in by_id(ensemble_scored).values() if r[schema.LABEL] is not None]
    found = ensemble.accuracies(ensemble_scored)
    assert found["rows"] == len(rows) == 6
    assert found["teacher"] == pytest.approx(np.mean([r[schema.TEACHER_LABEL] == r[schema.LABEL] for r in rows]))
    assert found["members"] == pytest.approx(
        [np.mean([int(np.argmax(r[schema.member_logits_column(k)])) == r[schema.LABEL] for r in rows])
         for k in range(3)])


def test_members_of_other_depth_and_width_score_beside_the_primary(tmp_path, transfer_dir, teachers):
    """Only the primary's hidden states are stored: a 1-layer, 16-wide member is asked for its logits only
    (the primary's layer 2 does not exist in it)."""
    small = testing.tiny_classifier(str(tmp_path / "small"), hidden_size=16, num_layers=1, seed=5)
    out = str(tmp_path / "out")
    job = score.ScoreJob(input=transfer_dir[0], teacher=[teachers[0], small], output=out,
                         cfg=ScoreConfig(layers=(-1, 1), batch_size=8))
    with beam.Pipeline(runner="FnApiRunner") as p:
        score.build(p, job)
    assert pq.read_schema(transfer.data_files(out)[0]).remove_metadata().equals(
        schema.scored_schema(2, 32, [1], members=2))
    refs = [plain(teachers[0]), plain(small)]
    rows = by_id(out)
    for src in transfer_dir[1]:
        row = rows[src[schema.ID]]
        (big_logits, big_hidden), (small_logits, _) = (ref(src[schema.TEXT]) for ref in refs)
        assert_reordered(row[schema.member_logits_column(1)], small_logits, layers=4)
        assert_reordered(row[schema.TEACHER_LOGITS], (big_logits + small_logits) / 2, layers=4)
        np.testing.assert_allclose(np.asarray(row[schema.hidden_layer_column(1)], np.float32), big_hidden[1],
                                   rtol=F16, atol=tiny_bert(big_hidden[1], layers=4))
