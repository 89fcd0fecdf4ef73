"""Evaluation data, the streamed, shuffled training batches, and counting a set's rows."""
import re
import shutil

import pytest
import torch

from students import data
from students.build import setup
from students.data import count_rows
from students.data import TEACHER_LAYERS
from transferset.app.cli import main
from transferset.config import StudentConfig
from transferset.contract import schema
from transferset.runtime.errors import UserError


@pytest.fixture(scope="module")
def tiny_setup(tiny_scored_dir):
    return setup(StudentConfig(model={"embed_dim": 8, "hidden": 8}), tiny_scored_dir)


def test_streaming_visits_every_row_once_with_a_bounded_buffer(tiny_setup, tiny_scored_dir, monkeypatch):
    s = tiny_setup
    held = []
    real = data.table_arrays
    monkeypatch.setattr(data, "table_arrays", lambda table, pkd: held.append(table.num_rows) or real(table, pkd))
    seen, labels = [], []
    for batch in data.iter_train_batches(tiny_scored_dir, s.tokens, seed=1, batch_size=8, shuffle_rows=20):
        seen.append(batch[schema.TEACHER_LOGITS])
        labels.append(batch[schema.LABEL])
        assert len(batch[schema.LABEL]) <= 8 and batch["ids"].shape[0] == len(batch[schema.LABEL])
    assert sum(held) == 128 and max(held) < 40  # never more than shuffle_rows + one record batch
    logits = torch.cat(seen)
    assert logits.shape == (128, 2) and len({tuple(r.tolist()) for r in logits}) == 128
    assert int((torch.cat(labels) == -1).sum()) == 32
    labeled = list(data.iter_train_batches(tiny_scored_dir, s.tokens, seed=1, batch_size=8, shuffle_rows=20,
                                           labeled_only=True))
    assert sum(len(b[schema.LABEL]) for b in labeled) == 96
    assert all(bool((b[schema.LABEL] >= 0).all()) for b in labeled)


def test_the_shuffle_stream_fixes_the_order(tiny_setup, tiny_scored_dir):
    def order(seed):
        batches = data.iter_train_batches(tiny_scored_dir, tiny_setup.tokens, seed=seed, batch_size=8, shuffle_rows=20)
        return [t for b in batches for t in b[schema.TEXT]]
    assert order(3) == order(3)
    assert order(3) != order(4) and sorted(order(3)) == sorted(order(4))


def test_pkd_columns_stack_into_the_teacher_layers_of_each_batch(tiny_setup, tiny_scored_dir):
    columns = [schema.hidden_layer_column(2), schema.TEACHER_HIDDEN]  # teacher layers 2 and 4 (the last)
    for batch in data.iter_train_batches(tiny_scored_dir, tiny_setup.tokens, seed=0, batch_size=32,
                                         shuffle_rows=64, pkd_columns=columns):
        layers = batch[TEACHER_LAYERS]
        assert layers.shape == (len(batch[schema.LABEL]), 2, batch[schema.TEACHER_HIDDEN].shape[1])
        assert torch.equal(layers[:, 1], batch[schema.TEACHER_HIDDEN])
        assert not torch.equal(layers[:, 0], layers[:, 1])
    plain = next(data.iter_train_batches(tiny_scored_dir, tiny_setup.tokens, seed=0, batch_size=32, shuffle_rows=64))
    assert TEACHER_LAYERS not in plain


def test_read_eval_data_reads_sentence_pairs_and_skips_bad_rows(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("sentence1\tsentence2\tlabel\na b\tc d\t1\nonly one field\ne\tf\t0\n")
    got = data.read_eval_data(str(path), ["0", "1"], text_column="sentence1", text_b_column="sentence2")
    assert got.texts == ["a b", "e"] and got.texts_b == ["c d", "f"] and got.labels.tolist() == [1, 0]
    assert got.teacher_labels is None


def test_read_eval_data_of_a_scored_set_has_teacher_labels(tiny_scored_dir, tiny_scored):
    got = data.read_eval_data(tiny_scored_dir, ["0", "1"])
    assert len(got.texts) == 128 and got.texts[0] == tiny_scored["examples"][0].text
    assert got.teacher_labels.tolist() == tiny_scored["logits"].argmax(1).tolist()
    assert (got.labels == -1).sum() == 32


def _with_a_shard_written_again(tmp_path, scored_dir, copies: int = 1):
    """A copy of `scored_dir` with its second shard written again under other names, as two `score` runs
    into one folder once did."""
    scored = tmp_path / "scored"
    shutil.copytree(scored_dir, scored)
    data = scored / schema.DATA_DIR
    for i in range(copies):
        shutil.copy(data / "part-00001.parquet", data / f"part-00001-again{i}.parquet")
    return scored


def test_count_rows_counts_a_set_whose_ids_are_unique(tiny_scored_dir):
    assert count_rows(tiny_scored_dir) == (128, 96)


def test_count_rows_refuses_ids_that_repeat(tmp_path, tiny_scored_dir):
    scored = _with_a_shard_written_again(tmp_path, tiny_scored_dir, copies=2)
    with pytest.raises(UserError, match=rf"^{re.escape(str(scored))}: id r\d+ appears 3 times \(64 repeated ids\); "
                                        "the set was written twice — rescore it into an empty folder$"):
        count_rows(str(scored))


def test_train_refuses_a_scored_set_whose_ids_repeat(tmp_path, tiny_scored_dir, sst2_dev200, capsys):
    scored = _with_a_shard_written_again(tmp_path, tiny_scored_dir)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("threads: 1\nvocab: {embed_init: random}\nmodel: {embed_dim: 8, hidden: 8}\n")
    rc = main(["train", "--transfer", str(scored), "--dev", sst2_dev200, "--output", str(tmp_path / "run"),
               "--config", str(cfg), "--epochs", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert re.search(rf"{re.escape(str(scored))}: id r\d+ appears twice \(64 repeated ids\); the set was written "
                     "twice — rescore it into an empty folder", err), err
    assert not (tmp_path / "run" / schema.STUDENT_MODEL_DIR).exists()


@pytest.mark.parametrize("world, labeled_only", [(2, False), (3, False), (2, True)])
def test_each_rank_streams_its_own_rows(tiny_setup, tiny_scored_dir, world, labeled_only):
    rows = []
    for rank in range(world):
        logits = [b[schema.TEACHER_LOGITS] for b in data.iter_train_batches(
            tiny_scored_dir, tiny_setup.tokens, seed=1, batch_size=8, shuffle_rows=20, labeled_only=labeled_only,
            rank=rank, world=world)]
        rows.append({tuple(r.tolist()) for r in torch.cat(logits)})
    total = 96 if labeled_only else 128
    assert sum(len(r) for r in rows) == total and len(set.union(*rows)) == total  # disjoint, none left out
    assert max(map(len, rows)) - min(map(len, rows)) <= 1

def _with_a_bad_value(tmp_path, scored_dir, column: str, row: int, value):
    """A copy of `scored_dir` whose second shard holds `value` in `column` at its row `row` (a list
    column gets it at position 1), schema and metadata unchanged: what a foreign writer or an edit leaves."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    scored = tmp_path / "scored"
    shutil.copytree(scored_dir, scored)
    shard = scored / schema.DATA_DIR / "part-00001.parquet"
    table = pq.read_table(shard)
    field = table.schema.field(column)
    if pa.types.is_fixed_size_list(field.type):
        values = np.stack(table.column(column).to_pylist()).astype(np.float32)
        values[row, 1] = value
        flat = pa.array(values.reshape(-1).astype(field.type.value_type.to_pandas_dtype()))
        new = pa.FixedSizeListArray.from_arrays(flat, field.type.list_size)
    else:
        values = table.column(column).to_pylist()
        values[row] = value
        new = pa.array(values, field.type)
    table = table.set_column(table.schema.get_field_index(column), field, new)
    pq.write_table(table, shard)
    return scored, shard


@pytest.mark.parametrize("column, value, says", [
    (schema.TEACHER_LOGITS, float("nan"), "teacher_logits holds nan (position 1)"),
    (schema.TEACHER_HIDDEN, float("inf"), "teacher_hidden holds inf (position 1)"),
    (schema.LABEL, 7, "label 7 is not a class of the set's 2 labels (0..1)"),
    (schema.TEACHER_LABEL, 99, "teacher_label 99 is not a class of the set's 2 labels (0..1)"),
    (schema.TEACHER_LABEL, -1, "teacher_label -1 is not a class of the set's 2 labels (0..1)"),
])
def test_count_rows_refuses_a_value_no_student_can_train_on(tmp_path, tiny_scored_dir, column, value, says):
    scored, shard = _with_a_bad_value(tmp_path, tiny_scored_dir, column, 5, value)
    # Without num_classes (a set read for its texts: layer_texts), the set's own label count is the bound.
    for num_classes in (2, None):
        with pytest.raises(UserError, match=rf"^{re.escape(str(shard))}, row 6 \(id 'r69'\): {re.escape(says)}; "
                                            r"a scored set must hold finite teacher values"):
            count_rows(str(scored), num_classes=num_classes)


def test_training_batches_refuse_a_bad_value_of_a_layer_only_pkd_reads(tmp_path, tiny_setup, tiny_scored_dir):
    """The count pass checks what every student reads; a PKD layer column is checked as an epoch reads it."""
    scored, shard = _with_a_bad_value(tmp_path, tiny_scored_dir, "teacher_hidden_l2", 5, float("-inf"))
    assert count_rows(str(scored), num_classes=2) == (128, 96)
    assert sum(len(b[schema.LABEL]) for b in data.iter_train_batches(str(scored), tiny_setup.tokens, seed=0,
                                                                     batch_size=32, shuffle_rows=64)) == 128
    with pytest.raises(UserError, match=rf"^{re.escape(str(shard))}, row 6 \(id 'r69'\): teacher_hidden_l2 holds "
                                        r"-inf \(position 1\)"):
        list(data.iter_train_batches(str(scored), tiny_setup.tokens, seed=0, batch_size=32, shuffle_rows=64,
                                     pkd_columns=["teacher_hidden_l2"]))


def test_train_refuses_nan_logits_before_its_first_step(tmp_path, tiny_scored_dir, sst2_dev200, capsys):
    """NaN teacher_logits stop `train` before its first step, naming the row, exit 1: no NaN student trained
    and no dev accuracy reported for it."""
    scored, shard = _with_a_bad_value(tmp_path, tiny_scored_dir, schema.TEACHER_LOGITS, 3, float("nan"))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("threads: 1\nvocab: {embed_init: random}\nmodel: {embed_dim: 8, hidden: 8}\n")
    rc = main(["train", "--transfer", str(scored), "--dev", sst2_dev200, "--output", str(tmp_path / "run"),
               "--config", str(cfg), "--epochs", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert f"{shard}, row 4 (id 'r67'): teacher_logits holds nan" in err, err
    assert not (tmp_path / "run" / schema.STUDENT_MODEL_DIR).exists()


def test_train_refuses_a_gold_label_outside_the_set(tmp_path, tiny_scored_dir, sst2_dev200, capsys):
    """A gold label 7 in a 2-class set is one message of `train` naming the row, not an IndexError traceback."""
    scored, shard = _with_a_bad_value(tmp_path, tiny_scored_dir, schema.LABEL, 0, 7)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("threads: 1\nvocab: {embed_init: random}\nmodel: {embed_dim: 8, hidden: 8}\n")
    rc = main(["train", "--transfer", str(scored), "--dev", sst2_dev200, "--output", str(tmp_path / "run"),
               "--config", str(cfg), "--epochs", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert f"{shard}, row 1 (id 'r64'): label 7 is not a class of the set's 2 labels (0..1)" in err, err


@pytest.mark.parametrize("column, value", [(schema.LABEL, 7), (schema.TEACHER_LABEL, 99)])
def test_evaluation_data_refuses_a_label_outside_the_set(tmp_path, tiny_scored_dir, column, value):
    """Evaluation data refuses a gold label 7 of 2 classes (never silently scored as a miss) and a teacher_label
    99 (never counted as a disagreement), naming the row."""
    scored, shard = _with_a_bad_value(tmp_path, tiny_scored_dir, column, 10, value)
    with pytest.raises(UserError, match=rf"^{re.escape(str(shard))}, row 11 \(id 'r74'\): {column} {value} is not a "
                                        r"class of the set's 2 labels"):
        data.read_eval_data(str(scored), ["0", "1"])


def test_evaluation_data_of_a_labeled_file_rejects_a_huge_label_at_once(tmp_path):
    """A TSV label 20000000 is rejected at once, never 20 million label names for `evaluate` (11 minutes, 5.5 GB)."""
    path = tmp_path / "dev.tsv"
    path.write_text("sentence\tlabel\na fine film\t1\na dull film\t0\nodd\t20000000\nfloat\t1.0\n")
    got = data.read_eval_data(str(path), ["0", "1"])
    assert got.texts == ["a fine film", "a dull film"] and got.labels.tolist() == [1, 0]



def test_the_batches_hold_only_the_cached_columns_the_losses_need_and_the_same_rows(tiny_setup, tiny_scored_dir):
    """What a loss declares it reads (`needs`) chooses the columns read; rows and order stay."""
    from students.losses import LossWeights

    def epoch(**kw):
        return list(data.iter_train_batches(tiny_scored_dir, tiny_setup.tokens, seed=5, batch_size=8, shuffle_rows=40,
                                            pkd_columns=[schema.hidden_layer_column(2)], **kw))
    every = epoch()
    assert LossWeights(ce=1.0).needs() == set() and LossWeights(kd=1.0, pkd=1.0).needs() == {
        schema.TEACHER_LOGITS, TEACHER_LAYERS}
    for weights, held in [(LossWeights(ce=1.0), set()), (LossWeights(kd=1.0, ce=0.5), {schema.TEACHER_LOGITS}),
                          (LossWeights(repr=1.0), {schema.TEACHER_HIDDEN}), (LossWeights(pkd=1.0), {TEACHER_LAYERS})]:
        got = epoch(needs=weights.needs())
        assert len(got) == len(every)
        for a, b in zip(got, every):
            assert a[schema.TEXT] == b[schema.TEXT] and torch.equal(a[schema.LABEL], b[schema.LABEL])
            assert {schema.TEACHER_LOGITS, schema.TEACHER_HIDDEN, TEACHER_LAYERS} & set(a) == held, weights
            for key in held:
                assert torch.equal(a[key], b[key])


def test_a_scored_set_is_opened_once_with_what_the_trainer_needs(tmp_path, tiny_scored_dir):
    s = data.ScoredSet.open(tiny_scored_dir)
    assert (s.num_rows, s.num_labeled, len(s.label_names), s.hidden_width) == (128, 96, 2, 32)
    assert schema.TEACHER_LOGITS in s.column_names and s.path == tiny_scored_dir
    unfinished = tmp_path / "unfinished"
    shutil.copytree(tiny_scored_dir, unfinished)
    (unfinished / schema.COMPLETE_MARKER).unlink()
    with pytest.raises(UserError, match="is incomplete"):
        data.ScoredSet.open(str(unfinished))
    assert data.ScoredSet.open(str(unfinished), allow_incomplete=True).num_rows == 128
