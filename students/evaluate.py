"""Accuracy of a trained student, or of any Hugging Face sequence classifier (e.g. the teacher), and
agreement with the teacher when the data holds its labels (`transferset evaluate`)."""
from __future__ import annotations

from typing import Optional

from students.data import read_eval_data
from students.losses import NO_LABEL
from students.student import Student, accuracy
from students.trainer import require_input
from transferset import fs
from transferset.fs.remote import local_teacher
from transferset.sources import DEFAULT_LABEL_COLUMN


def evaluate(model_path: str, data_path: str, *, text_column=None, label_column: str = DEFAULT_LABEL_COLUMN,
             text_b_column=None, batch_size: int = 256,
             max_length: Optional[int] = None) -> dict:
    require_input(data_path, "--data")
    # A model directory on remote storage is copied once into the local cache.
    student = Student.from_pretrained(local_teacher(model_path) if fs.is_remote(model_path) else model_path,
                                      max_length=max_length)
    data = read_eval_data(data_path, student.label_names, text_column=text_column, label_column=label_column,
                          text_b_column=text_b_column)
    pred = student.predict_ids(data.texts, data.texts_b, batch_size=batch_size)
    out = {"data": data_path, "rows": len(data.texts),
           "labeled_rows": int((data.labels != NO_LABEL).sum()),
           "accuracy": accuracy(pred, data.labels)}
    if data.teacher_labels is not None:
        out["teacher_agreement"] = float((pred == data.teacher_labels).mean())
    return out
