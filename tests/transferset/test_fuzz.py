"""Random bytes and random Unicode (lone surrogates included) through every reader format, every
registered augmenter and the metadata check: no traceback, and every line is counted
(kept + rejected == lines). Random labels (huge, negative, float-like) never make a class, and random
scored-set values (NaN, inf, labels out of range) are refused by file and row. Kept small
(max_examples) so the file runs in seconds."""
import io
import json
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transferset import augment
from transferset.augment.dedup import to_record
from transferset.augment.pos import PosVocab
from transferset.config import AugmentConfig
from transferset.contract import schema
from transferset.runtime.errors import UserError
from transferset.sources import Example, Reject, SourceError, SourceSpec, read_source

FAST = settings(max_examples=100, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
LABELS = ("neg", "pos")
SURROGATES = st.integers(0xD800, 0xDFFF).map(chr)
SYNTAX = st.sampled_from(list(' \t\n\r",\\{}[]:\x00\ufeff\u2028\x85') + ["neg", "pos", "0", "1"])
TEXT = st.lists(st.one_of(st.characters(), SURROGATES, SYNTAX), max_size=40).map("".join)
LABEL = st.one_of(st.none(), st.sampled_from(LABELS), st.integers(-3, 3), st.floats(allow_nan=True), st.booleans(),
                  TEXT, st.lists(st.integers(), max_size=2))


def physical_lines(data: bytes) -> int:
    """Lines as `wc -l` sees them, plus a last line without a newline."""
    if not data:
        return 0
    return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


def read_all(data: bytes, fmt: str, **spec):
    fd, path = tempfile.mkstemp(suffix="." + fmt)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        spec.setdefault("label_names", LABELS)
        return list(read_source(SourceSpec(path=path, **spec)))
    finally:
        os.remove(path)


def check_records(records) -> list[Example]:
    """Every record is storable: rejects as UTF-8 JSON lines, examples as Parquet rows with their ids."""
    kept = []
    for r in records:
        assert isinstance(r, (Example, Reject)), r
        if isinstance(r, Reject):
            json.dumps(r.to_dict(), ensure_ascii=False).encode("utf-8")
            json.dumps(r.to_sample(), ensure_ascii=False).encode("utf-8")
            assert r.reason
        else:
            r.text.encode("utf-8")
            (r.text_b or "").encode("utf-8")
            kept.append(r)
    return kept


def encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # lone surrogates become the (invalid) bytes that carry them


# --- readers --------------------------------------------------------------------------------------
@FAST
@given(body=st.binary(max_size=300), fmt=st.sampled_from(["tsv", "csv", "jsonl"]), header=st.booleans())
def test_random_bytes_every_line_is_counted(body, fmt, header):
    head = {"tsv": b"sentence\tlabel\n", "csv": b"sentence,label\n", "jsonl": b""}[fmt] if header else b""
    data = head + body
    try:
        records = read_all(data, fmt)
    except SourceError:  # the header itself is unusable: one message for the file, no rows
        assert fmt != "jsonl" and not header
        return
    lines = physical_lines(data) - (1 if fmt != "jsonl" and data else 0)
    assert len(records) == max(lines, 0)
    check_records(records)


@FAST
@given(rows=st.lists(st.tuples(TEXT, LABEL), max_size=12), fmt=st.sampled_from(["tsv", "csv", "jsonl"]))
def test_random_unicode_rows_every_line_is_counted(rows, fmt):
    if fmt == "jsonl":
        lines = [json.dumps({"sentence": t, "label": lab}) for t, lab in rows]  # lone surrogates as \\udXXX escapes
        data = "\n".join(lines).encode("utf-8") + (b"\n" if lines else b"")
    else:
        sep = "\t" if fmt == "tsv" else ","
        data = encode(f"sentence{sep}label\n" + "".join(f"{t}{sep}{lab}\n" for t, lab in rows))
    records = read_all(data, fmt)
    expected = physical_lines(data) - (0 if fmt == "jsonl" else 1)
    assert len(records) == expected
    kept = check_records(records)
    if fmt == "jsonl":  # one JSON line per row: a row is kept only when its text is storable
        for r in kept:
            assert r.label in (0, 1)


@FAST
@given(texts=st.lists(st.one_of(st.none(), TEXT, st.binary(max_size=20)), min_size=1, max_size=12),
       labels=st.lists(LABEL, min_size=12, max_size=12), as_string=st.booleans())
def test_random_parquet_every_row_is_counted(texts, labels, as_string):
    n = len(texts)
    if as_string:  # a string column holding whatever bytes (pyarrow does not check UTF-8 on write)
        raw = [None if t is None else (t if isinstance(t, bytes) else encode(t)) for t in texts]
        column = pa.array(raw, pa.binary()).view(pa.string())
    else:
        column = pa.array([t if isinstance(t, bytes) or t is None else encode(t) for t in texts], pa.binary())
    label_values = [json.dumps(v) for v in labels[:n]]  # labels as names, numbers, lists... in a string column
    buf = io.BytesIO()
    pq.write_table(pa.table({"sentence": column, "label": label_values}), buf)
    records = read_all(buf.getvalue(), "parquet")
    assert len(records) == n
    check_records(records)


@FAST
@given(data=st.binary(max_size=200))
def test_random_bytes_as_parquet_is_one_clear_error(data):
    try:
        records = read_all(b"PAR1" + data + b"PAR1", "parquet")
    except SourceError as exc:
        assert "Parquet" in str(exc)
    else:
        check_records(records)


# --- augmenters -----------------------------------------------------------------------------------
def context_for(examples):
    """The context every registered op may read, built small by hand: POS tags, their vocabulary, MLM candidates."""
    tags, counts = [], {}
    for ex in examples:
        words = augment.split_words(ex.text)
        t = ["NN" if i % 2 else "JJ" for i in range(len(words))]
        tags.append(t)
        for tag, w in zip(t, words):
            counts[(tag, w)] = counts.get((tag, w), 0) + 1
    vocab = PosVocab.from_counts(counts) if counts else PosVocab({}, {}, {})
    contexts = []
    for ex, t in zip(examples, tags):
        words = augment.split_words(ex.text)
        candidates = {i: [w[::-1], w.upper(), "x"] for i, w in enumerate(words) if i % 3 != 2}
        contexts.append({"tags": t, "pos_vocab": vocab, "candidates": candidates})
    return contexts


@FAST
@given(rows=st.lists(TEXT, min_size=1, max_size=8), seed=st.integers(0, 2**31 - 1))
def test_every_registered_augmenter_on_random_unicode(rows, seed):
    data = "\n".join(json.dumps({"text": t}) for t in rows).encode("utf-8") + b"\n"
    records = read_all(data, "jsonl", text_column="text", label_column=None)
    assert len(records) == len(rows)
    examples = check_records(records)  # augmenters only ever see accepted rows
    contexts = context_for(examples)
    out_schema = schema.transfer_schema()
    for name in augment.names():
        cfg = AugmentConfig(ops=(name,), n_iter=3, seed=seed, p_mask=0.5, p_pos=0.5, p_mlm=0.5, p_ng=0.5)
        produced = []
        for ex, ctx in zip(examples, contexts):
            produced.append(to_record(augment.original_row(ex.source_id, ex.text, ex.text_b, ex.label)))
            variants = list(augment.variant_rows(ex.source_id, ex.text, ex.text_b, cfg=cfg, context=ctx))
            assert len(variants) == 3
            produced += [to_record(v) for v in variants]
        pa.Table.from_pylist(produced, schema=out_schema)  # every row is storable


# --- metadata -------------------------------------------------------------------------------------
JSON_VALUES = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), TEXT),
                           lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                   st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=20)
KEYS = st.sampled_from([schema.META_SCHEMA_VERSION, schema.META_LABEL_NAMES, schema.META_MAX_LENGTH,
                        schema.META_HIDDEN_SPEC, schema.META_SEED, schema.META_TOKENIZER, schema.META_INPUT,
                        schema.META_TEACHER_ID, schema.META_AUGMENT_CONFIG, schema.META_PREFIX + "other", "other"])


@FAST
@given(meta=st.dictionaries(KEYS, st.one_of(JSON_VALUES.map(lambda v: json.dumps(v).encode("utf-8", "surrogatepass")),
                                            st.binary(max_size=40)), max_size=6))
def test_random_metadata_is_decoded_or_refused(meta):
    raw = {k.encode(): v for k, v in meta.items()}
    try:
        decoded = schema.decode_metadata(raw, where="f.parquet")
    except schema.SchemaError as exc:
        message = str(exc)
        assert message.startswith("f.parquet: Parquet metadata ") and len(message) < 1_000
        return
    for key, value in decoded.items():  # what is accepted can be written back
        assert key.startswith(schema.META_PREFIX)
        json.dumps(value).encode("utf-8")
    sch = pa.schema(schema.transfer_fields(), metadata=raw)
    try:
        schema.check_schema(sch, where="f.parquet")
    except UserError:
        pass


def test_the_fuzz_strategies_do_produce_lone_surrogates():
    """A fuzz test that never draws the case it is about cannot fail."""
    found = []

    @settings(max_examples=60, derandomize=True, deadline=None)
    @given(TEXT)
    def probe(text):
        found.append(any(0xD800 <= ord(c) <= 0xDFFF for c in text))

    probe()
    assert any(found)
    assert np.mean(found) < 1


# --- labels (transferset.contract.labels): every line accounted for, never a new class -----------------------
NUMERIC = st.one_of(
    st.integers(-10**40, 10**40),                                     # huge and negative
    st.integers(0, 3),                                                # real class indices
    st.floats(allow_nan=True, allow_infinity=True),                   # 1.0, nan, inf, 1e-300
    st.from_regex(r"\A[+-]?[0-9]{1,3}(\.[0-9]*)?([eE][+-]?[0-9]{1,2})?\Z"),  # float-like strings
    st.sampled_from(["01", " 2 ", "1_0", "+1", "-0", "١", "1000", "999", "neg", "pos", "", "NaN", "Infinity"]),
)


def _labels_file(values, fmt: str) -> bytes:
    if fmt == "jsonl":  # numbers stay numbers in JSON, strings strings
        return "".join(json.dumps({"sentence": f"s{i}", "label": v}) + "\n" for i, v in enumerate(values)).encode()
    if fmt == "parquet":
        buf = io.BytesIO()
        ints = all(isinstance(v, int) and -2**63 <= v < 2**63 for v in values)
        column = pa.array(values, pa.int64()) if ints else pa.array([str(v) for v in values])
        pq.write_table(pa.table({"sentence": [f"s{i}" for i in range(len(values))], "label": column}), buf)
        return buf.getvalue()
    sep = "\t" if fmt == "tsv" else ","
    return (f"sentence{sep}label\n" + "".join(f"s{i}{sep}{v}\n" for i, v in enumerate(values))).encode()


@FAST
@given(values=st.lists(NUMERIC, min_size=1, max_size=15), fmt=st.sampled_from(["tsv", "csv", "jsonl", "parquet"]))
def test_random_labels_are_classes_or_rejects_never_a_new_class(values, fmt):
    from transferset.contract import labels
    from transferset.sources import infer_label_names

    if fmt in ("tsv", "csv"):
        values = [str(v) for v in values]
    data = _labels_file(values, fmt)
    fd, path = tempfile.mkstemp(suffix="." + fmt)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    try:
        try:
            names = infer_label_names(path)
        except SourceError as exc:  # no valid label at all: one message
            assert "no label values found" in str(exc)
            assert all(labels.problem(v) is not None for v in values)
            return
        valid = [v for v in values if labels.problem(v) is None]
        assert len(names) <= labels.MAX_CLASSES and all(labels.problem(n) is None for n in names)
        keys = {labels.key(v) for v in valid}
        if all(k.isdigit() for k in keys):  # class indices: 0..the largest one in the file, no more
            assert names == tuple(str(i) for i in range(max(int(k) for k in keys) + 1))
        else:
            assert set(names) == keys
        records = list(read_source(SourceSpec(path=path, label_names=names)))
        assert len(records) == len(values)  # every line accounted for
        check_records(records)
        for rec, value in zip(records, values):
            if labels.problem(value) is not None:
                assert isinstance(rec, Reject) and "label" in rec.reason
            else:
                assert isinstance(rec, Example) and names[rec.label] == labels.key(value)
    finally:
        os.remove(path)


# --- scored-set values (transfer.check_values): a bad value is refused by file and row, never trained on --
def _scored_dir(directory: str, label_col, teacher_col, logits, hidden, num_classes: int) -> None:
    os.makedirs(os.path.join(directory, schema.DATA_DIR))
    n = len(label_col)
    sch = schema.scored_schema(num_classes, hidden.shape[1], metadata=schema.base_metadata(
        [f"c{k}" for k in range(num_classes)]))
    cols = {schema.ID: [f"r{i}" for i in range(n)], schema.SOURCE_ID: [f"s{i}" for i in range(n)],
            schema.TEXT: [f"t{i}" for i in range(n)], schema.TEXT_B: [None] * n, schema.OPS: [[]] * n,
            schema.LABEL: label_col, schema.TEACHER_LABEL: teacher_col}
    arrays = [pa.array(cols[f.name], f.type) for f in sch if f.name in cols]
    arrays += [pa.FixedSizeListArray.from_arrays(pa.array(m.reshape(-1)), m.shape[1]) for m in (logits, hidden)]
    table = pa.Table.from_arrays(arrays, schema=sch)
    half = n // 2  # two shards, so rows are counted per file
    pq.write_table(table.slice(0, half), os.path.join(directory, schema.DATA_DIR, "part-0.parquet"))
    pq.write_table(table.slice(half), os.path.join(directory, schema.DATA_DIR, "part-1.parquet"))


FLOATS = st.one_of(st.floats(-1e4, 1e4, width=16), st.sampled_from([float("nan"), float("inf"), float("-inf")]))


@FAST
@given(num_classes=st.integers(2, 4), data=st.data())
def test_random_scored_values_are_refused_by_file_and_row_or_read(num_classes, data):
    import re

    from transferset.data import transfer

    n = data.draw(st.integers(1, 12))
    classes = st.integers(-2, num_classes + 2)
    label_col = data.draw(st.lists(st.one_of(st.none(), classes), min_size=n, max_size=n))
    teacher_col = data.draw(st.lists(classes, min_size=n, max_size=n))
    logits = np.array(data.draw(st.lists(st.lists(FLOATS, min_size=num_classes, max_size=num_classes),
                                         min_size=n, max_size=n)), dtype=np.float32)
    hidden = np.array(data.draw(st.lists(st.lists(FLOATS, min_size=3, max_size=3), min_size=n, max_size=n)),
                      dtype=np.float16)
    bad_rows = {i for i in range(n)
                if (label_col[i] is not None and not 0 <= label_col[i] < num_classes)
                or not 0 <= teacher_col[i] < num_classes
                or not np.isfinite(logits[i]).all() or not np.isfinite(hidden[i]).all()}
    with tempfile.TemporaryDirectory() as d:
        _scored_dir(d, label_col, teacher_col, logits, hidden, num_classes)
        try:
            rows = sum(b.num_rows for b in transfer.iter_batches(d, num_classes=num_classes))
        except UserError as exc:
            m = re.match(r"(.*part-(\d)\.parquet), row (\d+) \(id 'r(\d+)'\): (\w+) ", str(exc))
            assert m, str(exc)
            shard, row, row_id, column = int(m.group(2)), int(m.group(3)), int(m.group(4)), m.group(5)
            assert row_id == row - 1 + (n // 2 if shard else 0) and row_id in bad_rows  # the named row is bad
            assert column in (schema.LABEL, schema.TEACHER_LABEL, schema.TEACHER_LOGITS, schema.TEACHER_HIDDEN)
            return
        assert not bad_rows and rows == n
