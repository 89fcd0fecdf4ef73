"""Data preparation for a run: which train rows are labeled, which become unlabeled text, and which
are held out as the validation split that every choice (early stopping, the teacher's best epoch) uses.

`split_data` writes labeled.jsonl, unlabeled.jsonl and, with `validation`, validation.jsonl from one
labeled train file. The validation rows are drawn first (seeded), so they are disjoint from both
pools; a pool row whose text equals a validation sentence (SST-2 repeats many phrases) is left out
too, and by default (`validation.by: sentence`) the validation rows are whole sentences (rows no
other row contains) and every pool row inside one of them is left out as well, so neither the
teacher nor the transfer set sees a validation sentence or a part of one.

Every line of the train file is accounted for in split.json: kept (validation, labeled, unlabeled, rest, or
left out of the pools as a copy or a phrase of a validation row) or rejected, with its reason, in
rejects.jsonl beside the split files.
"""
from __future__ import annotations

import json
import logging
import math
from collections import Counter, defaultdict
from typing import NamedTuple, Optional, Sequence

import numpy as np

from transferset import fs
from transferset.config import RunConfig
from transferset.runtime.errors import UserError
from transferset.sources import (Example, Reject, SourceSpec, infer_label_names, normalize_text, read_source,
                                 summarize_rejects)

LABELED_FILE = "labeled.jsonl"
UNLABELED_FILE = "unlabeled.jsonl"
VALIDATION_FILE = "validation.jsonl"
REST_FILE = "rest.jsonl"  # the pool's rows neither labeled nor unlabeled: a student's `layer_texts: rest`
SPLIT_STATS_FILE = "split.json"
REJECTS_FILE = "rejects.jsonl"  # the train rows that could not be read, each with its reason

# validation.rows: auto: AUTO_SHARE of the accepted rows, raised toward AUTO_PER_CLASS rows per class but
# never above AUTO_MAX_SHARE of them, at most AUTO_CAP (early stopping needs a few hundred rows, not more)
AUTO_SHARE, AUTO_PER_CLASS, AUTO_MAX_SHARE, AUTO_CAP = 0.10, 5, 0.20, 2000

logger = logging.getLogger("transferset")


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




class Carve(NamedTuple):
    validation: list[int]  # the held-out rows' indices, in file order
    pool: list[int]  # the rows the pools may take, in file order
    copies: int  # pool rows left out: their text is a validation row's
    phrases: int  # pool rows left out: inside a validation row (by: sentence)
    stratified: bool  # drawn class by class


def auto_rows(n_rows: int, n_classes: int) -> int:
    """validation.rows = auto for `n_rows` accepted rows over `n_classes` classes (see AUTO_SHARE)."""
    per_class = min(AUTO_PER_CLASS * n_classes, int(n_rows * AUTO_MAX_SHARE))
    return min(AUTO_CAP, max(math.ceil(n_rows * AUTO_SHARE), per_class))


def validation_rows(rows: Sequence[Example], setting) -> int:
    """The rows to carve: `setting`, or auto_rows for `auto`; a file too small for any carve is refused."""
    if setting != "auto":
        return setting
    classes = len({r.label for r in rows})
    if len(rows) < 2 * classes:
        raise UserError(f"validation.rows = auto: train has {len(rows)} accepted rows over {classes} classes, "
                        "too few to carve a validation split from (at least 2 rows per class): give a labeled "
                        "selection file instead (--dev FILE, or dev: FILE)")
    return auto_rows(len(rows), classes)


def carve_validation(rows: list[Example], n: int, seed: int, by: str = "sentence",
                     stratify: Optional[bool] = None, at_most: bool = False) -> Carve:
    """The validation rows and the pool the rest leave (ValidationConfig's settings; `at_most`: fewer than
    `n` rows will do, for validation.rows = auto, when train has fewer that qualify).

    by="row": any `n` rows (seeded); pool rows whose text equals a validation text are dropped (copies).
    by="sentence": the rows are drawn in the same seeded order among rows that no other train row
    contains, and pool rows contained in a validation text are dropped too (phrases). SST-2's train
    file holds phrases of its sentences as rows of their own: drawn by row, a quarter of the validation
    rows sit inside longer train rows, so validation rewards memorising them, and validation rows
    are phrases (9 words on average) while the test sentences are whole (19).
    stratify: see ValidationConfig; the seeded draw over all rows is tried first unless it is True, so
    a carve that already serves every class stays the one every earlier run made.
    """
    if n >= len(rows):
        raise UserError(f"validation.rows = {n}, but train has only {len(rows)} accepted rows: "
                        "carve fewer rows (validation.rows: auto fits the file), or give a labeled selection file "
                        "instead (--dev FILE, or dev: FILE)")
    texts = [_padded(r.text) for r in rows]  # normalized once, for every comparison below
    if stratify is not True:
        carve = _left_out(texts, _seeded(texts, n, seed, by, at_most), by, stratified=False)
        if stratify is False or _serves_every_class(rows, carve, n):
            return carve
    carve = _left_out(texts, _stratified(rows, texts, n, seed, by, at_most), by, stratified=True)
    empty = sorted(set(r.label for r in rows) - {rows[i].label for i in carve.pool})
    if empty:  # every row of theirs that validation did not take is a phrase of a validation sentence
        logger.warning("validation carve: class(es) %s keep no train row (their rows are inside validation "
                       "sentences); set validation.by: row to keep them", empty)
    return carve


def _seeded(texts: Sequence[str], n: int, seed: int, by: str, at_most: bool) -> list[int]:
    """The seeded draw over all rows: `n` of them, or `n` whole sentences."""
    rng = np.random.default_rng(seed)
    if by == "row":
        return sorted(int(i) for i in rng.choice(len(texts), size=n, replace=False))
    chosen = sorted(_sentences(texts, rng.permutation(len(texts)), n))
    if len(chosen) < n and not (at_most and chosen):
        raise UserError(f"validation.rows = {n}, but train holds only {len(chosen)} rows that no other "
                        "row contains (whole sentences): carve fewer rows, or set validation.by: row")
    return chosen


def _left_out(texts: Sequence[str], chosen: list[int], by: str, stratified: bool) -> Carve:
    """The carve of `chosen`: the pool without them, their copies and (by sentence) the rows inside them."""
    held = {texts[i] for i in chosen}
    taken = set(chosen)
    pool = [i for i in range(len(texts)) if i not in taken]
    kept = [i for i in pool if texts[i] not in held]
    copies, phrases = len(pool) - len(kept), 0
    if by == "sentence":
        sentences = sorted(held)
        index = _word_index(sentences)
        inside = [i for i in kept if _inside_any(texts[i], sentences, index)]
        phrases = len(inside)
        kept = sorted(set(kept) - set(inside))
    return Carve(chosen, kept, copies, phrases, stratified)


def _serves_every_class(rows: Sequence[Example], carve: Carve, n: int) -> bool:
    """Every class keeps a pool row and, when validation has a row for each class, every class of 2 rows
    or more has one in it."""
    total = Counter(r.label for r in rows)
    pooled = Counter(rows[i].label for i in carve.pool)
    held = Counter(rows[i].label for i in carve.validation)
    if any(pooled[c] == 0 for c in total):
        return False
    return n < len(total) or all(held[c] > 0 for c, k in total.items() if k >= 2)


def _stratified(rows: Sequence[Example], texts: Sequence[str], n: int, seed: int, by: str,
                at_most: bool) -> list[int]:
    """`n` rows, each class's share of them (_quotas), each class's drawn in the seeded order."""
    order = [int(i) for i in np.random.default_rng(seed).permutation(len(rows))]
    if by == "sentence":
        whole = set(_sentences(texts, np.array(order), len(rows)))
        order = [i for i in order if i in whole]
    of_class: dict[int, list[int]] = defaultdict(list)
    for i in order:
        of_class[rows[i].label].append(i)
    total = Counter(r.label for r in rows)
    classes = sorted(total)
    quota = _quotas([total[c] for c in classes], [len(of_class[c]) for c in classes], n, at_most)
    return sorted(i for c, q in zip(classes, quota) for i in of_class[c][:q])


def _quotas(total: Sequence[int], available: Sequence[int], n: int, at_most: bool) -> list[int]:
    """Validation rows per class: proportional to its rows (largest remainders), at least one where every
    class can have one, never all of a class's rows, at most its `available` rows."""
    caps = np.minimum(np.asarray(available), np.asarray(total) - 1)
    room = int(caps.sum())
    if room < n:
        if not (at_most and room):
            raise UserError(f"validation.rows = {n}, but a carve that leaves every class a train row can hold "
                            f"out at most {room} rows here: carve fewer rows, or give a labeled selection file")
        n = room
    share = n * np.asarray(total, dtype=float) / sum(total)
    floor = np.minimum(caps, 1) if n >= int((caps > 0).sum()) else np.zeros_like(caps)
    q = np.maximum(np.minimum(np.floor(share).astype(int), caps), floor)
    while q.sum() > n:  # the floor of one per class went over: take from the classes most above their share
        q[int(np.argmax(np.where(q > floor, q - share, -np.inf)))] -= 1
    while q.sum() < n:
        q[int(np.argmax(np.where(q < caps, share - q, -np.inf)))] += 1
    return [int(x) for x in q]


def _read_train(train: str, labels: tuple[str, ...], cfg: RunConfig) -> tuple[list[Example], list[Reject]]:
    spec = SourceSpec(path=train, label_names=labels, text_column=cfg.augment.text_column,
                      label_column=cfg.augment.label_column)
    rows: list[Example] = []
    rejects: list[Reject] = []
    for rec in read_source(spec, opener=fs.open):
        (rows if isinstance(rec, Example) else rejects).append(rec)
    if not rows:
        raise UserError(summarize_rejects(train, rejects))
    if rejects:
        first = rejects[0]
        logger.warning("%s: %d of %d rows rejected, each with its reason in %s (first: line %d: %s)", train,
                       len(rejects), len(rows) + len(rejects), REJECTS_FILE, first.line, first.reason)
    return rows, rejects


def _labeled_and_unlabeled(train: str, rows: list[Example], labels: tuple[str, ...], pool: list[int],
                           cfg: RunConfig) -> tuple[list[int], list[int], list[int]]:
    """(labeled, unlabeled, rest) indices of the pool, as lowres or labeled_limit and unlabeled_rows say."""
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
    return labeled_idx, rest, [i for i in pool if i not in used]  # left: validation-free like the others


def split_data(train: str, out_dir: str, cfg: RunConfig) -> dict[str, Optional[str]]:
    """labeled/unlabeled (and validation) JSONL files from `train`, as the run's settings say.

    validation: `rows` train rows (seeded) held out first. Then, on the rest: lowres: k rows per
    class (seeded), the rest with labels dropped; otherwise the first `labeled_limit` rows, then the
    next `unlabeled_rows` rows (-1: all) with labels dropped. The pool's rows left over go to rest.jsonl
    (with their labels, which nothing that reads them uses: the text of a student's `layer_texts: rest`).
    The rows that cannot be read go to rejects.jsonl with their reasons. Returns the paths and writes
    split.json with the row counts: input_rows = train_rows (accepted) + rejected_rows.
    """
    # read with the run's columns, and written under the same names, so every stage reads the split files as
    # it reads the dev and test files
    text_key, label_key = cfg.augment.text_column or "text", cfg.augment.label_column
    labels = infer_label_names(train, label_column=label_key, opener=fs.open)
    rows, rejects = _read_train(train, labels, cfg)
    carve = Carve([], list(range(len(rows))), 0, 0, False)
    if cfg.validation is not None:
        v = cfg.validation
        carve = carve_validation(rows, validation_rows(rows, v.rows), v.seed, v.by, v.stratify,
                                 at_most=v.rows == "auto")
    labeled_idx, rest, left = _labeled_and_unlabeled(train, rows, labels, carve.pool, cfg)
    fs.makedirs(out_dir)

    def labeled_rows(idx: list[int]):
        return ({text_key: rows[i].text, label_key: labels[rows[i].label]} for i in idx)

    paths: dict[str, Optional[str]] = {name: fs.join(out_dir, file) for name, file in (
        ("labeled", LABELED_FILE), ("unlabeled", UNLABELED_FILE), ("rest", REST_FILE), ("rejects", REJECTS_FILE))}
    _write_jsonl(paths["labeled"], labeled_rows(labeled_idx))
    _write_jsonl(paths["unlabeled"], ({text_key: rows[i].text} for i in rest))
    _write_jsonl(paths["rest"], labeled_rows(left))
    _write_jsonl(paths["rejects"], (r.to_dict() for r in rejects))
    paths["validation"] = fs.join(out_dir, VALIDATION_FILE) if carve.validation else None
    if carve.validation:
        _write_jsonl(paths["validation"], labeled_rows(carve.validation))
    fs.write_json(fs.join(out_dir, SPLIT_STATS_FILE),
                  {"train": train, "input_rows": len(rows) + len(rejects), "train_rows": len(rows),
                   "rejected_rows": len(rejects), "rejects": REJECTS_FILE,
                   "first_rejects": [r.to_sample() for r in rejects[:5]],
                   "labeled_rows": len(labeled_idx), "unlabeled_rows": len(rest), "rest_rows": len(left),
                   "validation_rows": len(carve.validation), "validation_stratified": carve.stratified,
                   "pool_rows_dropped_as_validation_copies": carve.copies,
                   "pool_rows_dropped_inside_validation_rows": carve.phrases, "label_names": list(labels)},
                  indent=2)
    return paths
