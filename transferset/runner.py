"""`transferset run --config YAML [key=value ...]`: teacher → augment → score → students → report.

Each stage writes into its own folder of the run directory with a `.stage.json` holding a
content hash of its settings and of everything upstream. A rerun reuses every stage whose
hash is unchanged and complete, so after a crash or a changed student setting only what
changed is redone. Stages run the same code as the subcommands, in this process.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import yaml

from transferset import schema
from transferset.errors import UserError

STAGE_FILE = ".stage.json"
SHARED_SST2 = os.path.join("..", "shared", "data", "sst2")
HF_SST2 = ("hf:glue:sst2:train", "hf:glue:sst2:validation")

EPILOG = """examples:
  transferset run --config configs/demo.yaml
  transferset run --config configs/demo.yaml data=path/to/sst2 students.distilled.epochs=3
  transferset run --config configs/sst2_tang.yaml run_dir=runs/tang_seed1 augment.seed=1"""


# --- configuration ---------------------------------------------------------------

DEFAULTS: dict[str, Any] = {
    "run_dir": "runs/run",
    "data": None,  # folder with train.tsv and dev.tsv; None: ../shared/data/sst2, else the hub's GLUE SST-2
    "labeled_limit": None,  # first N rows of train as labeled data
    "lowres": None,  # {per_class: k, seed: s}: k labeled rows per class, the rest of train unlabeled
    "unlabeled_limit": None,  # at most N unlabeled rows (lowres)
    "teacher": {"path": None, "model": "sentence-transformers/all-MiniLM-L6-v2", "epochs": 2, "lr": 5e-5,
                "batch_size": 32, "max_length": 64, "seed": 0, "max_steps": None},
    "augment": {"recipe": "tang", "n_iter": 20, "seed": 0, "ops": None, "mlm_model": None, "workers": 1},
    "score": {"batch_size": 256, "hidden": "cls", "layers": "-1", "max_length": None,
              "forward": None},  # forward: auto | packed | padded (`score --forward`); None: auto
    "students": {},
}
STAGES = ("data", "teacher", "augment", "score", "students", "report")


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def apply_override(cfg: dict, item: str) -> None:
    if "=" not in item:
        raise UserError(f"override {item!r}: expected key=value, e.g. teacher.epochs=1")
    key, raw = item.split("=", 1)
    value = yaml.safe_load(raw) if raw else None
    node = cfg
    parts = key.split(".")
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value


def load_config(path: str, overrides: Sequence[str] = ()) -> dict:
    if not os.path.exists(path):
        raise UserError(f"{path}: no such config file (see configs/ for examples)")
    with open(path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh) or {}
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a config is a YAML mapping of settings")
    cfg = _merge(DEFAULTS, raw)
    for item in overrides:
        apply_override(cfg, item)
    validate(cfg, where=path)
    return cfg


def validate(cfg: dict, where: str) -> None:
    """Check a config without running it: unknown keys, student settings, recipes."""
    from students.trainer import TrainConfig
    from transferset.augment import AugmentConfig

    unknown = set(cfg) - set(DEFAULTS)
    if unknown:
        raise UserError(f"{where}: unknown setting(s) {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    for section in ("teacher", "augment", "score"):
        extra = set(cfg[section] or {}) - set(DEFAULTS[section])
        if extra:
            raise UserError(f"{where}: unknown {section} setting(s) {sorted(extra)}; known: {sorted(DEFAULTS[section])}")
    a = cfg["augment"]
    try:
        AugmentConfig(recipe=a["recipe"], ops=tuple(a["ops"].split(",")) if a["ops"] else None, n_iter=a["n_iter"])
    except (KeyError, ValueError) as exc:
        raise UserError(f"{where}: augment: {exc}") from None
    try:
        from transferset.teacher.scoring import check_forward_options

        check_forward_options(cfg["score"]["forward"] or "auto", None, None)
    except UserError as exc:
        raise UserError(f"{where}: score: {exc}") from None
    if not cfg["students"]:
        raise UserError(f"{where}: no students: add e.g. students: {{distilled: {{student: bilstm}}}}")
    for name, settings in cfg["students"].items():
        try:
            TrainConfig.from_dict(dict(settings or {}), where=f"{where}: students.{name}")
        except (TypeError, ValueError) as exc:
            raise UserError(f"{where}: students.{name}: {exc}") from None
    lowres = cfg["lowres"]
    if lowres is not None and (not isinstance(lowres, dict) or "per_class" not in lowres):
        raise UserError(f"{where}: lowres must look like {{per_class: 500, seed: 0}}")


def resolve_data(data: Optional[str]) -> tuple[str, str]:
    """(train, dev) inputs: `data` if given, else ../shared/data/sst2 when present, else the hub's GLUE SST-2."""
    if data:
        if data.startswith("hf:"):
            return f"{data}:train", f"{data}:validation"
        train, dev = os.path.join(data, "train.tsv"), os.path.join(data, "dev.tsv")
        for p in (train, dev):
            if not os.path.exists(p):
                raise UserError(f"data={data}: {p} not found (expected a folder with train.tsv and dev.tsv)")
        return train, dev
    if os.path.exists(os.path.join(SHARED_SST2, "train.tsv")):
        return os.path.join(SHARED_SST2, "train.tsv"), os.path.join(SHARED_SST2, "dev.tsv")
    return HF_SST2


# --- stages ------------------------------------------------------------------------

def fingerprint(path: str) -> str:
    """Content hash of an input file (or the spec itself for hub datasets)."""
    if path.startswith("hf:") or not os.path.isfile(path):
        return path
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def stage_key(name: str, settings: Any, upstream: Sequence[str]) -> str:
    payload = json.dumps({"stage": name, "settings": settings, "upstream": list(upstream)}, sort_keys=True,
                         default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass
class Stage:
    name: str
    directory: str
    key: str
    done_file: str  # relative to directory: exists when the stage finished

    def is_current(self) -> bool:
        meta = os.path.join(self.directory, STAGE_FILE)
        if not (os.path.exists(meta) and os.path.exists(os.path.join(self.directory, self.done_file))):
            return False
        with open(meta) as fh:
            return json.load(fh).get("key") == self.key

    def run(self, fn: Callable[[], None], log) -> bool:
        """Run fn unless the stage is current; return True when it ran."""
        if self.is_current():
            log(f"[{self.name}] up to date ({self.directory}, key {self.key}): reused")
            return False
        if os.path.exists(self.directory):
            shutil.rmtree(self.directory)
        os.makedirs(self.directory, exist_ok=True)
        log(f"[{self.name}] running → {self.directory}")
        t0 = time.time()
        fn()
        with open(os.path.join(self.directory, STAGE_FILE), "w") as fh:
            json.dump({"key": self.key, "seconds": round(time.time() - t0, 1)}, fh)
        log(f"[{self.name}] done in {time.time() - t0:.0f}s")
        return True


def _cli(argv: list[str], stage: str) -> None:
    from transferset.cli import main

    rc = main(argv)
    if rc != 0:
        raise UserError(f"stage {stage} failed (transferset {' '.join(argv)}): see the messages above")


def _flags(settings: dict, skip: Sequence[str] = ()) -> list[str]:
    out = []
    for k, v in settings.items():
        if k in skip or v is None:
            continue
        out.append(f"--{k.replace('_', '-')}={v}")
    return out


def split_lowres(train: str, out_dir: str, per_class: int, seed: int, unlabeled_limit: Optional[int]) -> tuple[str, str]:
    """k labeled rows per class (seeded) and the rest of train, labels dropped, as unlabeled text."""
    import numpy as np

    from transferset.sources import Example, SourceSpec, infer_label_names, read_source

    labels = infer_label_names(train)
    rows = [r for r in read_source(SourceSpec(path=train, label_names=labels)) if isinstance(r, Example)]
    rng = np.random.default_rng(seed)
    chosen: set[int] = set()
    for c in range(len(labels)):
        idx = [i for i, r in enumerate(rows) if r.label == c]
        if len(idx) < per_class:
            raise UserError(f"{train}: only {len(idx)} rows of class {labels[c]!r}, lowres asks for {per_class}")
        chosen.update(int(i) for i in rng.choice(idx, size=per_class, replace=False))
    labeled = os.path.join(out_dir, "labeled.jsonl")
    unlabeled = os.path.join(out_dir, "unlabeled.jsonl")
    n_unl = 0
    with open(labeled, "w", encoding="utf-8") as lf, open(unlabeled, "w", encoding="utf-8") as uf:
        for i, r in enumerate(rows):
            if i in chosen:
                lf.write(json.dumps({"text": r.text, "label": labels[r.label]}) + "\n")
            elif unlabeled_limit is None or n_unl < unlabeled_limit:
                uf.write(json.dumps({"text": r.text}) + "\n")
                n_unl += 1
    return labeled, unlabeled


def run_pipeline(cfg: dict, log=lambda m: print(m, file=sys.stderr, flush=True)) -> dict:
    run_dir = cfg["run_dir"]
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "config.yaml"), "w") as fh:
        yaml.safe_dump(cfg, fh, sort_keys=False)
    train, dev = resolve_data(cfg["data"])
    log(f"data: train {train}, dev {dev}")
    data_key = stage_key("data", {"train": fingerprint(train), "dev": fingerprint(dev),
                                  "labeled_limit": cfg["labeled_limit"], "lowres": cfg["lowres"],
                                  "unlabeled_limit": cfg["unlabeled_limit"]}, [])
    labeled, unlabeled = train, None
    if cfg["lowres"]:
        data_stage = Stage("data", os.path.join(run_dir, "data"), data_key, "unlabeled.jsonl")
        lr = cfg["lowres"]
        data_stage.run(lambda: split_lowres(train, data_stage.directory, int(lr["per_class"]), int(lr.get("seed", 0)),
                                            cfg["unlabeled_limit"]), log)
        labeled = os.path.join(data_stage.directory, "labeled.jsonl")
        unlabeled = os.path.join(data_stage.directory, "unlabeled.jsonl")
    limit = None if cfg["lowres"] else cfg["labeled_limit"]

    # teacher: fine-tune, or reuse a given directory
    t = dict(cfg["teacher"])
    if t.get("path"):
        teacher_dir = t["path"]
        if not os.path.isdir(teacher_dir):
            raise UserError(f"teacher.path={teacher_dir}: no such directory")
        teacher_key = stage_key("teacher", {"path": os.path.abspath(teacher_dir),
                                            "weights": [fingerprint(os.path.join(teacher_dir, f))
                                                        for f in sorted(os.listdir(teacher_dir))
                                                        if f.endswith(".safetensors")]}, [])
        log(f"[teacher] reusing {teacher_dir}")
    else:
        teacher_dir = os.path.join(run_dir, "teacher")
        teacher_key = stage_key("teacher", t, [data_key])
        argv = ["teacher", "--train", labeled, "--dev", dev, "--output", teacher_dir, "--overwrite",
                *_flags(t, skip=("path",))]
        if limit:
            argv.append(f"--limit={limit}")
        Stage("teacher", teacher_dir, teacher_key, "metrics.json").run(lambda: _cli(argv, "teacher"), log)

    # augment
    a = dict(cfg["augment"])
    transfer_dir = os.path.join(run_dir, "transfer")
    augment_key = stage_key("augment", a, [data_key])
    argv = ["augment", "--input", labeled, "--exclude", dev, "--output", transfer_dir, "--overwrite",
            *_flags(a, skip=("workers",))]
    if unlabeled:
        argv += ["--unlabeled", unlabeled]
    if limit:
        argv.append(f"--limit={limit}")
    if int(a.get("workers") or 1) > 1:
        argv += [f"--direct_num_workers={a['workers']}", "--direct_running_mode=multi_processing"]
    Stage("augment", transfer_dir, augment_key, schema.COMPLETE_MARKER).run(lambda: _cli(argv, "augment"), log)

    # score
    s = dict(cfg["score"])
    scored_dir = os.path.join(run_dir, "scored")
    score_key = stage_key("score", s, [augment_key, teacher_key])
    argv = ["score", "--input", transfer_dir, "--teacher", teacher_dir, "--output", scored_dir, "--overwrite",
            *_flags(s)]
    Stage("score", scored_dir, score_key, schema.COMPLETE_MARKER).run(lambda: _cli(argv, "score"), log)

    # students
    students = {}
    for name, settings in cfg["students"].items():
        settings = dict(settings or {})
        out = os.path.join(run_dir, "students", name)
        key = stage_key("student", settings, [score_key])

        def train_one(settings=settings, out=out, name=name):
            path = os.path.join(out, "train_config.yaml")
            with open(path, "w") as fh:
                yaml.safe_dump(settings, fh)
            _cli(["train", "--transfer", scored_dir, "--dev", dev, "--output", out, "--config", path,
                  "--overwrite"], f"students.{name}")

        Stage(f"students.{name}", out, key, "metrics.json").run(train_one, log)
        students[name] = out

    # report
    from transferset.report import write_report

    paths = {"run_dir": run_dir, "teacher": teacher_dir, "transfer": transfer_dir, "scored": scored_dir,
             "students": students, "dev": dev}
    results = write_report(paths, cfg, log=log)
    return results


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
