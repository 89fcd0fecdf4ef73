"""Data for the students: labeled evaluation sets in memory, and shuffled training batches streamed
from the scored Parquet through a bounded buffer (memory stays flat however large the set is)."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Collection, Iterator, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from tqdm import tqdm

from transferset import fs, sources
from transferset.contract import ids, schema
from transferset.data import transfer
from transferset.runtime.errors import UserError

NO_LABEL = -1
# Batch key of the (B, L, H) stack of teacher_hidden_l{k} columns matched to the student's layers.
TEACHER_LAYERS = "teacher_layers"

# What a training batch reads of each row; PKD adds the columns of the teacher's intermediate layers.
TRAIN_COLUMNS = (schema.TEXT, schema.TEXT_B, schema.LABEL, schema.TEACHER_LOGITS, schema.TEACHER_HIDDEN)
TEXT_COLUMNS = TRAIN_COLUMNS[:3]  # what a phase with the teacher online alone reads (StudentConfig.layer_texts)


@dataclass
class EvalData:
    """A labeled evaluation set held in memory (dev sets are small)."""

    texts: list[str]
    texts_b: Optional[list[Optional[str]]]
    labels: np.ndarray                       # (N,) gold label index, NO_LABEL where unknown
    teacher_labels: Optional[np.ndarray]     # (N,) when the data holds teacher columns
    path: str


def _scored_parquet(path: str) -> Optional[list[str]]:
    """The Parquet files of `path` when it is a transfer-set directory or a transferset .parquet file, else None."""
    if fs.isdir(path):
        return transfer.data_files(path)
    if path.lower().endswith(".parquet"):
        try:
            meta = transfer.read_schema(path).metadata or {}
        except (OSError, pa.ArrowInvalid) as exc:
            raise UserError(f"{path}: cannot read as Parquet: {exc}") from exc
        if schema.META_SCHEMA_VERSION.encode() in meta:
            return [path]
    return None


def read_eval_data(path: str, label_names: Sequence[str], *, text_column: Optional[str] = None,
                   label_column: str = sources.DEFAULT_LABEL_COLUMN, text_b_column: Optional[str] = None) -> EvalData:
    """Read a labeled file (TSV/CSV/JSONL/Parquet) or a transferset Parquet set for evaluation.

    Refuses data whose labels are not among `label_names` (the transfer set's / the model's).
    `path` may be local or a URL (transferset.fs).
    """
    files = _scored_parquet(path)
    if files is not None:
        meta = (transfer.read_metadata(path) if fs.isdir(path)
                else schema.check_schema(transfer.read_schema(path), where=path))
        theirs = list(meta.get(schema.META_LABEL_NAMES) or [])
        if theirs != list(label_names):
            raise UserError(f"{path}: label names {theirs} differ from the transfer set's / model's "
                            f"{list(label_names)}; evaluate on data with the same label set")
        cols = [schema.TEXT, schema.TEXT_B, schema.LABEL]
        names = transfer.read_schema(files[0]).names
        has_teacher = schema.TEACHER_LABEL in names
        columns = cols + ([schema.TEACHER_LABEL] if has_teacher else [])
        tables = []
        for f in files:
            # What the train set's reader checks, checked alike (a gold label 7 of 2 classes would be scored as
            # a miss, a NaN logit's argmax is a teacher label of no meaning): the set is refused, not trusted.
            check_file_values(f, transfer.value_columns(names), len(label_names))
            tables.append(transfer.read_file(f, columns))
        table = pa.concat_tables(tables)
        labels = table.column(schema.LABEL).fill_null(NO_LABEL).to_numpy().astype(np.int64)
        texts_b = table.column(schema.TEXT_B).to_pylist()
        return EvalData(texts=table.column(schema.TEXT).to_pylist(),
                        texts_b=texts_b if any(t is not None for t in texts_b) else None,
                        labels=labels,
                        teacher_labels=(table.column(schema.TEACHER_LABEL).to_numpy().astype(np.int64)
                                        if has_teacher else None),
                        path=path)
    found = sources.infer_label_names(path, label_column, opener=fs.open)
    extra = sorted(set(found) - set(label_names))
    if extra:
        raise UserError(f"{path}: label names {list(found)} differ from the transfer set's / model's "
                        f"{list(label_names)} ({extra} unknown); use data with the same label set")
    spec = sources.SourceSpec(path=path, text_column=text_column, label_column=label_column,
                              text_b_column=text_b_column, label_names=tuple(label_names))
    texts, texts_b, labels, rejects = [], [], [], []
    for rec in sources.read_source(spec, opener=fs.open):
        if isinstance(rec, sources.Reject):
            rejects.append(rec)
        else:
            texts.append(rec.text)
            texts_b.append(rec.text_b)
            labels.append(rec.label)
    if not texts:
        raise UserError(sources.summarize_rejects(path, rejects))
    if rejects:
        tqdm.write(f"{path}: skipped {len(rejects)} bad row(s), e.g. line {rejects[0].line}: {rejects[0].reason}")
    return EvalData(texts, texts_b if text_b_column else None, np.asarray(labels, dtype=np.int64), None, path)


def count_rows(directory: str, num_classes: Optional[int] = None) -> tuple[int, int]:
    """→ (rows, rows with a gold label) of a transfer set; refuses a set whose ids repeat.

    Every id must occur once: a set written twice into one folder (two `score` runs once wrote every
    id twice) would train on each row twice. The ids are checked on the way as 64-bit hashes in one
    array, not as a set of strings: 8 bytes a row, 16 while the batches' arrays are joined (~1.6 GB for
    100 million rows). With `num_classes`, the same pass checks the values every student trains on
    (transfer.check_values: labels within the set, finite teacher_logits and teacher_hidden), so a bad
    row stops the run before its first step, naming the file and the row; the layers only PKD reads
    (teacher_hidden_l*) are checked as the epochs read them (iter_train_batches).
    """
    meta = require_transfer_set(directory)
    if num_classes is None:  # a set read for its texts (layer_texts): its values are checked all the same
        num_classes = len(meta.get(schema.META_LABEL_NAMES) or ()) or None
    names = transfer.read_schema(transfer.data_files(directory)[0]).names if num_classes is not None else ()
    return _count(directory, names, num_classes)


def _count(directory: str, names: Sequence[str], num_classes: Optional[int]) -> tuple[int, int]:
    """count_rows's one pass; `names`: the set's columns (whose teacher values are checked with num_classes)."""
    total = labeled = 0
    hashes = []
    columns = [schema.ID, schema.LABEL]
    if num_classes is not None:
        columns += [c for c in (schema.TEACHER_LABEL, schema.TEACHER_LOGITS, schema.TEACHER_HIDDEN) if c in names]
    for rb in transfer.iter_batches(directory, columns, batch_size=65536, num_classes=num_classes):
        total += rb.num_rows
        labeled += rb.num_rows - rb.column(1).null_count
        hashes.append(_id_hashes(rb.column(0)))
    if hashes:
        _refuse_repeated_ids(directory, hashes)
    return total, labeled


def require_transfer_set(directory: str) -> dict:
    """The metadata of `directory` when it is a transfer set (augment's or score's output); else one UserError
    saying what it is not (a `predict` output, a folder of other Parquet files) instead of a failure inside."""
    try:
        return transfer.read_metadata(directory)
    except schema.SchemaError as exc:
        raise UserError(f"{directory} is not a transfer set: {exc}") from None  # exc says what to give


@dataclass(frozen=True)
class ScoredSet:
    """A scored transfer set, checked once (`open`): what the trainer and a family's build read of it.

    `open` refuses, each in one line: a folder with no set, an unfinished one (unless `allow_incomplete`),
    one without teacher columns or with fewer than two label names, logits of another width than the
    label names, no rows, repeated ids, and a bad value (labels outside the set, non-finite teacher
    values: count_rows's one pass).
    """

    path: str
    meta: dict
    label_names: list[str]
    column_names: list[str]
    hidden_width: int     # teacher_hidden's width
    num_rows: int
    num_labeled: int

    @classmethod
    def open(cls, path: str, *, allow_incomplete: bool = False) -> "ScoredSet":
        files = transfer.data_files(path)  # a folder holding no transfer set at all says so first
        transfer.require_complete(path, allow_incomplete=allow_incomplete)
        meta = transfer.read_metadata(path, scored=True)  # refuses sets without teacher columns
        label_names = list(meta.get(schema.META_LABEL_NAMES) or [])
        if len(label_names) < 2:
            raise UserError(f"{path}: the transfer set records label names {label_names}; "
                            "a classifier needs at least two (rebuild it with `transferset augment --labels`)")
        file_schema = transfer.read_schema(files[0])
        logits_width = file_schema.field(schema.TEACHER_LOGITS).type.list_size
        if logits_width != len(label_names):
            raise UserError(f"{path}: teacher_logits has {logits_width} classes but the set names "
                            f"{len(label_names)} labels {label_names}; it was scored by a teacher for another task")
        num_rows, num_labeled = _count(path, file_schema.names, len(label_names))
        if num_rows == 0:
            raise UserError(f"{path}: the transfer set has no rows")
        return cls(path, meta, label_names, list(file_schema.names),
                   file_schema.field(schema.TEACHER_HIDDEN).type.list_size, num_rows, num_labeled)


def check_file_values(path: str, columns: Sequence[str], num_classes: int) -> None:
    """transfer.check_values over file `path`'s `columns`, a record batch at a time."""
    row = 0
    for batch in transfer.read_file(path, columns).to_batches():
        transfer.check_values(batch, num_classes, path=path, first_row=row)
        row += batch.num_rows


def _id_hashes(column: pa.Array) -> np.ndarray:
    # salted per process, which is all this needs: the hashes never leave one call of count_rows
    return ids.id_hashes(column.to_pylist(), stable=False, count=len(column))


def _refuse_repeated_ids(directory: str, hashes: list[np.ndarray]) -> None:
    """Refuse the set when an id repeats.

    Repeated hashes are confirmed on the ids themselves in a second pass that runs only then, so a hash
    collision alone never refuses a set; until the first id is read again, it holds the ids of the
    repeated hashes read so far. The count of repeated ids is that of repeated hashes (a 64-bit
    collision could add one, about once in 10,000 sets of 100 million rows).
    """
    suspects = ids.repeated_hashes(hashes)  # sorted
    del hashes[:]  # the caller's batches: freed before the second pass
    if not len(suspects):
        return
    first: dict[int, Any] = {}  # repeated hash → the first id read with it
    found, times = None, 0      # the first id read again, and how often it occurs
    for rb in transfer.iter_batches(directory, [schema.ID], batch_size=65536):
        column, batch = rb.column(0), _id_hashes(rb.column(0))
        if found is not None:
            times += sum(column[int(i)].as_py() == found[1] for i in np.flatnonzero(batch == found[0]))
            continue
        for i in np.flatnonzero(ids.in_sorted(suspects, batch)):
            h, value = int(batch[i]), column[int(i)].as_py()
            if found is not None:
                times += h == found[0] and value == found[1]
            elif h not in first:
                first[h] = value
            elif first[h] == value:
                found, times = (h, value), 2
                first.clear()
    if found is not None:
        shown = str(found[1]) if len(str(found[1])) <= 100 else str(found[1])[:100] + "…"
        raise UserError(f"{directory}: id {shown} appears {'twice' if times == 2 else f'{times} times'} "
                        f"({len(suspects)} repeated ids); the set was written twice — rescore it into an empty folder")


def iter_texts(transfer_dir: str) -> Iterator[list[str]]:
    """The set's texts (and second texts of pairs), a record batch at a time."""
    for rb in transfer.iter_batches(transfer_dir, [schema.TEXT, schema.TEXT_B], batch_size=8192):
        yield [t for col in (rb.column(0), rb.column(1)) for t in col.to_pylist() if t]


def table_arrays(table: pa.Table, pkd_columns: Sequence[str] = ()) -> dict[str, Any]:
    """Convert one shuffle buffer to numpy once; minibatches index into it.

    `pkd_columns`: the teacher layer behind each student layer, stacked under TEACHER_LAYERS.
    """
    texts_b = table.column(schema.TEXT_B).to_pylist()
    out = {
        schema.TEXT: table.column(schema.TEXT).to_pylist(),
        schema.TEXT_B: texts_b if any(t is not None for t in texts_b) else None,
        schema.LABEL: table.column(schema.LABEL).fill_null(NO_LABEL).to_numpy().astype(np.int64),
    }
    for name in (schema.TEACHER_LOGITS, schema.TEACHER_HIDDEN):
        if name in table.column_names:  # absent when the batches are text only
            out[name] = transfer.fixed_list_to_numpy(table.column(name))
    if pkd_columns:
        out[TEACHER_LAYERS] = np.stack([transfer.fixed_list_to_numpy(table.column(c)) for c in pkd_columns],
                                       axis=1)                                       # (N, L, H)
    return out


def make_batch(tokens, arrays: dict[str, Any], idx: Sequence[int]) -> dict[str, torch.Tensor]:
    """Rows `idx` of `arrays`, tokenized with `tokens` (students.data.tokens) and padded to the longest."""
    texts_b = arrays[schema.TEXT_B]
    texts = [arrays[schema.TEXT][i] for i in idx]
    ids, mask, types = tokens.encode(texts, [texts_b[i] for i in idx] if texts_b is not None else None)
    idx = np.asarray(idx)
    batch = {"ids": ids, "mask": mask, "type_ids": types, schema.TEXT: texts,
             schema.LABEL: torch.from_numpy(arrays[schema.LABEL][idx])}
    for name in (schema.TEACHER_LOGITS, schema.TEACHER_HIDDEN, TEACHER_LAYERS):
        if name in arrays:
            batch[name] = torch.from_numpy(arrays[name][idx])
    return batch


def iter_train_batches(transfer_dir: str, tokens, seed: Union[int, np.random.SeedSequence], *, batch_size: int,
                       shuffle_rows: int, pkd_columns: Sequence[str] = (), labeled_only: bool = False, rank: int = 0,
                       world: int = 1, text_only: bool = False,
                       needs: Optional[Collection[str]] = None) -> Iterator[dict[str, torch.Tensor]]:
    """One epoch of shuffled minibatches of `batch_size` rows, streamed; `seed` is the epoch's shuffle stream.

    With `world` processes, this one (`rank`) keeps every world-th row of the stream (the shards'
    order is drawn from the same seed on every rank): the ranks train on disjoint rows and their
    counts differ by at most one.

    Rows are shuffled within a buffer of `shuffle_rows` (and shards are visited in a shuffled
    order); inside the buffer, rows of similar length share a minibatch (less padding: the
    BiLSTM's cost follows the longest row), and the minibatch order is shuffled again.
    `labeled_only` keeps the rows with a gold label. `text_only`: the batches hold the rows' tokens and gold
    labels and no teacher columns (a set not scored: the phases that need only the teacher run alongside).
    `needs`: the batch keys the phase's losses read (LossWeights.needs; None: all): only those cached columns
    are read; the rows and their order do not depend on it.
    """
    cached = () if text_only else [c for c in TRAIN_COLUMNS[3:] if needs is None or c in needs]
    pkd_columns = pkd_columns if not text_only and (needs is None or TEACHER_LAYERS in needs) else ()
    columns = [*TEXT_COLUMNS, *cached, *(c for c in pkd_columns if c not in cached)]
    # What the batches hold is checked as it is read (a few % of reading; see count_rows for the pass before).
    first = transfer.read_schema(transfer.data_files(transfer_dir)[0])
    num_classes = None if text_only else first.field(schema.TEACHER_LOGITS).type.list_size
    rng = np.random.default_rng(seed)
    shard_rng = random.Random(int(rng.integers(2 ** 63)))
    buffer: list[pa.RecordBatch] = []
    held = seen = 0

    def drain() -> Iterator[dict[str, torch.Tensor]]:
        arrays = table_arrays(pa.Table.from_batches(buffer), pkd_columns)
        n = len(arrays[schema.TEXT])
        order = rng.permutation(n)
        lengths = np.fromiter((len(t) for t in arrays[schema.TEXT]), dtype=np.int64, count=n)
        chunk = batch_size * 32
        batches = []
        for start in range(0, n, chunk):
            part = order[start:start + chunk]
            part = part[np.argsort(lengths[part], kind="stable")]
            batches += [part[i:i + batch_size] for i in range(0, len(part), batch_size)]
        for j in rng.permutation(len(batches)):
            yield make_batch(tokens, arrays, batches[j])

    for rb in transfer.iter_batches(transfer_dir, columns, batch_size=min(shuffle_rows, 8192), rng=shard_rng,
                                    num_classes=num_classes):
        if labeled_only:
            rb = rb.filter(pc.is_valid(rb.column(schema.LABEL)))
        if world > 1:
            first = (rank - seen) % world  # the stream's row `seen` is this batch's row 0
            seen += rb.num_rows
            rb = rb.take(pa.array(np.arange(first, rb.num_rows, world)))
        if rb.num_rows == 0:
            continue
        buffer.append(rb)
        held += rb.num_rows
        if held >= shuffle_rows:
            yield from drain()
            buffer, held = [], 0
    if buffer:
        yield from drain()
