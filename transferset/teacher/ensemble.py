"""A teacher ensemble: K fine-tuned teachers scoring the same rows, their logits combined (Beam-free).

`transferset score` with several `--teacher` loads an `Ensemble` in place of one `Teacher`: each member
scores every row once; the scored set keeps each member's raw logits (teacher_logits_{k}) and puts their
combination in teacher_logits (teacher_label its argmax), so every student and reader trains on the
ensemble without knowing it is one. The hidden states (teacher_hidden, teacher_hidden_l{k}), the
tokenizer and teacher_id are the primary member's: the chosen one with `combine: K`, else the first.
With one teacher none of this runs: the set is the single-teacher set, column for column.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np

from transferset.config import COMBINES
from transferset.contract import schema
from transferset.data import transfer
from transferset.runtime.errors import ConfigError, UserError
from transferset.teacher.scoring import Scores

Combine = Union[str, int]  # "mean" | "probs" | a member's index


def parse_combine(value: Union[str, int], members: int, flag: str = "--teacher") -> Combine:
    """The combine rule for `members` teachers (given by `flag`): "mean", "probs" or a member index."""
    if members < 1:
        raise ConfigError(f"no teacher: give at least one {flag} (a fine-tuned teacher directory)")
    text = str(value)
    if text in COMBINES:
        return text
    if not text.isdigit():
        raise ConfigError(f"--combine {text!r}: choose one of {list(COMBINES)}, or the index of one teacher "
                          f"(0 for the first {flag})")
    k = int(text)
    if not 0 <= k < members:
        raise ConfigError(f"--combine {k}: there are {members} teacher(s), so a member index is 0..{members - 1} "
                          f"(in the order of {flag})")
    return k


def primary(combine: Combine) -> int:
    """The member whose hidden states, tokenizer and id the scored set records."""
    return combine if isinstance(combine, int) else 0


def combine_logits(members: Sequence[np.ndarray], combine: Combine) -> np.ndarray:
    """(N, C) float32 teacher_logits from the members' (N, C) logits.

    mean: their arithmetic mean. probs: log of their mean softmax probabilities (in float64, so a
    confident member's tiny probabilities do not underflow before the mean). K: member K's, unchanged.
    """
    if not members:
        raise UserError("no teacher logits to combine: an ensemble needs at least one teacher")
    if isinstance(combine, int):
        return np.asarray(members[combine], dtype=np.float32)
    stack = np.stack([np.asarray(m, dtype=np.float64) for m in members])  # (K, N, C)
    if combine == "mean":
        return stack.mean(axis=0).astype(np.float32)
    if combine == "probs":
        shifted = stack - stack.max(axis=2, keepdims=True)
        probs = np.exp(shifted) / np.exp(shifted).sum(axis=2, keepdims=True)
        return np.log(probs.mean(axis=0)).astype(np.float32)
    raise UserError(f"--combine {combine!r}: choose one of {list(COMBINES)}, or a member index")


def check_members(teachers: Sequence[str], label_names: Sequence[Sequence[str]]) -> list[str]:
    """The members' shared label names; refuse teachers whose classes differ in number, names or order
    (averaging logits of different classes would silently train on nonsense)."""
    if not teachers:
        raise UserError("no teacher: give at least one --teacher (a fine-tuned teacher directory)")
    first, names = teachers[0], list(label_names[0])
    for path, other in zip(teachers[1:], label_names[1:]):
        other = list(other)
        if len(other) != len(names):
            raise UserError(f"teacher ensemble: {path} predicts {len(other)} classes {other}, {first} predicts "
                            f"{len(names)} {names}; every teacher of an ensemble must be fine-tuned on the same "
                            "labels (`transferset teacher` with the same data)")
        if other != names:
            raise UserError(f"teacher ensemble: {path} predicts {other} (config.json id2label), {first} predicts "
                            f"{names}; the members' classes must have the same names in the same order, or their "
                            "logits would be averaged across different classes. Fine-tune them on the same labels, "
                            "or fix id2label in config.json if only the names differ")
    return names


def ensemble_metadata(combine: Combine, members: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The META_ENSEMBLE value: members are {MEMBER_ID, MEMBER_SHA256, MEMBER_DEV_ACCURACY} dicts."""
    return {schema.ENSEMBLE_COMBINE: combine, schema.ENSEMBLE_PRIMARY: primary(combine),
            schema.ENSEMBLE_TEACHERS: [dict(m) for m in members]}


class Ensemble:
    """Members (each a `Teacher`, or anything with its predict and attributes) scoring as one teacher.

    `predict` returns the primary member's Scores with teacher_logits replaced by the combination and
    every member's logits in `members`.
    """

    def __init__(self, teachers: Sequence[Any], combine: Union[str, int] = "mean"):
        self.teachers = list(teachers)
        self.combine = parse_combine(combine, len(self.teachers))
        check_members([getattr(t, "source", str(i)) for i, t in enumerate(self.teachers)],
                      [t.label_names for t in self.teachers])
        self.primary = self.teachers[primary(self.combine)]

    @property
    def label_names(self) -> list[str]:
        return list(self.primary.label_names)

    def predict(self, texts: Sequence[str], texts_b: Optional[Sequence[Optional[str]]] = None) -> Scores:
        scores = [t.predict(texts, texts_b) for t in self.teachers]
        main = scores[primary(self.combine)]
        logits = [s.logits for s in scores]
        return Scores(combine_logits(logits, self.combine), main.hidden, main.layers,
                      num_tokens=sum(s.num_tokens for s in scores), members=logits)


def accuracies(scored_dir: str) -> dict[str, Any]:
    """Accuracy on the labeled rows of a scored set (e.g. the run's scored selection split): of the teacher
    (teacher_label: the ensemble's combination) and, for an ensemble, of each member (its own argmax).

    {"rows": labeled rows, "teacher": accuracy, "members": [accuracy per member]} (accuracies None with no
    labeled row; members [] for a one-teacher set). Nothing is run: the scores are read back.
    """
    names = transfer.read_schema(transfer.data_files(scored_dir)[0]).names
    members = schema.member_columns(names)
    columns = [schema.LABEL, schema.TEACHER_LABEL, *members]
    right, member_right, labeled = 0, np.zeros(len(members), dtype=np.int64), 0
    for batch in transfer.iter_batches(scored_dir, columns=columns):
        labels = batch.column(schema.LABEL).to_numpy(zero_copy_only=False)
        has = ~np.isnan(labels.astype(np.float64)) if labels.dtype.kind == "f" else np.ones(len(labels), bool)
        gold = np.nan_to_num(labels.astype(np.float64), nan=-1).astype(np.int64)
        has &= gold >= 0
        labeled += int(has.sum())
        pred = batch.column(schema.TEACHER_LABEL).to_numpy(zero_copy_only=False)
        right += int((pred[has] == gold[has]).sum())
        for k, col in enumerate(members):
            member_pred = transfer.fixed_list_to_numpy(batch.column(col)).argmax(axis=1)
            member_right[k] += int((member_pred[has] == gold[has]).sum())
    acc = (lambda n: n / labeled if labeled else None)
    return {"rows": labeled, "teacher": acc(right), "members": [acc(int(n)) for n in member_right]}
