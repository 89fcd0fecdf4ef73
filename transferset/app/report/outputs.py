"""What a run's stages make, by role (`RunOutputs`): each stage kind (transferset/app/stages/) fills in its part as
the plan is built; the report and the model cards read it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, TypedDict, Union


SEARCH_STUDENT = "search"  # the search's chosen student's name among the run's students
SHIPPED = "onnx"  # a Compressed model's `how` for the ONNX export a model ships as (compress.ship)


class ResultRow(TypedDict, total=False):
    """One model's row of the report (results.json's `rows`, results.md, report.html, `RUN/chosen`): the teacher,
    an ensemble's member, a student or a compressed model. Accuracies are fractions; latencies milliseconds."""

    name: str  # "teacher", "teacher K", "student: NAME (family, phases)" or the compressed model's name
    display: str  # the name as the table shows it, where it differs
    kind: str  # teacher | student | compressed (a member: none)
    dev_accuracy: Optional[float]  # on the selection split (what every choice was made on)
    test_accuracy: Optional[float]  # on the test split (None: the run has none)
    agreement: Optional[float]  # a student's agreement with the teacher's labels on the selection split
    parameters: int
    latency_1: float  # batch 1, one thread, on the runtime the model ships in
    latency_64: float
    latency_spread_1: float
    latency_spread_64: float
    latency_busy: bool  # the machine was busy while timing: the ratios below are left out (None)
    runtime: str  # pytorch | onnx
    speedup_1: Optional[float]  # against the teacher's padding-free path
    speedup_64: Optional[float]
    speedup_1_export: Optional[float]  # against the teacher's own ONNX export, where the run made one
    path: Optional[str]  # the folder a user ships (None: not shippable as is)
    compressed: dict[str, str]  # a compressed model's {"from", "how", "path"}
    speed: float  # a model with early exits: the threshold it is timed at
    mean_layers: Optional[float]
    transfer_rows: int  # a student's transfer-set rows and labeled rows
    labeled_rows: int
    student: str  # a student's name in the run
    labels_only: bool  # it learned from the gold labels alone
    searched: bool  # the search's chosen student


@dataclass(frozen=True)
class Compressed:
    """A model the `compress:` section makes from one of the run's models."""

    path: str
    speed: Optional[float]  # the early-exit threshold it is timed and tested at (None: no exits)
    source: str  # the model it is made from: "teacher" or a student's name
    how: str  # int8, onnx (SHIPPED), exits, pruned or self-distilled


@dataclass
class RunOutputs:
    """What the run's stages make, by role: each stage kind fills in its part as the plan is built."""

    run_dir: str
    selection: str  # the split every choice is made on
    test: Optional[str]  # the split every model is scored on at the end (None: no test split)
    data: Optional[str] = None  # the data stage's folder when it splits train
    transfer: Optional[str] = None
    scored: Optional[str] = None
    dev_scored: Optional[str] = None  # the selection split scored by the teacher
    teacher: Optional[str] = None  # the teacher's folder (an ensemble's primary member)
    members: list[str] = field(default_factory=list)  # a teacher ensemble's members, in score.combine's order
    combine: Optional[str] = None  # an ensemble's rule
    students: dict[str, str] = field(default_factory=dict)  # name → folder
    compressed: dict[str, Compressed] = field(default_factory=dict)  # the report's row name → model
    model_stages: list[str] = field(default_factory=list)  # the stages whose models the test split scores
    test_results: Optional[str] = None
    search: Optional[str] = None  # the search stage's record of its candidates (search.json)
    # the report's rows, each kind's (StageKind.report_rows: Timed -> its rows), in the kinds' order
    report_rows: list[Callable[[Any], list[ResultRow]]] = field(default_factory=list)

    @property
    def ensemble(self) -> bool:
        return len(self.members) > 1

    @property
    def ensemble_members(self) -> list[str]:
        """An ensemble's members, in score.combine's order; none for one teacher."""
        return list(self.members) if self.ensemble else []

    @property
    def scorer(self) -> Union[str, list[str], None]:
        """What scores the rows and is tested as "teacher": the teacher, or an ensemble's members."""
        return self.members if self.ensemble else (self.members[0] if self.members else self.teacher)

    def models(self) -> dict[str, Any]:
        """Every model of the run by its name in the test results: an ensemble is one model."""
        return {"teacher": self.scorer, **self.students, **{name: c.path for name, c in self.compressed.items()}}

    def speeds(self) -> dict[str, float]:
        """The early-exit threshold of each model with exits, by name."""
        return {name: c.speed for name, c in self.compressed.items() if c.speed is not None}
