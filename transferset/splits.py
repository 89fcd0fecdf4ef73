"""Data preparation for a run: which train rows are labeled, which become unlabeled text, and which
are held out as the validation split that every choice (early stopping, the teacher's best epoch) uses.

`split_data` writes labeled.jsonl, unlabeled.jsonl and, with `validation`, validation.jsonl from one
labeled train file. The validation rows are drawn first (seeded), so they are disjoint from both
pools; a pool row whose text equals a validation sentence (SST-2 repeats many phrases) is left out
too, and by default (`validation.by: sentence`) the validation rows are whole sentences (rows no
other row contains) and every pool row inside one of them is left out as well, so neither the
teacher nor the transfer set sees a validation sentence or a part of one.
"""
from __future__ import annotations

import json
from collections import defaultdict
from typing import Optional, Sequence

import numpy as np

from transferset import fs
from transferset.config import RunConfig
from transferset.errors import UserError
from transferset.sources import Example, SourceSpec, infer_label_names, normalize_text, read_source

LABELED_FILE = "labeled.jsonl"
UNLABELED_FILE = "unlabeled.jsonl"
VALIDATION_FILE = "validation.jsonl"
REST_FILE = "rest.jsonl"  # the pool's rows neither labeled nor unlabeled: a student's `layer_texts: rest`
SPLIT_STATS_FILE = "split.json"


def _write_jsonl(path: str, rows) -> int:
    n = 0
    with fs.open(path, "wb") as fh:
        for row in rows:
            fh.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
            n += 1
    return n


def _padded(text: str) -> str:
    # word-bounded containment on normalized texts: " a b " occurs in " x a b y " but not in " x ab y "
    return f" {normalize_text(text)} "


def _word_index(texts: Sequence[str]) -> dict[str, list[int]]:
    """word → the indices of the texts that hold it: a text inside another holds all its words, so the
    rows to search are those of its rarest word (not all rows: a scan per row is minutes on 67k rows)."""
    index: dict[str, list[int]] = defaultdict(list)
    for i, text in enumerate(texts):
        for word in set(text.split()):
            index[word].append(i)
    return index


def _inside_any(text: str, texts: Sequence[str], index: dict[str, list[int]]) -> list[int]:
    """The indices of `texts` that contain `text` (word-bounded, itself and its copies included)."""
    words = set(text.split())
    if not words or any(w not in index for w in words):
        return []
    rarest = min(words, key=lambda w: len(index[w]))
    return [j for j in index[rarest] if text in texts[j]]


def _sentences(texts: Sequence[str], order: np.ndarray, n: int) -> list[int]:
    """The first `n` rows of `order` whose text no other train row contains (its exact copies aside)."""
    index = _word_index(texts)
    chosen: list[int] = []
    seen: set[str] = set()
    for i in order:
        text = texts[int(i)]
        if text in seen:  # a copy of a row already held out: it would be dropped from the pools anyway
            continue
        seen.add(text)
        if text.strip() and all(texts[j] == text for j in _inside_any(text, texts, index)):
            chosen.append(int(i))
            if len(chosen) == n:
                break
    return chosen


def carve_validation(rows: list[Example], n: int, seed: int,
                     by: str = "sentence") -> tuple[list[int], list[int], dict[str, int]]:
    """(validation indices, pool indices in file order, pool rows dropped: {"copies": ..., "phrases": ...}).

    by="row": any `n` rows (seeded); pool rows whose text equals a validation text are dropped (copies).
    by="sentence": the rows are drawn in the same seeded order among rows that no other train row
    contains, and pool rows contained in a validation text are dropped too (phrases). SST-2's train
    file holds phrases of its sentences as rows of their own: drawn by row, a quarter of the validation
    rows sit inside longer train rows, so validation rewards memorising them, and validation rows
    are phrases (9 words on average) while the test sentences are whole (19).
    """
    if n >= len(rows):
        raise UserError(f"validation.rows = {n}, but train has only {len(rows)} accepted rows: "
                        "carve fewer rows, or give a labeled test file instead")
    rng = np.random.default_rng(seed)
    texts = [_padded(r.text) for r in rows]  # normalized once, for every comparison below
    if by == "row":
        chosen = sorted(int(i) for i in rng.choice(len(rows), size=n, replace=False))
    else:
        chosen = sorted(_sentences(texts, rng.permutation(len(rows)), n))
        if len(chosen) < n:
            raise UserError(f"validation.rows = {n}, but train holds only {len(chosen)} rows that no other "
                            "row contains (whole sentences): carve fewer rows, or set validation.by: row")
    held = {texts[i] for i in chosen}
    taken = set(chosen)
    pool = [i for i in range(len(rows)) if i not in taken]
    kept = [i for i in pool if texts[i] not in held]
    dropped = {"copies": len(pool) - len(kept), "phrases": 0}
    if by == "sentence":
        sentences = sorted(held)
        index = _word_index(sentences)
        inside = [i for i in kept if _inside_any(texts[i], sentences, index)]
        dropped["phrases"] = len(inside)
        kept = sorted(set(kept) - set(inside))
    return chosen, kept, dropped


def split_data(train: str, out_dir: str, cfg: RunConfig) -> dict[str, Optional[str]]:
    """labeled/unlabeled (and validation) JSONL files from `train`, as the run's settings say.

    validation: `rows` train rows (seeded) held out first. Then, on the rest: lowres: k rows per
    class (seeded), the rest with labels dropped; otherwise the first `labeled_limit` rows, then the
    next `unlabeled_rows` rows (-1: all) with labels dropped. The pool's rows left over go to rest.jsonl
    (with their labels, which nothing that reads them uses: the text of a student's `layer_texts: rest`).
    Returns the paths and writes split.json with the row counts.
    """
    # read with the run's columns, and written under the same names, so every stage reads the split files as
    # it reads the dev and test files
    text_key, label_key = cfg.augment.text_column or "text", cfg.augment.label_column
    labels = infer_label_names(train, label_column=label_key, opener=fs.open)
    rows = [r for r in read_source(SourceSpec(path=train, label_names=labels, text_column=cfg.augment.text_column,
                                              label_column=label_key), opener=fs.open)
            if isinstance(r, Example)]
    validation_idx: list[int] = []
    dropped = {"copies": 0, "phrases": 0}
    pool = list(range(len(rows)))
    if cfg.validation is not None:
        validation_idx, pool, dropped = carve_validation(rows, cfg.validation.rows, cfg.validation.seed,
                                                         cfg.validation.by)
    if cfg.lowres is not None:
        rng = np.random.default_rng(cfg.lowres.seed)
        chosen: set[int] = set()
        for c in range(len(labels)):
            idx = [i for i in pool if rows[i].label == c]
            if len(idx) < cfg.lowres.per_class:
                raise UserError(f"{train}: only {len(idx)} rows of class {labels[c]!r}, "
                                f"lowres asks for {cfg.lowres.per_class}")
            chosen.update(int(i) for i in rng.choice(idx, size=cfg.lowres.per_class, replace=False))
        labeled_idx = sorted(chosen)
        rest = [i for i in pool if i not in chosen]
    else:
        n = cfg.labeled_limit or len(pool)
        labeled_idx = pool[:n]
        m = len(pool) - n if cfg.unlabeled_rows in (None, -1) else cfg.unlabeled_rows
        rest = pool[n:n + max(0, m)]
    if cfg.unlabeled_limit is not None:
        rest = rest[:cfg.unlabeled_limit]
    used = set(labeled_idx) | set(rest)
    left = [i for i in pool if i not in used]  # neither labeled nor unlabeled, validation-free like them
    fs.makedirs(out_dir)
    paths: dict[str, Optional[str]] = {"labeled": fs.join(out_dir, LABELED_FILE),
                                       "unlabeled": fs.join(out_dir, UNLABELED_FILE), "validation": None}
    _write_jsonl(paths["labeled"], ({text_key: rows[i].text, label_key: labels[rows[i].label]} for i in labeled_idx))
    _write_jsonl(paths["unlabeled"], ({text_key: rows[i].text} for i in rest))
    paths["rest"] = fs.join(out_dir, REST_FILE)
    _write_jsonl(paths["rest"], ({text_key: rows[i].text, label_key: labels[rows[i].label]} for i in left))
    if validation_idx:
        paths["validation"] = fs.join(out_dir, VALIDATION_FILE)
        _write_jsonl(paths["validation"],
                     ({text_key: rows[i].text, label_key: labels[rows[i].label]} for i in validation_idx))
    fs.write_json(fs.join(out_dir, SPLIT_STATS_FILE),
                  {"train": train, "train_rows": len(rows), "labeled_rows": len(labeled_idx),
                   "unlabeled_rows": len(rest), "rest_rows": len(left), "validation_rows": len(validation_idx),
                   "pool_rows_dropped_as_validation_copies": dropped["copies"],
                   "pool_rows_dropped_inside_validation_rows": dropped["phrases"], "label_names": list(labels)},
                  indent=2)
    return paths
