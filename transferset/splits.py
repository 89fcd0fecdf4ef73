"""Data preparation for a run: which train rows are labeled, which become unlabeled text, and which
are held out as the validation split that every choice (early stopping, the teacher's best epoch) uses.

`split_data` writes labeled.jsonl, unlabeled.jsonl and, with `validation`, validation.jsonl from one
labeled train file. The validation rows are drawn first (seeded), so they are disjoint from both
pools; a pool row whose text equals a validation sentence (SST-2 repeats many phrases) is left out
too, so neither the teacher nor the transfer set sees a validation sentence.
"""
from __future__ import annotations

import json
from typing import Optional

import numpy as np

from transferset import fs
from transferset.config import RunConfig
from transferset.errors import UserError
from transferset.sources import Example, SourceSpec, infer_label_names, normalize_text, read_source

LABELED_FILE = "labeled.jsonl"
UNLABELED_FILE = "unlabeled.jsonl"
VALIDATION_FILE = "validation.jsonl"
SPLIT_STATS_FILE = "split.json"


def _write_jsonl(path: str, rows) -> int:
    n = 0
    with fs.open(path, "wb") as fh:
        for row in rows:
            fh.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
            n += 1
    return n


def carve_validation(rows: list[Example], n: int, seed: int) -> tuple[list[int], list[int], int]:
    """(validation indices, pool indices in file order, pool rows dropped as copies of a validation text)."""
    if n >= len(rows):
        raise UserError(f"validation.rows = {n}, but train has only {len(rows)} accepted rows: "
                        "carve fewer rows, or give a labeled test file instead")
    rng = np.random.default_rng(seed)
    chosen = sorted(int(i) for i in rng.choice(len(rows), size=n, replace=False))
    held = {normalize_text(rows[i].text) for i in chosen}
    taken = set(chosen)
    pool = [i for i in range(len(rows)) if i not in taken]
    kept = [i for i in pool if normalize_text(rows[i].text) not in held]
    return chosen, kept, len(pool) - len(kept)


def split_data(train: str, out_dir: str, cfg: RunConfig) -> dict[str, Optional[str]]:
    """labeled/unlabeled (and validation) JSONL files from `train`, as the run's settings say.

    validation: `rows` train rows (seeded) held out first. Then, on the rest: lowres: k rows per
    class (seeded), the rest with labels dropped; otherwise the first `labeled_limit` rows, then the
    next `unlabeled_rows` rows (-1: all) with labels dropped. Returns the paths and writes split.json
    with the row counts.
    """
    labels = infer_label_names(train, opener=fs.open)
    rows = [r for r in read_source(SourceSpec(path=train, label_names=labels), opener=fs.open)
            if isinstance(r, Example)]
    validation_idx: list[int] = []
    dropped_copies = 0
    pool = list(range(len(rows)))
    if cfg.validation is not None:
        validation_idx, pool, dropped_copies = carve_validation(rows, cfg.validation.rows, cfg.validation.seed)
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
    fs.makedirs(out_dir)
    paths: dict[str, Optional[str]] = {"labeled": fs.join(out_dir, LABELED_FILE),
                                       "unlabeled": fs.join(out_dir, UNLABELED_FILE), "validation": None}
    _write_jsonl(paths["labeled"], ({"text": rows[i].text, "label": labels[rows[i].label]} for i in labeled_idx))
    _write_jsonl(paths["unlabeled"], ({"text": rows[i].text} for i in rest))
    if validation_idx:
        paths["validation"] = fs.join(out_dir, VALIDATION_FILE)
        _write_jsonl(paths["validation"],
                     ({"text": rows[i].text, "label": labels[rows[i].label]} for i in validation_idx))
    fs.write_json(fs.join(out_dir, SPLIT_STATS_FILE),
                  {"train": train, "train_rows": len(rows), "labeled_rows": len(labeled_idx),
                   "unlabeled_rows": len(rest), "validation_rows": len(validation_idx),
                   "pool_rows_dropped_as_validation_copies": dropped_copies, "label_names": list(labels)},
                  indent=2)
    return paths
