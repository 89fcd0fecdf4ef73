"""`transferset run --config YAML [key=value ...]`: teacher → augment → score → students → report.

Each stage writes into its own folder of the run directory with a `.stage.json` holding a
content hash of its settings and of everything upstream. A rerun reuses every stage whose
hash is unchanged and complete, so after a crash or a changed student setting only what
changed is redone. Stages run the same code as the subcommands, in this process.

`run_dir` and `data` may be URLs (gs://, any scheme fsspec and Beam know): the bookkeeping goes
through transferset.fs, the pipelines through Beam's FileSystems. Stages whose code writes local
files only (the teacher's fine-tuning, the students) write to a local staging folder that is then
uploaded to the run directory; the score workers fetch the teacher from there (teacher.remote).
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence

import yaml

from pipelines.augment import run_augment
from pipelines.runtime import check_beam
from pipelines.score import run_score
from students.evaluate import evaluate
from students.exits_train import train_exits
from students.export import Int8Refused, export as export_model
from students.prune import prune as prune_model
from students.teacher_files import refuse_student_folder
from students.trainer import train as train_student
from transferset import fs, loading, schema, transfer, typed
from transferset.augment import check_ops, needs
from transferset.app.report import write_report
from transferset.config import LAYER_TEXTS_REST, AugmentConfig, BeamConfig, RunConfig
from transferset.errors import ConfigError, UserError
from transferset.evalset import write_eval_set
from transferset.fs import remote
from transferset.fs.lock import output_lock
from transferset.fs.output import clear as clear_output
from transferset.splits import (LABELED_FILE, REST_FILE, SPLIT_STATS_FILE, UNLABELED_FILE, VALIDATION_FILE,
                                split_data)
from transferset.teacher import ensemble
from transferset.teacher.train import can_resume as can_resume_teacher
from transferset.teacher.train import train as train_teacher

STAGE_FILE = ".stage.json"
TEST_RESULTS_FILE = "accuracy.json"  # in run_dir/test/: every model's accuracy on the test split
SHARED_SST2 = os.path.join("..", "shared", "data", "sst2")
HF_SST2 = ("hf:glue:sst2:train", "hf:glue:sst2:validation")

EPILOG = """Settings: transferset/config.py (RunConfig and one dataclass per section: teacher, augment, score,
students.NAME, beam); every value is type-checked before any stage runs.

examples:
  transferset run --config configs/demo.yaml
  transferset run --config configs/demo.yaml data=path/to/sst2 students.distilled.epochs=3
  transferset run --config configs/sst2_tang.yaml run_dir=runs/tang_seed1 augment.seed=1"""


# --- configuration ---------------------------------------------------------------

def apply_override(raw: dict, item: str) -> None:
    """`a.b.c=value` (a YAML value) into the raw config mapping."""
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected key=value, e.g. teacher.epochs=1")
    key, text = item.split("=", 1)
    try:
        value = typed.yaml_load(text) if text else None
    except typed.DuplicateKeyError as exc:
        raise ConfigError(f"override {item!r}: {exc.problem}") from None
    except yaml.constructor.ConstructorError as exc:
        raise ConfigError(f"override {item!r}: {exc.problem}; a setting holds plain values "
                          "(no !!python tags or other objects)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: the value is not valid YAML: {' '.join(str(exc).split())}") from None
    node = raw
    parts = key.split(".")
    for i, p in enumerate(parts[:-1]):
        if node.get(p) is None:
            node[p] = {}
        elif not isinstance(node[p], dict):
            where = ".".join(parts[:i + 1])
            raise ConfigError(f"override {item!r}: {where} is {node[p]!r}, not a section, so it has no "
                            f"setting {parts[i + 1]!r}; set {where}=VALUE instead")
        node = node[p]
    node[parts[-1]] = value


def load_config(path: str, overrides: Sequence[str] = ()) -> RunConfig:
    """The run config of a YAML file plus key=value overrides, type-checked before anything runs."""
    raw = typed.read_yaml(path)
    for item in overrides:
        apply_override(raw, item)
    cfg = typed.load(RunConfig, raw, where=path)
    check_ops(cfg.augment, where=f"{path}: augment")
    check_beam(cfg.beam, where=f"{path}: beam")  # a runner Beam cannot create fails here, not after the teacher
    # file:// URLs become local paths here, once; an unknown scheme is a usage error naming the setting.
    # Model settings too (a hub name passes as it is): a bad one stops the run before its first stage.
    students = {name: replace(s, **{k: fs.normalize(getattr(s, k), f"students.{name}.{k}")
                                    for k in ("teacher", "tokenizer") if getattr(s, k)})
                for name, s in cfg.students.items()}
    return replace(cfg, run_dir=fs.normalize(cfg.run_dir, "run_dir"),
                   teacher=replace(cfg.teacher, model=fs.normalize(cfg.teacher.model, "teacher.model")),
                   augment=replace(cfg.augment, mlm_model=fs.normalize(cfg.augment.mlm_model, "augment.mlm_model")),
                   students=students,
                   **{k: fs.normalize(getattr(cfg, k), k) for k in ("data", "test", "teacher_path") if getattr(cfg, k)},
                   **({"teacher_paths": tuple(fs.normalize(p, "teacher_paths") for p in cfg.teacher_paths)}
                      if cfg.teacher_paths else {}))


def check_paths(cfg: RunConfig) -> None:
    """Every local directory a setting names exists and holds a model the stage will accept: checked before
    the first stage, so a typo costs no teacher training or scoring (ConfigError: exit 2, nothing written)."""
    members = len(cfg.teacher_paths or cfg.teacher_seeds or [None])
    ensemble.parse_combine(cfg.score.combine, members, "teacher_seeds / teacher_paths")  # before any stage
    if cfg.teacher_path or cfg.teacher_paths:
        for path in cfg.teacher_paths or [cfg.teacher_path]:
            if not fs.isdir(path):
                key = "teacher_paths" if cfg.teacher_paths else "teacher_path"
                raise ConfigError(f"{key}={path}: no such directory")
        models = []
    else:
        models = [("teacher.model", cfg.teacher.model, cfg.teacher.allow_pickle, cfg.teacher.trust_remote_code)]
    if cfg.augment.makes_variants and needs(cfg.augment, "candidates"):
        models.append(("augment.mlm_model", cfg.augment.mlm_model, cfg.augment.allow_pickle,
                       cfg.augment.trust_remote_code))
    for key, value, allow_pickle, trust in models:
        if fs.is_remote(value):
            continue
        try:
            loading.check_model_dir(value, what=key, allow_pickle=allow_pickle, trust_remote_code=trust)
        except loading.TeacherLoadError as exc:
            raise ConfigError(str(exc)) from None
    for name, s in cfg.students.items():
        for key in ("teacher", "tokenizer"):
            value = getattr(s, key)
            if value and not fs.isdir(value):
                raise ConfigError(f"students.{name}.{key}={value}: no such directory")
            refuse_student_folder(value, key, f"students.{name}.{key}")
        if s.layer_texts == LAYER_TEXTS_REST and not splits_train(cfg):
            raise ConfigError(f"students.{name}.layer_texts={LAYER_TEXTS_REST}: the rest of the train file is "
                              "what the labeled and unlabeled pools leave, and this run splits nothing (all of "
                              "train is labeled): set labeled_limit and unlabeled_rows, or give a set's path")
        if s.layer_texts not in (None, LAYER_TEXTS_REST) and not fs.is_remote(s.layer_texts) \
                and not fs.isdir(s.layer_texts):
            raise ConfigError(f"students.{name}.layer_texts={s.layer_texts}: no such directory (a transfer set "
                              f"made by `transferset augment`, or {LAYER_TEXTS_REST}: the train file's rows "
                              "the run leaves out)")


def splits_train(cfg: RunConfig) -> bool:
    """Whether the run's data stage splits the train file (labeled, unlabeled, validation, rest)."""
    return cfg.lowres is not None or cfg.unlabeled_rows is not None or cfg.validation is not None


@dataclass(frozen=True)
class DataFiles:
    """Where a run's data comes from, and which split each role uses."""

    train: str
    dev: str  # the task's dev file
    test: Optional[str]  # a labeled test file (data folder's test.tsv or `test:`), else None


def resolve_data(data: Optional[str], test: Optional[str] = None) -> DataFiles:
    """The run's files: `data` (a folder or URL) if given, else ../shared/data/sst2 when present, else
    the hub's GLUE SST-2; the test file is `test`, else the folder's test.tsv when it exists."""
    if data:
        if data.startswith("hf:"):
            return DataFiles(f"{data}:train", f"{data}:validation", test)
        train, dev = fs.join(data, "train.tsv"), fs.join(data, "dev.tsv")
        for p in (train, dev):
            if not fs.exists(p):
                raise ConfigError(f"data={data}: {p} not found (expected a folder with train.tsv and dev.tsv)")
        folder_test = fs.join(data, "test.tsv")
        return DataFiles(train, dev, test or (folder_test if fs.exists(folder_test) else None))
    if os.path.exists(os.path.join(SHARED_SST2, "train.tsv")):
        return DataFiles(os.path.join(SHARED_SST2, "train.tsv"), os.path.join(SHARED_SST2, "dev.tsv"), test)
    return DataFiles(*HF_SST2, test)


# --- stages ------------------------------------------------------------------------

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


# Student settings added after run directories existed, in the order they were added: in a key only when
# set, so that adding one does not make every cached student stale. (layer_epochs and layer_texts were in
# keys as None for a while: student_legacy_settings gives those forms, still accepted.)
STUDENT_KEY_IF_SET = ("layer_epochs", "layer_texts")


def key_settings(settings: dict, if_set: Sequence[str]) -> dict:
    """A stage's settings as its key holds them: those of `if_set` (added after run directories existed)
    only when set, so that adding one does not make every cached folder of that stage stale."""
    return {k: v for k, v in settings.items() if not (k in if_set and v is None)}


def teacher_settings(tc) -> dict:
    """A trained teacher stage's key settings: its config less checkpoint_steps (how often a checkpoint is
    written changes no weight; added after run directories existed)."""
    settings = typed.to_dict(tc)
    settings.pop("checkpoint_steps")
    return settings


def student_settings(s_cfg) -> dict:
    """A student stage's key settings: its config, and the content of the layer_texts set it reads (`rest`:
    the run's layer_texts stage, whose key is upstream)."""
    settings = key_settings(typed.to_dict(s_cfg), STUDENT_KEY_IF_SET)
    if s_cfg.layer_texts and s_cfg.layer_texts != LAYER_TEXTS_REST:
        settings["layer_texts_set"] = set_fingerprint(s_cfg.layer_texts)
    return settings


def student_legacy_settings(s_cfg, settings: dict) -> list[dict]:
    """The earlier forms of a student's key `settings`, which name the same training: the later settings
    added up to each point in the key as None, while each of them is unset (a student trained then is
    reused, not trained again)."""
    forms = []
    for n, name in enumerate(STUDENT_KEY_IF_SET, 1):
        if getattr(s_cfg, name) is not None:
            break
        forms.append({**settings, **dict.fromkeys(STUDENT_KEY_IF_SET[:n])})
    return forms


# Augment settings added after run directories existed (key_settings): unset, they change no row, so a transfer
# set made before they existed is reused, and with it its scores and students.
AUGMENT_KEY_IF_SET = ("words_per_variant",)


def augment_settings(a: AugmentConfig, exclude: Sequence[str]) -> dict:
    """An augment stage's key settings: those rows depend on, and the content of the files it excludes."""
    settings = {k: v for k, v in typed.to_dict(a).items() if k not in a.EXECUTION}
    return {"settings": key_settings(settings, AUGMENT_KEY_IF_SET), "exclude": [fingerprint(p) for p in exclude]}


def stage_key(name: str, settings: Any, upstream: Sequence[str]) -> str:
    payload = json.dumps({"stage": name, "settings": settings, "upstream": list(upstream)}, sort_keys=True,
                         default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class StageDef:
    """One stage of a run, declared once: its key is derived from `settings` and its upstream stages' keys.

    A stage whose key is unchanged and whose folder holds `done_file` is reused, not run again.
    """

    name: str  # as logged, e.g. students.distilled
    folder: Optional[str]  # where `run` writes (None: a stage with nothing to run and no folder)
    # what the stage's output depends on besides its upstream stages (JSON values); a callable is
    # called when the stage is reached: settings that read files an upstream stage writes (the
    # carved validation split's content, the transfer set's labels) must be one
    settings: Any
    upstream: tuple[str, ...] = ()  # names of earlier stages whose keys enter this one's
    run: Optional[Callable[[str], Any]] = None  # run(output folder); None: an input, only its key counts
    done_file: str = schema.COMPLETE_MARKER  # relative to folder: exists when the stage finished
    # the done file of earlier versions (a teacher's or student's metrics.json): it counts only in a folder
    # that has no output record (transferset.fs.output), i.e. one finished before stages wrote _COMPLETE
    legacy_done: Optional[str] = None
    # run writes local files only: a remote folder is staged in a local folder, then uploaded
    local: bool = False
    kind: Optional[str] = None  # the name hashed into the key (None: name); every student hashes "student"
    # legacy(settings) → earlier forms of those settings that name the same work: a folder whose key is one of
    # theirs is current too, and its key stands for it downstream
    legacy: Optional[Callable[[Any], list]] = None
    # resumable(folder) → whether the folder holds a killed run of this stage's work that it goes on from
    # (a teacher's checkpoint): the stage then runs with resume, and its own output protocol keeps the checkpoint
    resumable: Optional[Callable[[str], bool]] = None

    def keys(self, upstream_keys: Sequence[str]) -> tuple[str, tuple[str, ...]]:
        """(its key, the keys of its settings' legacy forms), the settings resolved once."""
        settings = self.settings() if callable(self.settings) else self.settings
        name = self.kind or self.name
        forms = self.legacy(settings) if self.legacy else []
        return stage_key(name, settings, upstream_keys), tuple(stage_key(name, f, upstream_keys) for f in forms)


@dataclass
class Stage:
    name: str
    directory: str
    key: str
    done_file: str  # relative to directory: exists when the stage finished
    # fn writes local files only: a remote directory is staged in a local folder, then uploaded
    local: bool = False
    legacy_keys: tuple[str, ...] = ()  # earlier keys of the same work (StageDef.legacy)
    resumable: Optional[Callable[[str], bool]] = None  # StageDef.resumable
    legacy_done: Optional[str] = None  # StageDef.legacy_done

    def finished(self) -> bool:
        """Whether the folder holds a finished run of its stage's work (its done file)."""
        if fs.exists(fs.join(self.directory, self.done_file)):
            return True
        return (self.legacy_done is not None and fs.exists(fs.join(self.directory, self.legacy_done))
                and not fs.exists(fs.join(self.directory, schema.MANIFEST_FILE)))

    def current_key(self) -> Optional[str]:
        """The key the finished folder holds when it is this stage's (its key or a legacy one), else None."""
        meta = fs.join(self.directory, STAGE_FILE)
        if not (fs.exists(meta) and self.finished()):
            return None
        stored = fs.read_json(meta).get("key")
        return stored if stored in (self.key, *self.legacy_keys) else None

    def is_current(self) -> bool:
        return self.current_key() is not None

    def run(self, fn: Callable[[str], None], log) -> bool:
        """Run fn(output folder) unless the stage is current; return True when it ran.

        The folder is never deleted: the stage's function, called with overwrite=True, clears what
        transferset wrote there through the output protocol (transferset.fs.output), so others' files
        in it stay. The runner removes only its own record first; written again last, after any upload,
        so a stage cut short is redone.
        """
        stored = self.current_key()
        if stored is not None:
            log(f"[{self.name}] up to date ({self.directory}, key {stored}): reused")
            return False
        fs.delete(fs.join(self.directory, STAGE_FILE))
        if self.resumable is not None and self.resumable(self.directory):
            log(f"[{self.name}] resuming → {self.directory}")
        else:
            if self.local and fs.is_remote(self.directory):
                # fn writes a local staging folder, uploaded into this one: what an earlier run wrote here
                # is cleared by the same protocol first, or files it no longer writes would stay beside
                clear_output(self.directory)
            fs.makedirs(self.directory)
            log(f"[{self.name}] running → {self.directory}")
        t0 = time.time()
        if self.local:
            with remote.local_output(self.directory) as work:
                fn(work)
        else:
            fn(self.directory)
        fs.write_json(fs.join(self.directory, STAGE_FILE), {"key": self.key, "seconds": round(time.time() - t0, 1)})
        log(f"[{self.name}] done in {time.time() - t0:.0f}s")
        return True


def run_stages(stages: Sequence[StageDef], log) -> dict[str, str]:
    """Run the declared stages in order, each reused when current; returns every stage's key by name."""
    keys: dict[str, str] = {}
    for s in stages:
        missing = [u for u in s.upstream if u not in keys]
        if missing:
            raise ValueError(f"stage {s.name}: upstream {missing} not declared before it")
        keys[s.name], legacy = s.keys([keys[u] for u in s.upstream])
        if s.run is not None:
            stage = Stage(s.name, s.folder, keys[s.name], s.done_file, s.local, legacy, s.resumable, s.legacy_done)
            stage.run(s.run, log)
            keys[s.name] = stage.current_key() or keys[s.name]  # a reused legacy key stands for it downstream
        elif s.folder:
            log(f"[{s.name}] reusing {s.folder}")
    return keys


@dataclass(frozen=True)
class StageFunctions:
    """What the stages call: the subcommands' functions; a test passes its own (a value, not a patch)."""

    teacher: Callable = train_teacher
    augment: Callable = run_augment
    score: Callable = run_score
    student: Callable = train_student
    evaluate: Callable = evaluate
    report: Callable = write_report
    # compress: (issue 28)
    export: Callable = export_model
    exits: Callable = train_exits
    prune: Callable = prune_model


def stage_beam(cfg: RunConfig) -> dict[str, BeamConfig]:
    """The Beam settings each pipeline stage runs with.

    augment and score run where the `beam:` section says (e.g. Dataflow); the dev set is a few
    hundred rows, scored once in this process (FnApiRunner), wherever the big stages run.
    """
    return {"augment": cfg.beam, "score": cfg.beam, "dev.score": BeamConfig()}


def run_pipeline(cfg: RunConfig, log=lambda m: print(m, file=sys.stderr, flush=True),
                 functions: StageFunctions = StageFunctions()) -> dict:
    """Every stage of the run, each reused when current; returns the report's table and paths.

    Selection and report never share a split: early stopping and the teacher's best epoch use the
    selection split (the carved validation rows with `validation`, else dev); the test split (the
    `test` file or the data folder's test.tsv; with `validation`, dev) is scored by every model at the
    end and by nothing else. Both are kept out of the transfer set by the leak guard.
    """
    files = resolve_data(cfg.data, cfg.test)
    if cfg.test and not fs.exists(cfg.test):
        raise ConfigError(f"test={cfg.test}: no such file")
    check_paths(cfg)
    with output_lock(cfg.run_dir, command="run"):  # one run at a time owns run_dir
        fs.makedirs(cfg.run_dir)
        fs.write_text(fs.join(cfg.run_dir, "config.yaml"), yaml.safe_dump(typed.to_dict(cfg), sort_keys=False))
        plan = plan_stages(cfg, files, functions)
        log(f"data: train {files.train}; selection split {plan.selection}; test split {plan.test or NO_TEST}")
        run_stages(plan.stages, log)
        return functions.report(plan.paths, typed.to_dict(cfg), log=log)


NO_TEST = "none: add test.tsv to the data folder, `test: FILE`, or `validation:` to report on a split no choice has seen"


@dataclass(frozen=True)
class RunPlan:
    stages: list[StageDef]  # in the order they run
    selection: str  # the split every choice is made on
    test: Optional[str]  # the split every model is scored on at the end
    paths: dict  # what the report reads


def plan_stages(cfg: RunConfig, files: DataFiles, fn: StageFunctions = StageFunctions()) -> RunPlan:
    """The run's stages as data: folders, settings, upstream stages and what each one calls."""
    run_dir, beams = cfg.run_dir, stage_beam(cfg)

    def d(*parts: str) -> str:
        return fs.join(run_dir, *parts)

    split = splits_train(cfg)
    data_dir = d("data") if split else None
    labeled = fs.join(data_dir, LABELED_FILE) if split else files.train
    unlabeled = fs.join(data_dir, UNLABELED_FILE) if split else None
    selection = fs.join(data_dir, VALIDATION_FILE) if cfg.validation is not None else files.dev
    test = files.test or (files.dev if cfg.validation is not None else None)
    # Without a split, labeled_limit reads the first N rows of train in every stage.
    limit = None if split else cfg.labeled_limit
    t = replace(cfg.teacher, limit=limit) if limit else cfg.teacher
    a = replace(cfg.augment, limit=limit) if limit else cfg.augment
    guarded = list(dict.fromkeys(p for p in (selection, files.dev, test) if p))  # no evaluation sentence in the set
    columns = list(a.column_kwargs().values())
    transfer_dir, scored_dir = d("transfer"), d("scored")
    dev_set, dev_scored = d("dev", "transfer"), d("dev", "scored")
    labels = functools.cache(lambda: transfer.label_names(transfer_dir))  # every shard's metadata: read once

    # the train file and how it is split: a stage only when a split is asked, an input key always
    stages = [StageDef(
        "data", data_dir, {"train": fingerprint(files.train), "labeled_limit": cfg.labeled_limit,
                           "unlabeled_rows": cfg.unlabeled_rows,
                           "lowres": typed.to_dict(cfg.lowres) if cfg.lowres else None,
                           "validation": _validation_key(cfg.validation),
                           "unlabeled_limit": cfg.unlabeled_limit},
        run=(lambda out: _split_stage(files.train, out, cfg)) if split else None, done_file=SPLIT_STATS_FILE)]
    def given_teacher(name: str, path: str) -> StageDef:  # a given teacher: its weights are the key
        return StageDef(name, path, {
            "path": path if fs.is_remote(path) else os.path.abspath(path),
            "weights": [fingerprint(f) for f in fs.listdir(path) if f.endswith(".safetensors")]})

    def trained_teacher(name: str, out_dir: str, tc, kind: Optional[str] = None) -> StageDef:
        # Fine-tuned locally (a staging folder when run_dir is a URL), then uploaded: the score
        # workers copy it from run_dir (fs.remote.local_teacher).
        def resumable(out: str) -> bool:
            return can_resume_teacher(tc, train=remote.local_file(labeled), dev=remote.local_file(selection),
                                      output=out)

        return StageDef(
            name, out_dir, lambda: {"settings": teacher_settings(tc), "selection": fingerprint(selection)}, ("data",),
            run=lambda out: fn.teacher(replace(tc, resume=resumable(out)), train=remote.local_file(labeled),
                                       dev=remote.local_file(selection), output=out, overwrite=True),
            legacy_done=schema.METRICS_FILE, local=True, kind=kind, resumable=resumable)

    members: list[str] = []  # an ensemble's teachers, each its own stage (cached), in score.combine's order
    if cfg.teacher_paths or cfg.teacher_seeds:
        if cfg.teacher_paths:
            member_stages = [given_teacher(f"teacher.{i}", p) for i, p in enumerate(cfg.teacher_paths)]
        else:
            member_stages = [trained_teacher(f"teacher.seed{seed}", d("teachers", f"seed{seed}"),
                                             replace(t, seed=seed), kind="teacher") for seed in cfg.teacher_seeds]
        members = [m.folder for m in member_stages]
        # "teacher" stands for them all downstream: its key is made of theirs
        stages += [*member_stages, StageDef("teacher", None, {"members": len(members)},
                                            tuple(m.name for m in member_stages))]
        teacher_dir = members[ensemble.primary(ensemble.parse_combine(cfg.score.combine, len(members)))]
    elif cfg.teacher_path:
        teacher_dir = cfg.teacher_path  # an existing directory (check_paths)
        stages.append(given_teacher("teacher", teacher_dir))
    else:
        teacher_dir = d("teacher")
        stages.append(trained_teacher("teacher", teacher_dir, t))
    # what score and the test stage get: one teacher, or the ensemble's members
    scorer = members if len(members) > 1 else (members[0] if members else teacher_dir)
    score_settings = typed.to_dict(cfg.score)
    if len(members) <= 1:  # one teacher: the key a run made before ensembles existed, so its stages are reused
        score_settings.pop("combine")
    stages += [
        StageDef("augment", transfer_dir, functools.partial(augment_settings, a, guarded), ("data",),
                 run=lambda out: fn.augment(a, inputs=[labeled], unlabeled=[unlabeled] if unlabeled else [],
                                            exclude=guarded, output=out, beam_cfg=beams["augment"], overwrite=True)),
        StageDef("score", scored_dir, score_settings, ("augment", "teacher"),
                 run=lambda out: fn.score(cfg.score, input=transfer_dir, teacher=scorer, output=out,
                                          beam_cfg=beams["score"], overwrite=True)),
        # the selection split, scored once by the teacher: students stop early on it and report their
        # agreement with the teacher on rows they never trained on; its labels are the transfer set's
        # (read once the augment stage has written them)
        StageDef("dev", dev_set, lambda: {"dev": fingerprint(selection), "columns": columns, "labels": labels()},
                 run=lambda out: write_eval_set(selection, out, labels(), **a.column_kwargs(), overwrite=True)),
        StageDef("dev.score", dev_scored, score_settings, ("dev", "teacher"), kind="score",
                 run=lambda out: fn.score(cfg.score, input=dev_set, teacher=scorer, output=out,
                                          beam_cfg=beams["dev.score"], overwrite=True)),
    ]
    # layer_texts: rest: the train file's rows no pool took, as they are (no variants), for the students'
    # phases on layer losses alone; made once, only when a student asks for it
    rest = {name for name, s_cfg in cfg.students.items() if s_cfg.layer_texts == LAYER_TEXTS_REST}
    rest_dir = d("layer_texts")
    if rest:
        as_is = replace(a, n_iter=0, unlabeled_n_iter=0, limit=None)
        stages.append(StageDef(
            "layer_texts", rest_dir, functools.partial(augment_settings, as_is, guarded), ("data",),
            run=lambda out: fn.augment(as_is, inputs=[rest_file(data_dir)], unlabeled=[], exclude=guarded, output=out,
                                       beam_cfg=beams["augment"], overwrite=True)))
    # students: trained here from the scored set (streamed from run_dir), saved locally, then uploaded
    students = {name: d("students", name) for name in cfg.students}
    stages += [StageDef(f"students.{name}", students[name], functools.partial(student_settings, s_cfg),
                        ("score", "dev.score", *(("layer_texts",) if name in rest else ())),
                        run=lambda work, s_cfg=(replace(s_cfg, layer_texts=rest_dir) if name in rest else s_cfg):
                        fn.student(s_cfg, scored_dir, dev_scored, work, overwrite=True),
                        legacy_done=schema.METRICS_FILE, local=True, kind="student",
                        legacy=functools.partial(student_legacy_settings, s_cfg))
               for name, s_cfg in cfg.students.items()]
    # compress: cheaper models made from the teacher and the students, tested and timed beside them
    compress_stages, compressed = compress_plan(cfg, fn, d, teacher_dir, students, scored_dir, dev_scored)
    stages += compress_stages
    # test: every model scored once on the held-out split, after every choice was made
    models = {"teacher": scorer, **students,  # an ensemble is evaluated as one model, its members beside
              **{name: c["path"] for name, c in compressed.items()}}
    speeds = {name: c["speed"] for name, c in compressed.items() if c["speed"] is not None}
    combine = {"combine": cfg.score.combine} if isinstance(scorer, list) else {}
    if test:
        stages.append(StageDef(
            "test", d("test"), {"test": fingerprint(test), "columns": columns, "models": list(models), **combine,
                                **({"speeds": speeds} if speeds else {})},
            ("teacher", *(f"students.{name}" for name in students), *(s.name for s in compress_stages)),
            run=lambda out: evaluate_on_test(test, models, out, a, fn.evaluate, speeds=speeds, **combine),
            done_file=TEST_RESULTS_FILE))
    paths = {"run_dir": run_dir, "teacher": teacher_dir, "transfer": transfer_dir, "scored": scored_dir,
             "students": students, "dev": selection, "test": test,
             "test_results": d("test", TEST_RESULTS_FILE) if test else None, "compressed": compressed}
    if isinstance(scorer, list):  # the report shows the ensemble and each member
        paths.update(teachers=scorer, combine=cfg.score.combine, dev_scored=dev_scored)
    return RunPlan(stages, selection, test, paths)


def _split_stage(train: str, out: str, cfg: RunConfig) -> dict:
    """The data stage: split_data writes its files by name, without the output protocol; they are cleared by
    name first, so a split that writes fewer (no validation) leaves none of an earlier one's beside them."""
    fs.delete([fs.join(out, name) for name in (LABELED_FILE, UNLABELED_FILE, VALIDATION_FILE, REST_FILE,
                                               SPLIT_STATS_FILE)])
    return split_data(train, out, cfg)


def _validation_key(validation) -> Optional[dict]:
    """The carve's settings in the data stage's key; `by: row`, the carve made before `by` existed,
    keeps the key it had then, so those run directories are reused."""
    if validation is None:
        return None
    settings = typed.to_dict(validation)
    if settings.get("by") == "row":
        settings.pop("by")
    return settings


def compress_plan(cfg: RunConfig, fn: StageFunctions, d: Callable[..., str], teacher_dir: str,
                  students: dict[str, str], scored_dir: str, dev_scored: str) -> tuple[list[StageDef], dict]:
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
        stages.append(StageDef("compress.exits", folder, typed.to_dict(e), ("teacher", "score"),
                               run=lambda out: fn.exits(teacher_dir, scored_dir, out, e, overwrite=True, progress=False)))
        made.update({f"teacher (exits, speed {s:g})": {"path": folder, "speed": s, "from": "teacher", "how": "exits"}
                     for s in c.exit_speeds})
    if c.prune is not None:
        pc = c.prune if c.prune.max_length is not None else replace(c.prune, max_length=teacher_length)
        folder = d("compressed", "teacher-pruned")
        stages.append(StageDef("compress.prune", folder, typed.to_dict(pc), ("teacher", "score", "dev.score"),
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="YAML", help="run configuration (see configs/)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="override settings, e.g. data=PATH teacher.epochs=1 students.distilled.epochs=3")


def run(args, extra: Sequence[str]) -> int:
    cfg = load_config(args.config, args.overrides)
    results = run_pipeline(cfg)
    print(results["table"])
    print(f"\nreport: {results['report']}")
    return 0
