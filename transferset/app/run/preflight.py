"""What `transferset run` checks in its data and given teachers before the first stage.

Each of these used to surface only after stages had run (the teacher trained, the set augmented and scored):
a text column that is the label column, a train file with one class (with integer labels a two-class model
trained on it and reported 100 %), a dev or test label the train file never has (found by the test stage, after
every student), a given teacher folder whose weights are pickles or that ships its own code (found by the score
stage), more gradient-accumulation batches than the teacher's epoch has. One pass over the labels of each
local data file, with the readers the stages use, decides them up front: one line, exit 2, nothing written.
"""
from __future__ import annotations

import functools
import math
import os
from typing import Optional

from transferset import fs
from transferset.app.stages.context import DataFiles, splits_train
from transferset.config import RunConfig
from transferset.contract import labels, schema
from transferset.models import loading
from transferset.runtime.errors import ConfigError
from transferset.sources import HF_PREFIX, label_counts


def check_run(cfg: RunConfig, files: DataFiles) -> None:
    """Every check of this module, cheapest first (ConfigError: exit 2, before any output is written)."""
    check_columns_differ(cfg)
    check_given_teachers(cfg)
    check_labels(cfg, files)


def check_columns_differ(cfg: RunConfig) -> None:
    """The text columns and the label column of the teacher: and augment: sections are different columns."""
    for section in ("teacher", "augment"):
        s = getattr(cfg, section)
        for key in ("text_column", "text_b_column"):
            if getattr(s, key) is not None and getattr(s, key) == s.label_column:
                raise ConfigError(f"{section}.{key} and {section}.label_column are both {s.label_column!r} "
                                  "(--text-column and --label-column): the text and the label are two columns of "
                                  "the file; name each one")


def check_given_teachers(cfg: RunConfig) -> None:
    """A `teacher_path` or `teacher_paths` folder holds a model the score stage will load: refused up front as
    `teacher.model` is (pickle weights without score.allow_pickle, an auto_map without score.trust_remote_code)."""
    key = "teacher_paths" if cfg.teacher_paths else "teacher_path"
    for path in cfg.teacher_paths or ([cfg.teacher_path] if cfg.teacher_path else []):
        if fs.is_remote(path):
            continue  # copied when loaded, and checked then
        try:
            loading.check_model(path, what=key, allow_pickle=cfg.score.allow_pickle,
                                trust_remote_code=cfg.score.trust_remote_code,
                                remedy="set score.trust_remote_code=true only for a model you trust")
        except loading.TeacherLoadError as exc:
            raise ConfigError(f"{key}={path}: {exc}") from None


def _counts(path: str, column: str, limit: Optional[int] = None) -> dict[str, int]:
    """label_counts of a file, read once per process while its size and modification time stay (a test
    session runs many runs on SST-2's 67,349 rows: two seconds each)."""
    stamp = (os.stat(path).st_mtime_ns if os.path.exists(path) else None, fs.size(path))
    return _cached_counts(path, column, limit, stamp)


@functools.lru_cache(maxsize=16)
def _cached_counts(path: str, column: str, limit: Optional[int], stamp: tuple) -> dict[str, int]:
    return label_counts(path, column, fs.open, limit)


def _local(path: Optional[str]) -> bool:
    return bool(path) and not path.startswith(HF_PREFIX)


def check_labels(cfg: RunConfig, files: DataFiles) -> None:
    """The train file holds two classes or more, every label of the dev and test files is one of the teacher's,
    and the teacher's epoch has at least `grad_accum` batches. Hub datasets are the stages' to read."""
    if not _local(files.train):
        return
    column = cfg.teacher.label_column
    limit = None if splits_train(cfg) else cfg.labeled_limit
    counts = _counts(files.train, column, limit)
    where = f"data: {files.train}" + (f" (its first {limit} rows, labeled_limit)" if limit else "")
    if not counts:
        raise ConfigError(f"{where}: no label in column {column!r}; name the label column with --label-column")
    if len(counts) < 2:
        (only, rows), = counts.items()
        raise ConfigError(f"{where}: every labeled row is of one class ({only!r}, {rows:,} rows) in column "
                          f"{column!r}: a classifier needs two classes or more; check --label-column, or add the "
                          "other classes' rows")
    names = cfg.teacher.labels or _names(counts)
    for key, path in (("dev", files.dev), ("test", files.test)):
        if _local(path):
            _check_known(key, path, cfg.augment.label_column, names, files.train)
    _check_grad_accum(cfg, sum(counts.values()))


def _names(counts: dict[str, int]) -> tuple[str, ...]:
    """The label set the teacher infers from these labels (sources.infer_label_names): 0..max for integers."""
    indices = [labels.index_of(v) for v in counts]
    if all(i is not None for i in indices):
        return tuple(str(i) for i in range(max(indices) + 1))
    return tuple(sorted(counts))


def _check_known(key: str, path: str, column: str, names: tuple[str, ...], train: str) -> None:
    unseen = sorted(v for v in _counts(path, column) if labels.parse(v, names) is None)
    if unseen:
        raise ConfigError(f"{key}: {path} has label(s) {schema.cut(unseen, 200)} that the train file {train} never "
                          f"has (the teacher's labels: {schema.cut(list(names), 200)}), so no model can predict "
                          f"them; check that {key} and data are the same task and --label-column")


def _check_grad_accum(cfg: RunConfig, rows: int) -> None:
    """The teacher's gradient accumulation fits in its epoch: at most these rows train it (a split takes fewer,
    which the training itself checks)."""
    batches = math.ceil(rows / cfg.teacher.batch_size)
    if cfg.teacher_path is None and not cfg.teacher_paths and cfg.teacher.engine.grad_accum > batches:
        raise ConfigError(f"teacher.engine.grad_accum {cfg.teacher.engine.grad_accum} exceeds the {batches} "
                          f"batches of an epoch ({rows:,} rows of batch_size {cfg.teacher.batch_size}): one "
                          f"optimizer step per epoch; lower grad_accum to {batches} or less")
