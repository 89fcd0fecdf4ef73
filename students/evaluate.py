"""Accuracy of a trained student, or of any Hugging Face sequence classifier (e.g. the teacher), and
agreement with the teacher when the data holds its labels (`transferset evaluate`); of a teacher ensemble
(several models: their logits combined as `transferset score --combine` does) next to each member's; and,
with `by_length`, the same figures per band of input length in words, to see where a student falls behind
its teacher (at full size on SST-2 a distilled BiLSTM matches its teacher on short sentences and loses on
long ones: benchmarks/README.md)."""
from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np

from students.data import NO_LABEL, read_eval_data
from students.student import Student, accuracy
from students.trainer import require_input
from transferset import fs
from transferset.fs.remote import local_teacher
from transferset.sources import DEFAULT_LABEL_COLUMN
from transferset.teacher import ensemble

LENGTH_EDGES = (10, 20, 30)  # words: bands 0-9, 10-19, 20-29, 30+


def check_edges(edges: Sequence[int]) -> tuple[int, ...]:
    """Band edges in words: positive and increasing, or a ValueError that says so."""
    edges = tuple(int(e) for e in edges)
    if not edges or edges[0] < 1 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"length band edges must be positive whole numbers of words in increasing order, e.g. "
                         f"{','.join(map(str, LENGTH_EDGES))}")
    return edges


def words_per_row(texts: Sequence[str], texts_b: Optional[Sequence[Optional[str]]] = None) -> np.ndarray:
    """Whitespace-separated words of each row (both texts of a pair)."""
    second = texts_b if texts_b is not None else [None] * len(texts)
    return np.array([len(a.split()) + (len(b.split()) if b else 0) for a, b in zip(texts, second)], dtype=np.int64)


def length_bands(words: np.ndarray, edges: Sequence[int]) -> list[tuple[str, np.ndarray]]:
    """(name, row mask) of each band: [0, e1), [e1, e2), ..., [e_last, inf); every row in exactly one."""
    bounds = [0, *edges, None]
    out = []
    for lo, hi in zip(bounds, bounds[1:]):
        mask = (words >= lo) & (words < hi) if hi is not None else words >= lo
        out.append((f"{lo}-{hi - 1}" if hi is not None else f"{lo}+", mask))
    return out


def _load(model_path: str, max_length: Optional[int]):
    # A model directory on remote storage is copied once into the local cache.
    return Student.from_pretrained(local_teacher(model_path) if fs.is_remote(model_path) else model_path,
                                   max_length=max_length)


def evaluate(model_path: Union[str, Sequence[str]], data_path: str, *, text_column=None,
             label_column: str = DEFAULT_LABEL_COLUMN, text_b_column=None, batch_size: int = 256,
             max_length: Optional[int] = None, combine: Union[str, int] = "mean",
             speed: Optional[float] = None, by_length: Optional[Sequence[int]] = None) -> dict:
    """{"accuracy", "rows", "labeled_rows", ...} of one model on `data_path`.

    `speed`: a model with early exits (`transferset exits`) lets rows leave at a layer whose branch's
    normalised entropy is below it; "mean_layers" then holds the layers a row ran, on average.

    Several models (a list of more than one): a teacher ensemble, scored as `transferset score` combines
    it (`combine`: mean | probs | a member's index); "members" then holds each member's own figures.

    `by_length` (band edges in words, e.g. LENGTH_EDGES): "by_length" then holds, for each band, its rows,
    labeled rows and the same figures on them (accuracy None in a band without labels).
    """
    require_input(data_path, "--data")
    edges = check_edges(by_length) if by_length is not None else None
    paths = [model_path] if isinstance(model_path, str) else list(model_path)
    how = ensemble.parse_combine(combine, len(paths), "--model")  # no model, or an index out of range: refused first
    models = [_load(p, max_length) for p in paths]
    for m in models:
        m.check_speed(speed)  # before the data is read
    label_names = ensemble.check_members(paths, [m.label_names for m in models])
    data = read_eval_data(data_path, label_names, text_column=text_column, label_column=label_column,
                          text_b_column=text_b_column)
    runs = [m.logits_and_layers(data.texts, data.texts_b, batch_size=batch_size, speed=speed) for m in models]
    logits = [lg for lg, _ in runs]

    def figures(pred, rows=slice(None)) -> dict:
        """Accuracy (and agreement with the teacher's labels) on `rows`: NaN where there is nothing to count."""
        out = {"accuracy": accuracy(pred[rows], data.labels[rows])}
        if data.teacher_labels is not None:
            agree = pred[rows] == data.teacher_labels[rows]
            out["teacher_agreement"] = float(agree.mean()) if agree.size else float("nan")
        return out

    pred = ensemble.combine_logits(logits, how).argmax(-1)
    out = {"data": data_path, "rows": len(data.texts), "labeled_rows": int((data.labels != NO_LABEL).sum()),
           **figures(pred)}
    if edges is not None:
        # a band without a (labeled) row has None for its figures
        out["by_length"] = [{"words": name, "rows": int(mask.sum()),
                             "labeled_rows": int((data.labels[mask] != NO_LABEL).sum()),
                             **{k: None if np.isnan(v) else v for k, v in figures(pred, mask).items()}}
                            for name, mask in length_bands(words_per_row(data.texts, data.texts_b), edges)]
    if len(paths) == 1 and models[0].exits is not None:
        out["speed"] = float(models[0].speed or 0.0) if speed is None else float(speed)  # None: the folder's own
        out["mean_layers"] = float(runs[0][1].mean()) if len(data.texts) else float("nan")
    if len(paths) > 1:
        out["combine"] = how
        out["members"] = [{"model": p, **figures(l.argmax(-1))} for p, l in zip(paths, logits)]
    return out

