"""Accuracy of a trained student, or of any Hugging Face sequence classifier (e.g. the teacher), and
agreement with the teacher when the data holds its labels (`transferset evaluate`); of a teacher ensemble
(several models: their logits combined as `transferset score --combine` does) next to each member's."""
from __future__ import annotations

from typing import Optional, Sequence, Union

from students.data import read_eval_data
from students.losses import NO_LABEL
from students.student import Student, accuracy
from students.trainer import require_input
from transferset import fs
from transferset.fs.remote import local_teacher
from transferset.sources import DEFAULT_LABEL_COLUMN
from transferset.teacher import ensemble


def _load(model_path: str, max_length: Optional[int]):
    # A model directory on remote storage is copied once into the local cache.
    return Student.from_pretrained(local_teacher(model_path) if fs.is_remote(model_path) else model_path,
                                   max_length=max_length)


def evaluate(model_path: Union[str, Sequence[str]], data_path: str, *, text_column=None,
             label_column: str = DEFAULT_LABEL_COLUMN, text_b_column=None, batch_size: int = 256,
             max_length: Optional[int] = None, combine: Union[str, int] = "mean",
             speed: Optional[float] = None) -> dict:
    """{"accuracy", "rows", "labeled_rows", ...} of one model on `data_path`.

    `speed`: a model with early exits (`transferset exits`) lets rows leave at a layer whose branch's
    normalised entropy is below it; "mean_layers" then holds the layers a row ran, on average.

    Several models (a list of more than one): a teacher ensemble, scored as `transferset score` combines
    it (`combine`: mean | probs | a member's index); "members" then holds each member's own figures.
    """
    require_input(data_path, "--data")
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

    def figures(pred) -> dict:
        out = {"accuracy": accuracy(pred, data.labels)}
        if data.teacher_labels is not None:
            out["teacher_agreement"] = float((pred == data.teacher_labels).mean())
        return out

    out = {"data": data_path, "rows": len(data.texts), "labeled_rows": int((data.labels != NO_LABEL).sum()),
           **figures(ensemble.combine_logits(logits, how).argmax(-1))}
    if len(paths) == 1 and models[0].exits is not None:
        out["speed"] = float(speed or 0.0)
        out["mean_layers"] = float(runs[0][1].mean()) if len(data.texts) else float("nan")
    if len(paths) > 1:
        out["combine"] = how
        out["members"] = [{"model": p, **figures(l.argmax(-1))} for p, l in zip(paths, logits)]
    return out
