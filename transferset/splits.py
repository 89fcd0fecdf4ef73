"""Data preparation for a run: which train rows are labeled, which become unlabeled text.

`split_data` writes labeled.jsonl and unlabeled.jsonl from one labeled train file, as the run's
settings say (`lowres`, or `labeled_limit` + `unlabeled_rows`).
"""
from __future__ import annotations

import json

import numpy as np

from transferset import fs
from transferset.config import RunConfig
from transferset.errors import UserError
from transferset.sources import Example, SourceSpec, infer_label_names, read_source


def _write_jsonl(path: str, rows) -> int:
    n = 0
    with fs.open(path, "wb") as fh:
        for row in rows:
            fh.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
            n += 1
    return n


def split_data(train: str, out_dir: str, cfg: RunConfig) -> tuple[str, str]:
    """labeled.jsonl and unlabeled.jsonl from `train`, as `lowres` or `labeled_limit` + `unlabeled_rows` say.

    lowres: k rows per class (seeded), the rest of train with labels dropped. Otherwise: the
    first `labeled_limit` rows, then the next `unlabeled_rows` rows (-1: all) with labels dropped.
    """
    labels = infer_label_names(train, opener=fs.open)
    rows = [r for r in read_source(SourceSpec(path=train, label_names=labels), opener=fs.open)
            if isinstance(r, Example)]
    if cfg.lowres is not None:
        rng = np.random.default_rng(cfg.lowres.seed)
        chosen: set[int] = set()
        for c in range(len(labels)):
            idx = [i for i, r in enumerate(rows) if r.label == c]
            if len(idx) < cfg.lowres.per_class:
                raise UserError(f"{train}: only {len(idx)} rows of class {labels[c]!r}, "
                                f"lowres asks for {cfg.lowres.per_class}")
            chosen.update(int(i) for i in rng.choice(idx, size=cfg.lowres.per_class, replace=False))
        labeled_idx = sorted(chosen)
        rest = [i for i in range(len(rows)) if i not in chosen]
    else:
        n = cfg.labeled_limit or len(rows)
        labeled_idx = list(range(min(n, len(rows))))
        m = len(rows) - n if cfg.unlabeled_rows in (None, -1) else cfg.unlabeled_rows
        rest = list(range(n, min(len(rows), n + max(0, m))))
    if cfg.unlabeled_limit is not None:
        rest = rest[:cfg.unlabeled_limit]
    labeled = fs.join(out_dir, "labeled.jsonl")
    unlabeled = fs.join(out_dir, "unlabeled.jsonl")
    _write_jsonl(labeled, ({"text": rows[i].text, "label": labels[rows[i].label]} for i in labeled_idx))
    _write_jsonl(unlabeled, ({"text": rows[i].text} for i in rest))
    return labeled, unlabeled
