import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from transferset.contract import schema
from transferset.data import transfer
from transferset.runtime.errors import UserError


def test_scored_schema_types_follow_the_contract():
    s = schema.scored_schema(2, 384, layers=[3], metadata=schema.base_metadata(["neg", "pos"]))
    assert s.field(schema.LABEL).type == pa.int32() and s.field(schema.LABEL).nullable
    assert s.field(schema.OPS).type == pa.list_(pa.string())
    assert s.field(schema.TEACHER_LABEL).type == pa.int32()
    assert s.field(schema.TEACHER_LOGITS).type == pa.list_(pa.float32(), 2)
    assert s.field(schema.TEACHER_HIDDEN).type == pa.list_(pa.float16(), 384)
    assert s.field("teacher_hidden_l3").type == pa.list_(pa.float16(), 384)


def test_metadata_round_trip_and_checks(tmp_path):
    meta = schema.base_metadata(["neg", "pos"], **{schema.META_SEED: 3})
    sch = schema.transfer_schema(meta)
    rows = [{schema.ID: "a", schema.SOURCE_ID: "s", schema.TEXT: "t", schema.TEXT_B: None, schema.OPS: [],
             schema.LABEL: 1}]
    (tmp_path / "data").mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=sch), tmp_path / "data" / "p.parquet", compression="zstd")
    pq.write_table(sch.empty_table(), tmp_path / "data" / "q.parquet")  # empty shards are accepted
    got = transfer.read_metadata(str(tmp_path))
    assert got[schema.META_LABEL_NAMES] == ["neg", "pos"] and got[schema.META_SEED] == 3
    assert got[schema.META_SCHEMA_VERSION] == schema.SCHEMA_VERSION
    assert transfer.num_rows(str(tmp_path)) == 1
    with pytest.raises(UserError, match="missing column.*teacher_label.*transferset score"):
        transfer.read_metadata(str(tmp_path), scored=True)


def test_foreign_or_newer_files_are_refused(tmp_path):
    pq.write_table(pa.table({"text": ["x"]}), tmp_path / "plain.parquet")
    with pytest.raises(UserError, match="not written by transferset"):
        transfer.read_metadata(str(tmp_path))
    newer = schema.transfer_schema({schema.META_SCHEMA_VERSION: "99"})
    pq.write_table(newer.empty_table(), tmp_path / "plain.parquet")
    with pytest.raises(UserError, match="schema version '99'"):
        transfer.read_metadata(str(tmp_path))
    with pytest.raises(UserError, match="no Parquet files"):
        transfer.data_files(str(tmp_path / "nothing"))


def test_contract_names_types_and_keys_are_pinned():
    """The README's Parquet contract, spelled out: renaming a constant breaks this test, not users."""
    literal = {"id": pa.string(), "source_id": pa.string(), "text": pa.string(), "text_b": pa.string(),
               "ops": pa.list_(pa.string()), "label": pa.int32(), "teacher_label": pa.int32(),
               "teacher_logits": pa.list_(pa.float32(), 3), "teacher_hidden": pa.list_(pa.float16(), 8),
               "teacher_hidden_l2": pa.list_(pa.float16(), 8)}
    s = schema.scored_schema(3, 8, layers=[2])
    assert {f.name: f.type for f in s} == literal
    assert [f.name for f in s if f.nullable] == ["text_b", "label"]
    assert schema.hidden_layer_column(2) == "teacher_hidden_l2"
    keys = {schema.META_SCHEMA_VERSION: "transferset.schema_version",
            schema.META_LIBRARY_VERSION: "transferset.library_version",
            schema.META_LABEL_NAMES: "transferset.label_names",
            schema.META_AUGMENT_CONFIG: "transferset.augment_config", schema.META_SEED: "transferset.seed",
            schema.META_TEACHER_ID: "transferset.teacher_id",
            schema.META_TEACHER_SHA256: "transferset.teacher_weights_sha256",
            schema.META_TOKENIZER: "transferset.tokenizer", schema.META_HIDDEN_SPEC: "transferset.hidden_spec",
            schema.META_MAX_LENGTH: "transferset.max_length"}
    assert keys == {k: k for k in keys.values()}
    assert (schema.DATA_DIR, schema.REJECTS_DIR, schema.STATS_FILE, schema.COMPLETE_MARKER) == \
        ("data", "rejects", "stats.json", "_COMPLETE")
    assert (schema.HIDDEN_POOLING, schema.HIDDEN_LAYER, schema.HIDDEN_EXTRA_LAYERS, schema.HIDDEN_NUM_LAYERS,
            schema.HIDDEN_SIZE, schema.HIDDEN_DTYPE) == \
        ("pooling", "layer", "extra_layers", "num_hidden_layers", "hidden_size", "dtype")
    assert (schema.METRICS_FILE, schema.CURVES_FILE, schema.STUDENT_MODEL_DIR) == ("metrics.json", "curves.png", "model")


# --- crafted or damaged metadata: refused with the file and the key, never a traceback -----------------
def _write_crafted(directory, key, raw_value: bytes):
    meta = schema.encode_metadata(schema.base_metadata(["neg", "pos"]))
    meta[key.encode()] = raw_value
    sch = pa.schema(schema.transfer_fields(), metadata=meta)
    (directory / "data").mkdir(parents=True)
    path = directory / "data" / "p.parquet"
    pq.write_table(sch.empty_table(), path)
    return str(path)


CRAFTED = [
    (schema.META_LABEL_NAMES, b"[" * 200_000 + b"]" * 200_000, "nested too deeply"),
    (schema.META_LABEL_NAMES, b'["neg", "\xff\xfe"]', "not UTF-8"),
    (schema.META_LABEL_NAMES, b"42", "input should be a valid list"),
    (schema.META_LABEL_NAMES, b'["0", {"a": 1}]', r"\[1\]: input should be a valid string"),
    (schema.META_LABEL_NAMES, json.dumps(["x" * 30_000_000]).encode(), "30,000,004 bytes"),
    (schema.META_LABEL_NAMES, json.dumps(["x" * 201]).encode(), "at most 200 characters"),
    (schema.META_LABEL_NAMES, json.dumps([str(i) for i in range(1001)]).encode(), "at most 1000 items"),
    (schema.META_MAX_LENGTH, b'"abc"', "input should be a valid integer"),
    (schema.META_MAX_LENGTH, b"-5", "greater than or equal to 1"),
    (schema.META_MAX_LENGTH, b"1000000000000", "less than or equal to 100000"),
    (schema.META_HIDDEN_SPEC, b'{"pooling": "cls", "layer": "last"}', "hidden_spec"),
    (schema.META_LABEL_NAMES, b'["neg", "pos"', "not JSON"),
    (schema.META_SEED, b"true", "valid integer"),
]


@pytest.mark.parametrize("key, raw, problem", CRAFTED, ids=[f"{k.split('.')[-1]}-{p[:20]}" for k, _, p in CRAFTED])
def test_crafted_metadata_is_refused_naming_the_file_and_the_key(tmp_path, capsys, key, raw, problem):
    from transferset.app import cli

    path = _write_crafted(tmp_path / "set", key, raw)
    with pytest.raises(schema.SchemaError) as exc:
        transfer.read_metadata(str(tmp_path / "set"))
    msg = str(exc.value)
    assert msg.startswith(f"{path}: Parquet metadata {key}") and re.search(problem, msg), msg
    assert len(msg) < 600 and len(msg.splitlines()) == 1  # a cut value, one line
    assert cli.main(["inspect", str(tmp_path / "set")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and path in err and len(err) < 700


def test_writers_refuse_metadata_readers_would_refuse():
    with pytest.raises(schema.SchemaError, match="the metadata to write.*label_names.*at most 200 characters"):
        schema.base_metadata(["x" * 500])
    with pytest.raises(schema.SchemaError, match="max_length.*less than or equal to 100000"):
        schema.base_metadata(["a"], **{schema.META_MAX_LENGTH: 10**9})
    # What transferset itself writes passes, extensions included.
    meta = schema.base_metadata(["a", "b"], **{schema.META_MAX_LENGTH: 128, "transferset.future_key": {"x": [1]}})
    assert schema.decode_metadata(schema.encode_metadata(meta)) == meta
