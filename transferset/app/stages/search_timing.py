"""The search's untrained timing (transferset/app/stages/search.py, step 1): every candidate built untrained, saved
in a temporary folder, timed as the report times models and sized, with its int8 export and a transformer's early
exits as variants of their own.

The plan (app/planning/time_budget.py) takes this timing too (`probe`), so that it counts only the variants in budget:
- once the search's inputs are there (every stage upstream reused), on the run's teacher and scored set, and the
  search stage that follows in the same process takes that timing instead of timing again (`timed_untrained`);
- before them (a fresh run), on the teacher's model as the run starts from it (the teacher's base model before
  its training, or the teacher given) and the plan's sample of train rows (`before_scoring`): the candidates'
  shapes, and so their speed and size, are those they will have on the trained teacher. The search times them
  again once the teacher and the scored set are made.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import replace
from typing import Any, Collection, Optional, Sequence

from students import families
from students.build import setup
from students.compress.export import Int8Refused
from students.data import ScoredSet
from students.families.exits import check_bert_like, first_exit_branches
from students.student import Student
from transferset import fs
from transferset.app.report.latency import model_latency
from transferset.app.report import selection_texts
from transferset.app.report.outputs import RunOutputs
from transferset.app.stages.base import stage_key
from transferset.app.stages.context import Run, teacher_source
from transferset.app.stages.students import student_settings
from transferset.config import DEFAULT_MAX_LENGTH, StudentConfig
from transferset.config.search import SearchConfig
from transferset.contract import schema
from transferset.runtime import typed
from transferset.runtime.errors import UserError

INT8 = "+int8"  # a candidate's int8 variant: its ONNX export, quantized (`search.int8`)
EXITS = "+exits@"  # a transformer candidate's early-exit variant at a speed (`search.exit_speeds`): NAME+exits@0.5


def folder_mb(path: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files) / 1e6


def exits_variants(name: str, cfg: StudentConfig, sc: SearchConfig) -> dict[str, float]:
    """A candidate's early-exit variants → their speeds (only a transformer's: exits take BERT-like encoders)."""
    return {f"{name}{EXITS}{speed:g}": speed for speed in sc.exit_speeds} if cfg.student == "transformer" else {}


def exits_bound(student: Student, target: str) -> Optional[str]:
    """`student` saved in `target` with branches that send every row out at the first (timed, the lower bound of
    its exits' latency), or why early exits do not apply to it."""
    try:
        check_bert_like(student.model, "early exits")
    except UserError as exc:
        return f"no early exits: {exc}"
    branches = first_exit_branches(student.model, len(student.label_names))
    Student(student.model, student.tokens, student.label_names, student.family, student.config, student.teacher_id,
            exits=branches).save_pretrained(target)
    return None


def int8_export(r: Run, source: str, target: str) -> Optional[str]:
    """`source` exported to ONNX and quantized to int8 in `target`, or why the export's check refused it."""
    try:
        r.fn.export(source, target, format="onnx", quantize="int8", overwrite=True)
    except Int8Refused as exc:
        return f"int8 export refused: {exc}"
    return None


def timing_texts(r: Run, out: RunOutputs) -> list[str]:
    """The selection rows every variant is timed on (`search.timing_rows`)."""
    return selection_texts(out.selection, r.augment.text_column)[:r.cfg.search.timing_rows]


def time_candidates(r: Run, configs: dict[str, StudentConfig], teacher: str, scored: Any, texts: Sequence[str],
                    log, members: bool = False, dropped: Collection[str] = ()) -> tuple[dict[str, dict], dict]:
    """Every candidate built untrained on `scored` (a scored set's folder, or a ScoredSet) with `teacher` as its
    teacher where it names none (`members`: an ensemble's set, whose students keep the set's record; the teacher is
    still the one a speed-up budget times), its tokens as training would start; a BiLSTM's or static
    student's table left random: its values do not change its speed, and `contextual` vectors would cost a pass of
    the teacher. Saved in a temporary folder, timed on `texts` and sized, its int8 export with `search.int8`, a
    transformer's exits at their lower bound with `search.exit_speeds`; the teacher timed beside them when the
    budget is a speed-up → (each variant's figures, or why it cannot be made, the load they were timed under). The
    variants in `dropped` (those the teacher cannot give: search_space.py) are left out."""
    sc = r.cfg.search
    models, sized, refused, speeds = {}, {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="transferset-search-") as folder:
        for name, cfg in configs.items():
            saved = sized[name] = fs.join(folder, "untrained", name)
            if families.get(cfg.student).shaped is not None:
                cfg = replace(cfg, vocab=replace(cfg.vocab, embed_init="random"))
            given = cfg if cfg.teacher is not None or members else replace(cfg, teacher=teacher)
            student = Student.from_setup(setup(given, scored))
            student.save_pretrained(saved)
            models[name] = saved
            if variants := {v: speed for v, speed in exits_variants(name, cfg, sc).items() if v not in dropped}:
                bound = fs.join(folder, "untrained-exits", name)
                why = exits_bound(student, bound)
                for variant, speed in variants.items():
                    sized[variant], refused[variant] = bound, why
                    if why is None:
                        models[variant], speeds[variant] = bound, speed
            if sc.runtime == "onnx":
                models[name] = fs.join(folder, "untrained-onnx", name)
                r.fn.export(saved, models[name], format="onnx", overwrite=True)
            if sc.int8:
                quantized = sized[name + INT8] = fs.join(folder, "untrained-int8", name)
                refused[name + INT8] = int8_export(r, saved, quantized)
                if refused[name + INT8] is None:
                    models[name + INT8] = quantized
        if sc.budget_speedup is not None:
            models["teacher"] = teacher
        log(f"[search] timing {len(models) - (sc.budget_speedup is not None)} untrained variants of {len(configs)} "
            f"candidates ({sc.runtime}{', and int8 exports' if sc.int8 else ''}"
            f"{', and early exits' if speeds else ''}) on {len(texts)} rows")
        timed = model_latency(models, list(texts), rounds=sc.timing_rounds, speeds=speeds)
        mb = {name: folder_mb(path) for name, path in sized.items()}
    lat = timed["models"]
    teacher_ms = lat["teacher"]["latency_1"] if "teacher" in lat else None
    return {name: ({"refused": refused[name]} if refused.get(name) else
                   {"latency_1": lat[name]["latency_1"], "parameters": lat[name]["parameters"],
                    "mb": mb[name], "teacher_ms": teacher_ms, "runtime": lat[name]["runtime"],
                    **({"speed": speeds[name]} if name in speeds else {})})
            for name in sized}, timed["conditions"]


def on_run(r: Run, out: RunOutputs, configs: dict[str, StudentConfig], log,
           dropped: Collection[str] = ()) -> tuple[dict[str, dict], dict]:
    """The untrained timing on the run's teacher, scored set and selection rows."""
    return time_candidates(r, configs, out.teacher, out.scored, timing_texts(r, out), log, members=bool(out.members),
                           dropped=dropped)


# the untrained timing the plan took (`probe`), by timing_key: the search stage that follows in the same process
# takes it instead of timing again
_PROBED: dict[str, tuple[dict[str, dict], dict]] = {}


def timing_key(r: Run, out: RunOutputs, configs: dict[str, StudentConfig]) -> str:
    """What the untrained timing depends on: the candidates' settings, the timing's own, and the keys the teacher's
    and the scored sets' folders record (a given teacher: its path)."""
    sc = r.cfg.search
    inputs = [fs.read_json(fs.join(d, schema.STAGE_FILE)).get("key", d) if fs.exists(fs.join(d, schema.STAGE_FILE))
              else d for d in (out.teacher, out.scored, out.dev_scored)]
    given = typed.to_dict(sc)
    settings = {"candidates": {n: student_settings(r.rules, c) for n, c in configs.items()},
                **{k: given[k] for k in ("runtime", "int8", "exit_speeds", "timing_rows", "timing_rounds")},
                "teacher_timed": sc.budget_speedup is not None}
    return stage_key("search.timing", settings, inputs)


def probe(r: Run, out: RunOutputs, configs: dict[str, StudentConfig], ready: bool,
          sample: Sequence[str], dropped: Collection[str] = ()) -> Optional[dict]:
    """The candidates timed untrained for the plan (StageDef.probe), so that it counts only those in budget:
    {"variants": each variant's figures, "before": None, or what the timing stood in for (`before_scoring`),
    "seconds": what the timing took}. `ready`: every stage upstream is reused (the timing is kept for the search
    stage of this process); else on the teacher's model before its training and `sample` (the plan's train rows),
    or None where that cannot be built."""
    started = time.perf_counter()
    if ready:
        key = timing_key(r, out, configs)
        _PROBED[key] = on_run(r, out, configs, r.log, dropped)
        timed, before = _PROBED[key][0], None
    else:
        timed, before = before_scoring(r, configs, sample, dropped)
        if timed is None:
            return None
    return {"variants": timed, "before": before, "seconds": time.perf_counter() - started}


def timed_untrained(r: Run, out: RunOutputs, configs: dict[str, StudentConfig], log,
                    dropped: Collection[str] = ()) -> tuple[dict[str, dict], dict]:
    """The plan's timing of these very candidates on these inputs (`probe`), else a timing now."""
    taken = _PROBED.pop(timing_key(r, out, configs), None)
    if taken is None:
        return on_run(r, out, configs, log, dropped)
    log(f"[search] the plan's timing of {len(taken[0])} untrained variants, reused")
    return taken


def before_scoring(r: Run, configs: dict[str, StudentConfig], sample: Sequence[str], dropped: Collection[str] = ()
                   ) -> tuple[Optional[dict[str, dict]], str]:
    """The untrained timing before the teacher and the scored set are made: each candidate built on the teacher's
    model as the run starts from it (`teacher_source`) and timed on `sample`. A scored set's record stands in for
    the set that is not there yet: the teacher, the scoring's max_length, the labels, the teacher's width; no
    rows. → (the timing, or None with a log line where a candidate cannot be built so, e.g. one whose vocabulary
    comes from the transfer set; what the timing stood in for)."""
    cfg = r.cfg
    teacher = teacher_source(cfg)
    trained = not (cfg.teacher_path or cfg.teacher_paths)
    before = "on the teacher's base model, before its training" if trained else "on the teacher, before the scoring"
    texts = list(sample)[:cfg.search.timing_rows]
    if not texts:
        return None, before
    try:
        from transformers import AutoConfig

        width = int(AutoConfig.from_pretrained(teacher, trust_remote_code=cfg.teacher.trust_remote_code).hidden_size)
        labels = list(r.teacher.labels or ("0", "1"))
        with tempfile.TemporaryDirectory(prefix="transferset-plan-") as empty:
            meta = {schema.META_TEACHER_ID: teacher, schema.META_LABEL_NAMES: labels,
                    schema.META_MAX_LENGTH: cfg.score.max_length or cfg.teacher.max_length or DEFAULT_MAX_LENGTH}
            scored = ScoredSet(empty, meta, labels, [*schema.TRANSFER_COLUMNS, *schema.TEACHER_COLUMNS], width,
                               len(texts), len(texts))
            return time_candidates(r, configs, teacher, scored, texts, r.log, dropped=dropped)[0], before
    except Exception as exc:  # noqa: BLE001 - the plan then counts every candidate, as it says
        r.log(f"[plan] the search's candidates could not be timed {before} ({type(exc).__name__}: {exc}); the plan "
              "counts every candidate")
        return None, before
