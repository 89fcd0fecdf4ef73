"""Small real teachers and transfer sets for tests, the project's and yours (`from transferset import
testing`); also handy for trying the pipelines quickly.

torch and transformers are imported inside the functions that build models, and nothing here needs a
test framework: importing this module costs what importing transferset costs.

`tiny_classifier` writes a randomly initialised BERT sequence classifier with a WordPiece
tokenizer to a directory through the real `save_pretrained` path, so loading it exercises
exactly what a user's teacher directory goes through.
"""
from __future__ import annotations

import os
import string
from typing import Any, Mapping, Optional, Sequence

WORDS = (
    "the a an and or but of to in on for with is was are be it this that movie film story acting actor plot "
    "good great bad awful terrible fine funny boring dull brilliant not no very too so just more most "
    "i you he she we they one two love hate like best worst ever never all some time life world"
).split()


def write_vocab(path: str, words: Sequence[str] = WORDS) -> str:
    """A WordPiece vocab: special tokens, the given words, single characters and their ## forms."""
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(dict.fromkeys(list(words) + chars))
    tokens += ["##" + c for c in string.ascii_lowercase + string.digits]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(tokens) + "\n")
    return path


def tiny_classifier(directory: str, label_names: Sequence[str] = ("0", "1"), *, hidden_size: int = 32,
                    num_layers: int = 2, num_heads: int = 2, seed: int = 0, max_positions: int = 512,
                    save_pickle: bool = False, initializer_range: float = 0.5) -> str:
    """Write a tiny BertForSequenceClassification + tokenizer to `directory`; returns it.

    With `save_pickle` the weights go to pytorch_model.bin (a pickle) instead of safetensors.
    """
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    os.makedirs(directory, exist_ok=True)
    vocab = write_vocab(os.path.join(directory, "vocab.txt"))
    tokenizer = BertTokenizer(vocab=vocab, do_lower_case=True)  # transformers 5: `vocab`, not `vocab_file`
    config = BertConfig(
        vocab_size=len(open(vocab, encoding="utf-8").read().split("\n")) - 1,
        hidden_size=hidden_size, num_hidden_layers=num_layers, num_attention_heads=num_heads,
        intermediate_size=hidden_size * 2, max_position_embeddings=max_positions,
        num_labels=len(label_names),
        # Default larger than BERT's 0.02 so logits differ visibly between rows (a row swap cannot
        # pass an equivalence test); use 0.02 for a model that is to be trained.
        initializer_range=initializer_range,
        id2label={i: str(n) for i, n in enumerate(label_names)},
        label2id={str(n): i for i, n in enumerate(label_names)},
    )
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config).eval()
    if save_pickle:
        model.config.save_pretrained(directory)
        torch.save(model.state_dict(), os.path.join(directory, "pytorch_model.bin"))
    else:
        model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def transfer_rows(texts: Sequence[str], labels: Optional[Sequence[Optional[int]]] = None,
                  texts_b: Optional[Sequence[Optional[str]]] = None, ops: Optional[Sequence[Sequence[str]]] = None,
                  ids: Optional[Sequence[str]] = None) -> list[dict]:
    """Rows of the transfer-set contract (ids derived from the texts unless given)."""
    from transferset import schema
    from transferset.sources import source_id_for

    rows = []
    for i, text in enumerate(texts):
        b = texts_b[i] if texts_b is not None else None
        sid = source_id_for(text, b)
        rows.append({
            schema.ID: ids[i] if ids is not None else f"{sid}-{i}",
            schema.SOURCE_ID: sid,
            schema.TEXT: text,
            schema.TEXT_B: b,
            schema.OPS: list(ops[i]) if ops is not None else [],
            schema.LABEL: labels[i] if labels is not None else None,
        })
    return rows


def write_transfer_set(directory: str, shards: Sequence[Sequence[dict]], label_names: Sequence[str],
                       extra_metadata: Optional[Mapping[str, Any]] = None, complete: bool = True) -> str:
    """Write row lists as zstd shards under directory/data with the transfer-set schema and metadata.

    `complete` writes the completion marker too, as a finished `augment` run does (readers
    refuse a set without it unless told otherwise).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from transferset import schema

    data = os.path.join(directory, schema.DATA_DIR)
    os.makedirs(data, exist_ok=True)
    sch = schema.transfer_schema(schema.base_metadata(label_names, **dict(extra_metadata or {})))
    for i, rows in enumerate(shards):
        table = pa.Table.from_pylist(list(rows), schema=sch)
        pq.write_table(table, os.path.join(data, f"shard-{i:05d}.parquet"), compression="zstd")
    if complete:
        open(os.path.join(directory, schema.COMPLETE_MARKER), "w").close()
    return directory


def write_scored_set(directory: str, texts: Sequence[str], logits: Any, hidden: Any,
                     label_names: Sequence[str] = ("0", "1"), *, labels: Optional[Sequence[Optional[int]]] = None,
                     ids: Optional[Sequence[str]] = None, shards: int = 2,
                     extra_metadata: Optional[Mapping[str, Any]] = None, complete: bool = True,
                     members: Optional[Sequence[Any]] = None) -> str:
    """A scored transfer set: the rows of `transfer_rows` with teacher columns from `logits` (N, C) and
    `hidden` (N, H), split over `shards` files plus an empty one (as Beam can write).

    `members`: an ensemble's (N, C) logits per member, written as teacher_logits_{k} (`logits` stays the
    target as given)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from transferset import schema

    logits, hidden = np.asarray(logits, dtype=np.float32), np.asarray(hidden, dtype=np.float32)
    rows = transfer_rows(texts, labels, ids=ids)
    sch = schema.scored_schema(len(label_names), hidden.shape[1],
                               metadata=schema.base_metadata(label_names, **dict(extra_metadata or {})),
                               members=len(members or ()))

    def fixed(values, dtype):
        return pa.FixedSizeListArray.from_arrays(pa.array(values.astype(dtype).reshape(-1)), values.shape[1])

    columns = {name: pa.array([r[name] for r in rows], type=sch.field(name).type) for name in rows[0]}
    columns[schema.TEACHER_LABEL] = pa.array(logits.argmax(1), type=pa.int32())
    columns[schema.TEACHER_LOGITS] = fixed(logits, np.float32)
    columns[schema.TEACHER_HIDDEN] = fixed(hidden, np.float16)
    if members is not None and len(members) > 1:
        for k, member in enumerate(members):
            columns[schema.member_logits_column(k)] = fixed(np.asarray(member, dtype=np.float32), np.float32)
    table = pa.Table.from_arrays([columns[f.name] for f in sch], schema=sch)
    data = os.path.join(directory, schema.DATA_DIR)
    os.makedirs(data, exist_ok=True)
    bounds = np.linspace(0, table.num_rows, shards + 1).astype(int)
    for i, (start, stop) in enumerate([*zip(bounds[:-1], bounds[1:]), (0, 0)]):
        pq.write_table(table.slice(start, stop - start), os.path.join(data, f"part-{i:05d}.parquet"),
                       compression="zstd")
    if complete:
        open(os.path.join(directory, schema.COMPLETE_MARKER), "w").close()
    return directory
