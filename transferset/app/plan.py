"""`transferset run`'s stages from builders: one small function per stage kind, each declaring its stages
(folder, key settings, upstream stages, what it calls); their keys follow from the declarations
(transferset/app/stages.py) and the key rules (transferset/app/keys.py). runner.plan_stages composes them.
"""
from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

from pipelines.augment import run_augment
from pipelines.score import run_score
from students.compress.exits_train import train_exits
from students.compress.export import Int8Refused, export as export_model
from students.compress.prune import prune as prune_model
from students.evaluate import evaluate
from students.trainer import train as train_student
from transferset import fs, transfer
from transferset.app import keys
from transferset.app.report import write_report
from transferset.app.stages import StageDef
from transferset.config import LAYER_TEXTS_REST, AugmentConfig, BeamConfig, RunConfig
from transferset.errors import UserError
from transferset.evalset import write_eval_set
from transferset.fs import remote
from transferset.splits import (LABELED_FILE, REJECTS_FILE, REST_FILE, SPLIT_STATS_FILE, UNLABELED_FILE,
                               VALIDATION_FILE, split_data)
from transferset.teacher import ensemble
from transferset.teacher.train import train as train_teacher

TEST_RESULTS_FILE = "accuracy.json"  # in run_dir/test/: every model's accuracy on the test split


@dataclass(frozen=True)
class DataFiles:
    """Where a run's data comes from, and which split each role uses."""

    train: str
    dev: Optional[str]  # the task's dev file (None: a train file whose selection split is carved from it)
    test: Optional[str]  # a labeled test file (data folder's test.tsv or `test:`), else None


def splits_train(cfg: RunConfig) -> bool:
    """Whether the run's data stage splits the train file (labeled, unlabeled, validation, rest)."""
    return cfg.lowres is not None or cfg.unlabeled_rows is not None or cfg.validation is not None


def fingerprint(path: str) -> str:
    """Content hash of an input file, local or URL (or the spec itself for hub datasets)."""
    if path.startswith("hf:") or not fs.isfile(path):
        return path
    h = hashlib.sha256()
    with fs.open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def set_fingerprint(directory: str) -> str:
    """Of a transfer set a stage reads but no stage of the run makes (a student's `layer_texts`): its
    Parquet shards' names and sizes and its completion marker, so a set written again at that path gets a
    new key. (Hashing every byte of a set of millions of rows each time a run starts would not be cheap.)"""
    if not fs.isdir(directory):
        return directory  # the student's own checks refuse it when the stage runs
    h = hashlib.sha256()
    for f in sorted(transfer.data_files(directory)):
        h.update(f"{fs.basename(f)}\t{fs.size(f)}\n".encode())
    marker = transfer.complete_marker(directory)
    h.update(fs.read_text(marker).encode() if fs.exists(marker) else b"incomplete")
    return h.hexdigest()


def rest_file(data_dir: str) -> str:
    """The data stage's rest.jsonl, which a data folder split before it existed lacks."""
    path = fs.join(data_dir, REST_FILE)
    if not fs.exists(path):
        raise UserError(f"{path} is missing: {data_dir} was split by an earlier transferset. Delete that folder "
                        "and run again: the split is redone (seconds), and the stages after it are reused")
    with fs.open(path, "rb") as fh:
        if not fh.readline().strip():
            raise UserError(f"layer_texts: {LAYER_TEXTS_REST}: the labeled and unlabeled pools and the validation "
                            "split took every row of the train file, so none is left: lower labeled_limit or "
                            "unlabeled_rows, or give a transfer set's path")
    return path


def student_settings(rules: Any, s_cfg) -> dict:
    """A student stage's key settings (`rules.student`: transferset/app/keys.py), with the content of the
    layer_texts set it reads (`rest`: the run's layer_texts stage, whose key is upstream)."""
    made = not s_cfg.layer_texts or s_cfg.layer_texts == LAYER_TEXTS_REST
    return rules.student(s_cfg, None if made else set_fingerprint(s_cfg.layer_texts))


@dataclass(frozen=True)
class StageFunctions:
    """What the stages call: the subcommands' functions; a test passes its own (a value, not a patch)."""

    teacher: Callable = train_teacher
    augment: Callable = run_augment
    score: Callable = run_score
    student: Callable = train_student
    evaluate: Callable = evaluate
    report: Callable = write_report
    # compress:
    export: Callable = export_model
    exits: Callable = train_exits
    prune: Callable = prune_model


def stage_beam(cfg: RunConfig) -> dict[str, BeamConfig]:
    """The Beam settings each pipeline stage runs with.

    augment and score run where the `beam:` section says (e.g. Dataflow); the dev set is a few
    hundred rows, scored once in this process (FnApiRunner), wherever the big stages run.
    """
    return {"augment": cfg.beam, "score": cfg.beam, "dev.score": BeamConfig()}


@dataclass(frozen=True)
class RunPlan:
    stages: list[StageDef]  # in the order they run
    selection: str  # the split every choice is made on
    test: Optional[str]  # the split every model is scored on at the end
    paths: dict  # what the report reads


@dataclass(frozen=True)
class Run:
    """What every builder reads: the run's settings, functions and folders (one teacher or an ensemble's)."""

    cfg: RunConfig
    files: DataFiles
    fn: StageFunctions
    beams: dict[str, BeamConfig]
    split: bool  # the data stage splits train
    teacher: Any  # the teacher: section, with labeled_limit as its limit when nothing is split
    augment: AugmentConfig  # likewise
    rules: Any = keys  # the key rules (transferset/app/keys.py; `transferset migrate` passes the earlier ones)

    def d(self, *parts: str) -> str:
        return fs.join(self.cfg.run_dir, *parts)

    def split_labels(self, section: Any) -> Any:
        """`section` (teacher: or augment:) with the split's label set (train's, split.json) when train is split
        and the section names none: a class no labeled row holds keeps its place in the teacher's head."""
        if not self.split or section.labels:
            return section
        return replace(section, labels=tuple(fs.read_json(fs.join(self.data_dir, SPLIT_STATS_FILE))["label_names"]))

    @property
    def data_dir(self) -> Optional[str]:
        return self.d("data") if self.split else None

    @property
    def labeled(self) -> str:
        return fs.join(self.data_dir, LABELED_FILE) if self.split else self.files.train

    @property
    def unlabeled(self) -> Optional[str]:
        return fs.join(self.data_dir, UNLABELED_FILE) if self.split else None

    @property
    def selection(self) -> str:
        return fs.join(self.data_dir, VALIDATION_FILE) if self.cfg.validation is not None else self.files.dev

    @property
    def test(self) -> Optional[str]:
        return self.files.test or (self.files.dev if self.cfg.validation is not None else None)

    @property
    def guarded(self) -> list[str]:
        """The evaluation files, kept out of every transfer set."""
        return list(dict.fromkeys(p for p in (self.selection, self.files.dev, self.test) if p))

    @functools.cached_property
    def labels(self) -> Callable[[], list[str]]:
        # every shard's metadata, read once the augment stage has written them
        return functools.cache(lambda: transfer.label_names(self.d("transfer")))


def make_run(cfg: RunConfig, files: DataFiles, fn: StageFunctions, rules: Any = keys) -> Run:
    split = splits_train(cfg)
    # Without a split, labeled_limit reads the first N rows of train in every stage.
    limit = None if split else cfg.labeled_limit
    return Run(cfg, files, fn, stage_beam(cfg), split, replace(cfg.teacher, limit=limit) if limit else cfg.teacher,
               replace(cfg.augment, limit=limit) if limit else cfg.augment, rules)


def data_stage(r: Run) -> StageDef:
    """The train file and how it is split: a stage only when a split is asked, an input key always."""
    return StageDef("data", r.data_dir, r.rules.data(r.cfg, fingerprint(r.files.train)),
                    run=(lambda out: split_stage(r.files.train, out, r.cfg)) if r.split else None,
                    done_file=SPLIT_STATS_FILE)


def given_teacher(name: str, path: str) -> StageDef:
    """A teacher given by its folder: its weights are the key."""
    return StageDef(name, path, {
        "path": path if fs.is_remote(path) else os.path.abspath(path),
        "weights": [fingerprint(f) for f in fs.listdir(path) if f.endswith(".safetensors")]})


def trained_teacher(r: Run, name: str, out_dir: str, tc, can_resume: Callable, kind: Optional[str] = None) -> StageDef:
    """A teacher fine-tuned locally (a staging folder when run_dir is a URL), then uploaded: the score workers
    copy it from run_dir (fs.remote.local_teacher). `can_resume`: teacher.train.can_resume."""
    def resumable(out: str) -> bool:
        return can_resume(r.split_labels(tc), train=remote.local_file(r.labeled), dev=remote.local_file(r.selection),
                          output=out)

    return StageDef(
        name, out_dir, lambda: {"settings": r.rules.teacher(tc), "selection": fingerprint(r.selection)}, ("data",),
        run=lambda out: r.fn.teacher(replace(r.split_labels(tc), resume=resumable(out)),
                                     train=remote.local_file(r.labeled),
                                     dev=remote.local_file(r.selection), output=out, overwrite=True),
        local=True, kind=kind, resumable=resumable)


def teacher_stages(r: Run, can_resume: Callable) -> tuple[list[StageDef], str, list[str]]:
    """The teacher (trained or given) or an ensemble's members, each its own stage, and an ensemble's
    "teacher" stage standing for them all downstream (its key made of theirs) → (stages, the teacher's folder,
    the members' folders in score.combine's order)."""
    cfg = r.cfg
    if not (cfg.teacher_paths or cfg.teacher_seeds):
        if cfg.teacher_path:  # an existing directory (check_paths)
            return [given_teacher("teacher", cfg.teacher_path)], cfg.teacher_path, []
        return [trained_teacher(r, "teacher", r.d("teacher"), r.teacher, can_resume)], r.d("teacher"), []
    if cfg.teacher_paths:
        members = [given_teacher(f"teacher.{i}", p) for i, p in enumerate(cfg.teacher_paths)]
    else:
        members = [trained_teacher(r, f"teacher.seed{seed}", r.d("teachers", f"seed{seed}"),
                                   replace(r.teacher, seed=seed), can_resume, kind="teacher")
                   for seed in cfg.teacher_seeds]
    folders = [m.folder for m in members]
    primary = folders[ensemble.primary(ensemble.parse_combine(cfg.score.combine, len(folders)))]
    return [*members, StageDef("teacher", None, {"members": len(folders)}, tuple(m.name for m in members))], \
        primary, folders


def augment_stage(r: Run, name: str, folder: str, a: AugmentConfig, inputs: list[str], unlabeled: list[str],
                  upstream: tuple[str, ...] = ("data",), kind: Optional[str] = None) -> StageDef:
    """An augment pipeline run: the transfer set, or the layer_texts set of the rows no pool took."""
    return StageDef(name, folder, lambda: r.rules.augment(a, [fingerprint(p) for p in r.guarded]), upstream, kind=kind,
                    run=lambda out: r.fn.augment(r.split_labels(a), inputs=inputs, unlabeled=unlabeled,
                                                 exclude=r.guarded, output=out,
                                                 beam_cfg=r.beams["augment"], overwrite=True))


def score_stage(r: Run, name: str, folder: str, source: str, scorer: Any, members: int,
                kind: Optional[str] = None) -> StageDef:
    """A score pipeline run of `source`'s rows by the teacher (or the ensemble's members)."""
    def score(out: str, resume: bool = False) -> Any:
        return r.fn.score(r.cfg.score, input=r.d(*_FOLDERS[source]), teacher=scorer, output=out,
                          beam_cfg=r.beams[name], resume=resume, overwrite=True)

    # a killed run of this key goes on from its whole shards (score --resume checks each against this run)
    return StageDef(name, folder, r.rules.score(r.cfg.score, members), (source, "teacher"), kind=kind, run=score,
                    resume=lambda out: score(out, resume=True))


_FOLDERS = {"augment": ("transfer",), "dev": ("dev", "transfer")}  # what score_stage reads, by upstream stage


def dev_stage(r: Run) -> StageDef:
    """The selection split as a set, scored once by the teacher after it (students stop early on it and report
    their agreement with the teacher on rows they never trained on); its labels are the transfer set's."""
    columns = list(r.augment.column_kwargs().values())
    return StageDef("dev", r.d("dev", "transfer"),
                    lambda: {"dev": fingerprint(r.selection), "columns": columns, "labels": r.labels()},
                    run=lambda out: write_eval_set(r.selection, out, r.labels(), **r.augment.column_kwargs(),
                                                   overwrite=True))


def layer_texts_stages(r: Run) -> tuple[list[StageDef], set[str]]:
    """layer_texts: rest: the train file's rows no pool took, as they are (no variants), for the students'
    phases on layer losses alone; made once, only when a student asks for it → (stages, those students)."""
    rest = {name for name, s_cfg in r.cfg.students.items() if s_cfg.layer_texts == LAYER_TEXTS_REST}
    if not rest:
        return [], rest
    as_is = replace(r.augment, n_iter=0, unlabeled_n_iter=0, limit=None)
    return [StageDef("layer_texts", r.d("layer_texts"), lambda: r.rules.augment(as_is, [fingerprint(p) for p in r.guarded]),
                     ("data",), run=lambda out: r.fn.augment(as_is, inputs=[rest_file(r.data_dir)], unlabeled=[],
                                                            exclude=r.guarded, output=out, beam_cfg=r.beams["augment"],
                                                            overwrite=True))], rest


def student_stages(r: Run, rest: set[str], teacher_dir: Optional[str] = None) -> list[StageDef]:
    """Students: trained here from the scored set (streamed from run_dir), saved locally, then uploaded.
    `teacher_dir`: the run's one teacher, for the students that name none (the scored set records where its
    teacher was, which a run directory moved or copied elsewhere no longer holds); the key keeps the settings
    as written."""
    def one(name: str, s_cfg) -> StageDef:
        run_cfg = replace(s_cfg, layer_texts=r.d("layer_texts")) if name in rest else s_cfg
        if run_cfg.teacher is None and teacher_dir is not None:
            run_cfg = replace(run_cfg, teacher=teacher_dir)
        return StageDef(f"students.{name}", r.d("students", name), functools.partial(student_settings, r.rules, s_cfg),
                        ("score", "dev.score", *(("layer_texts",) if name in rest else ())),
                        run=lambda work: r.fn.student(run_cfg, r.d("scored"), r.d("dev", "scored"), work,
                                                      overwrite=True),
                        local=True, kind="student")

    return [one(name, s_cfg) for name, s_cfg in r.cfg.students.items()]


def test_stage(r: Run, models: dict[str, Any], speeds: dict[str, float], upstream: tuple[str, ...],
               ensemble_of: bool) -> StageDef:
    """Every model scored once on the held-out split, after every choice was made."""
    combine = {"combine": r.cfg.score.combine} if ensemble_of else {}
    columns = list(r.augment.column_kwargs().values())
    return StageDef(
        "test", r.d("test"), {"test": fingerprint(r.test), "columns": columns, "models": list(models), **combine,
                              **({"speeds": speeds} if speeds else {})}, upstream,
        run=lambda out: evaluate_on_test(r.test, models, out, r.augment, r.fn.evaluate, speeds=speeds, **combine),
        done_file=TEST_RESULTS_FILE)


def build_plan(cfg: RunConfig, files: DataFiles, fn: StageFunctions, can_resume: Callable,
               rules: Any = keys) -> RunPlan:
    """The run's stages as data, each kind from its builder, in the order they run; their keys by `rules`."""
    r = make_run(cfg, files, fn, rules)
    teachers, teacher_dir, members = teacher_stages(r, can_resume)
    scorer = members if len(members) > 1 else (members[0] if members else teacher_dir)  # what score and test get
    scoring = dict(scorer=scorer, members=len(members))
    stages = [data_stage(r), *teachers,
              augment_stage(r, "augment", r.d("transfer"), r.augment, [r.labeled], [r.unlabeled] if r.unlabeled else []),
              score_stage(r, "score", r.d("scored"), "augment", **scoring), dev_stage(r),
              score_stage(r, "dev.score", r.d("dev", "scored"), "dev", kind="score", **scoring)]
    more, rest = layer_texts_stages(r)
    students = {name: r.d("students", name) for name in cfg.students}
    stages += [*more, *student_stages(r, rest, None if members else teacher_dir)]
    compress_stages, compressed = compress_plan(cfg, fn, r.d, teacher_dir, students, r.d("scored"), r.d("dev", "scored"),
                                                 r.rules)
    stages += compress_stages
    models = {"teacher": scorer, **students,  # an ensemble is evaluated as one model, its members beside
              **{name: c["path"] for name, c in compressed.items()}}
    speeds = {name: c["speed"] for name, c in compressed.items() if c["speed"] is not None}
    if r.test:
        stages.append(test_stage(r, models, speeds, ("teacher", *(f"students.{name}" for name in students),
                                                      *(s.name for s in compress_stages)), isinstance(scorer, list)))
    paths = {"run_dir": cfg.run_dir, "teacher": teacher_dir, "transfer": r.d("transfer"), "scored": r.d("scored"),
             "students": students, "dev": r.selection, "test": r.test, "data": r.data_dir,
             "test_results": r.d("test", TEST_RESULTS_FILE) if r.test else None, "compressed": compressed}
    if isinstance(scorer, list):  # the report shows the ensemble and each member
        paths.update(teachers=scorer, combine=cfg.score.combine, dev_scored=r.d("dev", "scored"))
    return RunPlan(stages, r.selection, r.test, paths)


def compress_plan(cfg: RunConfig, fn: StageFunctions, d: Callable[..., str], teacher_dir: str,
                  students: dict[str, str], scored_dir: str, dev_scored: str,
                  rules: Any = keys) -> tuple[list[StageDef], dict]:
    """The `compress:` section's stages, and the models they make: {report name: {"path", "speed", "from",
    "how"}}. Each is made from a model of the run (the teacher: one, not an ensemble, RunConfig refuses
    that), in its own folder under RUN/compressed/, and tested and timed in the report as the others are."""
    c = cfg.compress
    # the teacher's derivatives read rows as the scored set did: its logits are the exits' and the recovery's targets
    teacher_length = cfg.score.max_length or cfg.teacher.max_length
    stages: list[StageDef] = []
    made: dict[str, dict] = {}
    for name in c.int8:
        source, upstream = (teacher_dir, "teacher") if name == "teacher" else (students[name], f"students.{name}")
        length = teacher_length if name == "teacher" else None
        folder = d("compressed", f"{name}-int8")
        stages.append(StageDef(f"compress.int8.{name}", folder, {"quantize": "int8", "max_length": length},
                               (upstream,), kind="compress.int8",
                               run=lambda out, source=source, length=length, name=name: _int8_stage(
                                   fn, name, source, out, length)))
        made[f"{name} (int8)"] = {"path": folder, "speed": None, "from": name, "how": "int8"}
    if c.exits is not None:
        e = c.exits if c.exits.max_length is not None else replace(c.exits, max_length=teacher_length)
        folder = d("compressed", "teacher-exits")
        stages.append(StageDef("compress.exits", folder, rules.compressed("exits", e), ("teacher", "score"),
                               run=lambda out: fn.exits(teacher_dir, scored_dir, out, e, overwrite=True, progress=False)))
        made.update({f"teacher (exits, speed {s:g})": {"path": folder, "speed": s, "from": "teacher", "how": "exits"}
                     for s in c.exit_speeds})
    if c.prune is not None:
        pc = c.prune if c.prune.max_length is not None else replace(c.prune, max_length=teacher_length)
        folder = d("compressed", "teacher-pruned")
        stages.append(StageDef("compress.prune", folder, rules.compressed("prune", pc), ("teacher", "score", "dev.score"),
                               run=lambda out: fn.prune(pc, teacher_dir, dev_scored, out, transfer_dir=scored_dir,
                                                        overwrite=True, progress=False)))
        # heads: 0 removes none: the recovery alone, the teacher distilled on its own cached logits
        name = "teacher (pruned)" if pc.heads else "teacher (self-distilled)"
        made[name] = {"path": folder, "speed": None, "from": "teacher", "how": "pruned" if pc.heads else "self-distilled"}
    return stages, made


def _int8_stage(fn: StageFunctions, name: str, source: str, out: str, length: Optional[int]) -> dict:
    """compress.int8's export of one model; a graph the check refuses stops the run saying what to change in it."""
    try:
        return fn.export(source, out, format="onnx", quantize="int8", max_length=length, overwrite=True)
    except Int8Refused as exc:
        raise Int8Refused(f"{exc}. In this run: remove {name} from compress.int8 and run it again (every finished "
                          "stage is reused)") from None


def split_stage(train: str, out: str, cfg: RunConfig) -> dict:
    """The data stage: split_data writes its files by name, without the output protocol; they are cleared by
    name first, so a split that writes fewer (no validation) leaves none of an earlier one's beside them."""
    fs.delete([fs.join(out, name) for name in (LABELED_FILE, UNLABELED_FILE, VALIDATION_FILE, REST_FILE,
                                               REJECTS_FILE, SPLIT_STATS_FILE)])
    return split_data(train, out, cfg)


def evaluate_on_test(test: str, models: dict[str, Any], out: str, a: AugmentConfig,
                     evaluate_fn: Callable = evaluate, speeds: Optional[dict[str, float]] = None,
                     **ensemble_kwargs: Any) -> dict:
    """Accuracy of each model on the test file, as `transferset evaluate` computes it.

    A model given as a list is a teacher ensemble (`ensemble_kwargs`: its combine setting): its result
    holds each member's too. `speeds`: the early-exit threshold of the models with exits, by name."""
    speeds = speeds or {}
    fs.delete(fs.join(out, TEST_RESULTS_FILE))  # written without the output protocol: cleared by name
    results = {name: evaluate_fn(path, test, **a.column_kwargs(), **(ensemble_kwargs if isinstance(path, list) else {}),
                                 **({"speed": speeds[name]} if name in speeds else {}))
               for name, path in models.items()}
    doc = {"test": test, "models": results}
    fs.write_json(fs.join(out, TEST_RESULTS_FILE), doc, indent=2)
    return doc


