"""transferset.scored.shards without Beam: routing, the commit rule, atomic shards, clean-up, stats checks."""
import json
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from transferset import fs
from transferset.contract import ids, schema
import builders as testing
from transferset.scored import shards


def row(id_, text="some text", text_b=None):
    return {**testing.transfer_rows([text], ids=[id_])[0], schema.TEXT_B: text_b}


def test_route_scores_a_new_row():
    r = row("a")
    assert shards.route("a", [(r, "f0", 1)], []) == [(shards.SCORE, ("a", r))]


def test_route_first_row_by_file_and_line_wins_whatever_the_arrival_order():
    first, second, third = row("a", "one"), row("a", "two"), row("a", "three")
    out = shards.route("a", [(third, "f1", 2), (second, "f0", 9), (first, "f0", 3)], [])
    assert out[-1] == (shards.SCORE, ("a", first))
    rejects = [v for tag, v in out if tag == shards.REJECT]
    assert [(r[schema.REJECT_FILE], r[schema.REJECT_LINE]) for r in rejects] == [("f0", 9), ("f1", 2)]
    assert rejects[0][schema.REJECT_REASON] == "duplicate id a (kept f0 row 3)"
    assert json.loads(rejects[1][schema.REJECT_RAW])[schema.TEXT] == "three"


@pytest.mark.parametrize("key,text,text_b,reason", [
    ("", "fine", None, "missing id"), (None, "fine", None, "missing id"),
    ("a", "  ", None, "empty text"), ("a", "fine", " ", "empty text"),
])
def test_route_rejects_with_reason(key, text, text_b, reason):
    r = dict(row("x", text, text_b), **{schema.ID: key})
    assert [(tag, v[schema.REJECT_REASON]) for tag, v in shards.route(key, [(r, "f", 4)], [])] == [
        (shards.REJECT, reason)]


def test_route_on_resume():
    r = row("a")
    assert shards.route("a", [(r, "f", 1)], [None]) == [(shards.DONE, "a")]
    # In the output but not in the input (another input), or only as a reject now: stale.
    assert shards.route("a", [], [None]) == [(shards.STALE, "a")]
    assert [t for t, _ in shards.route("a", [(row("a", " "), "f", 1)], [None])] == [shards.REJECT, shards.STALE]
    assert shards.route("a", [(r, "f", 1)], [None, None]) == [(shards.DUPLICATED, "a"), (shards.DONE, "a")]


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_buffer_commits_at_shard_rows():
    buf = shards.ShardBuffer(shard_rows=3, shard_seconds=60.0, clock=Clock())
    got = [buf.add({"n": i}) for i in range(7)]
    assert [None if g is None else [r["n"] for r in g] for g in got] == [None, None, [0, 1, 2], None, None,
                                                                        [3, 4, 5], None]
    assert len(buf) == 1 and [r["n"] for r in buf.take()] == [6] and len(buf) == 0


def test_buffer_commits_when_the_oldest_row_is_shard_seconds_old():
    clock = Clock()
    buf = shards.ShardBuffer(shard_rows=10_000, shard_seconds=60.0, clock=clock)
    assert buf.add({"n": 0}) is None
    clock.t += 59.0
    assert buf.add({"n": 1}) is None  # the oldest row has waited 59 s
    clock.t += 1.0
    assert [r["n"] for r in buf.add({"n": 2})] == [0, 1, 2]
    # The age counts from the first row of the new buffer, not from the last commit.
    clock.t += 30.0
    assert buf.add({"n": 3}) is None
    clock.t += 59.0
    assert buf.add({"n": 4}) is None
    clock.t += 1.0
    assert [r["n"] for r in buf.add({"n": 5})] == [3, 4, 5]
    # shard_seconds 0: every row is committed as it arrives.
    zero = shards.ShardBuffer(shard_rows=10_000, shard_seconds=0.0, clock=clock)
    assert [r["n"] for r in zero.add({"n": 9})] == [9]


def scored_rows(n, classes=2, hidden=4):
    rows = testing.transfer_rows([f"text {i}" for i in range(n)])
    for i, r in enumerate(rows):
        r.update({schema.TEACHER_LABEL: i % classes,
                  schema.TEACHER_LOGITS: np.arange(classes, dtype=np.float32) + i,
                  schema.TEACHER_HIDDEN: np.full(hidden, i / 8, dtype=np.float32)})
    return rows


@pytest.fixture(params=["local", "memory"])
def data_dir(request, tmp_path):
    if request.param == "local":
        d = str(tmp_path / "data")
    else:
        d = f"memory://shards/{uuid.uuid4().hex}/data"
    fs.makedirs(d)
    yield d
    if request.param == "memory":
        fs.delete(d)


def test_write_shard_is_whole_zstd_and_named_by_its_ids(data_dir):
    out_schema = schema.scored_schema(2, 4, metadata=schema.base_metadata(["a", "b"]))
    rows = scored_rows(5)
    path, n = shards.write_shard(data_dir, "part-x", rows, out_schema)
    assert n == 5 and fs.listdir(data_dir) == [path]  # no temporary file left
    assert fs.basename(path) == shards.shard_name("part-x", rows) and path.endswith(".parquet")
    with fs.open(path) as fh:
        pf = pq.ParquetFile(fh)
        assert pf.metadata.row_group(0).column(0).compression == "ZSTD"
        table = pf.read()
    assert table.column(schema.ID).to_pylist() == [r[schema.ID] for r in rows]
    np.testing.assert_array_equal(table.column(schema.TEACHER_LOGITS).to_pylist()[3], [3.0, 4.0])
    assert table.schema.field(schema.TEACHER_HIDDEN).type.value_type == "halffloat"
    # A retried bundle rewriting the same rows replaces the file instead of adding a copy.
    assert shards.write_shard(data_dir, "part-x", rows, out_schema)[0] == path and len(fs.listdir(data_dir)) == 1


def test_rows_to_table_refuses_wrong_widths():
    out_schema = schema.scored_schema(2, 4)
    with pytest.raises(ValueError, match="teacher_hidden: vectors of shape \\(3,\\), the schema says \\(4,\\)"):
        shards.rows_to_table(scored_rows(2, hidden=3), out_schema)


def test_clean_up_keeps_committed_and_earlier_runs_deletes_strays(data_dir):
    out_schema = schema.scored_schema(2, 4)
    rows = scored_rows(6)
    earlier, _ = shards.write_shard(data_dir, "part-old", rows[:2], out_schema)
    kept, _ = shards.write_shard(data_dir, "part-new", rows[2:4], out_schema)
    stray, _ = shards.write_shard(data_dir, "part-new", rows[4:], out_schema)  # a failed attempt's shard
    fs.write_text(fs.join(data_dir, shards.TMP_PREFIX + "dead.partial"), "half a file")
    assert shards.clean_up_shards([kept], data_dir, "part-new", out_schema) == 2
    assert fs.listdir(data_dir) == sorted([earlier, kept])
    assert shards.committed_shards(data_dir) == sorted([earlier, kept]) and stray not in fs.listdir(data_dir)


def test_clean_up_writes_an_empty_readable_shard_when_nothing_was_scored(data_dir):
    out_schema = schema.scored_schema(2, 4, metadata=schema.base_metadata(["a", "b"]))
    assert shards.clean_up_shards([], data_dir, "part-run", out_schema) == 1
    [path] = fs.listdir(data_dir)
    with fs.open(path) as fh:
        pf = pq.ParquetFile(fh)
        assert pf.metadata.num_rows == 0
        assert schema.check_schema(pf.schema_arrow, where=path, scored=True)[schema.META_LABEL_NAMES] == ["a", "b"]


def test_check_stats_refuses_what_does_not_reconcile():
    ok = {"existing_ids_not_in_input": 0, "existing_ids_written_twice": 0, "input_rows": 5, "scored": 4,
          "rejected": 1}
    shards.check_stats(ok)
    with pytest.raises(ValueError, match="2 id\\(s\\) in the output are not in the input"):
        shards.check_stats(dict(ok, existing_ids_not_in_input=2))
    with pytest.raises(ValueError, match="1 id\\(s\\) appear in more than one shard"):
        shards.check_stats(dict(ok, existing_ids_written_twice=1))
    with pytest.raises(ValueError, match="input_rows 5 != scored 3 \\+ rejected 1"):
        shards.check_stats(dict(ok, scored=3))


def test_run_prefixes_differ():
    a, b = shards.run_prefix(lambda: 0.0), shards.run_prefix(lambda: 0.0)
    assert a.startswith("part-19700101T000000-") and a != b


def test_input_units_cover_every_row_once_across_row_groups(tmp_path):
    rows = testing.transfer_rows([f"text {i}" for i in range(10)])
    path = str(tmp_path / "shard.parquet")
    sch = schema.transfer_schema(schema.base_metadata(("neg", "pos")))
    pq.write_table(pa.Table.from_pylist(rows, schema=sch), path, row_group_size=4)
    assert pq.ParquetFile(path).num_row_groups == 3
    units = shards.input_units([path, "empty.parquet"], [10, 0], unit_rows=3)
    assert [(u[2], u[3]) for u in units] == [(0, 3), (3, 6), (6, 9), (9, 10)]  # the empty file: no unit
    read = [item for u in units for item in shards.read_input_rows(u[1], u[2], u[3], file_index=u[0])]
    whole = list(shards.read_input_rows(path))
    assert read == whole and [n for _, (_, _, n, _) in read] == list(range(1, 11))
    assert [key for key, _ in read] == [r[schema.ID] for r in rows]
    assert [pos for _, (_, _, _, pos) in read] == [(0, n) for n in range(1, 11)]
    # ids only skips the rows that cannot be scored
    assert [key for u in units for key, _ in shards.read_input_ids(u[1], u[2], u[3])] == [r[schema.ID] for r in rows]


def test_route_in_two_steps_counts_ids_then_routes_rows():
    a1, a2 = row("a", "one"), row("a", "two")
    count = shards.NO_ROWS
    for position in [(1, 4), (0, 7), None]:  # two input rows in arrival order, once in the output
        count = shards.count_id(count, position)
    assert count == (2, (0, 7), 1) and shards.needs_lookup(count)
    assert shards.merge_counts([(1, (1, 4), 0), (1, (0, 7), 1), shards.NO_ROWS]) == count
    assert shards.route_row("a", a2, "f0", 7, (0, 7), count, ["f0", "f1"]) == (shards.DONE, "a")
    tag, reject = shards.route_row("a", a1, "f1", 4, (1, 4), count, ["f0", "f1"])
    assert tag == shards.REJECT and reject[schema.REJECT_REASON] == "duplicate id a (kept f0 row 7)"
    assert not shards.needs_lookup((1, (0, 1), 0))  # a clean fresh id never reaches the side input
    assert shards.route_row("b", row("b"), "f0", 1, (0, 1), None, ["f0"]) == (shards.SCORE, ("b", row("b")))
    assert shards.id_routes("c", (0, None, 2)) == [(shards.DUPLICATED, "c"), (shards.STALE, "c")]


def test_suspect_hashes_are_the_repeated_and_the_done_ids(tmp_path):
    rows = testing.transfer_rows([f"text {i}" for i in range(6)], ids=["a", "b", "c", "a", "d", "e"])
    rows.append({**testing.transfer_rows(["   "], ids=["b"])[0]})  # "b" again, but not scorable: no repeat
    path = str(tmp_path / "shard.parquet")
    sch = schema.transfer_schema(schema.base_metadata(("neg", "pos")))
    pq.write_table(pa.Table.from_pylist(rows, schema=sch), path)
    units = shards.input_units([path], [7], unit_rows=2)  # "a" is repeated across two units
    hashes = [shards.read_input_hashes(u[1], u[2], u[3], u[0]) for u in units]
    assert [h.dtype for h in hashes] == [np.uint64] * 4 and sum(map(len, hashes)) == 6  # 8 bytes a scorable row
    h = ids.id_hash
    assert h("a") == h("a") != h("b") and 0 <= h("a") < 2 ** 64
    suspects = shards.suspect_hashes(hashes)
    assert suspects.tolist() == [h("a")]
    assert [k for u in units for k, _ in shards.read_suspect_ids(u[1], u[2], u[3], u[0], suspects)] == ["a", "a"]
    # ids already in the output (--resume) are suspects too, sorted with the repeated ones
    with_done = shards.suspect_hashes(hashes, [np.array([h("e"), h("zz")], dtype=np.uint64)])
    assert with_done.tolist() == sorted([h("a"), h("e"), h("zz")])
    assert [k for u in units for k, _ in shards.read_suspect_ids(u[1], u[2], u[3], u[0], with_done)] == ["a", "a", "e"]
    assert shards.has_hash(with_done, "e") and not shards.has_hash(with_done, "c")
    assert shards.suspect_hashes([]).tolist() == [] and not shards.has_hash(shards.suspect_hashes([]), "a")
