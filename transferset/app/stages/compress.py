"""The `compress:` section's stages: each makes a model from a model of the run (the teacher: one, not an
ensemble, RunConfig refuses that) in its own folder under RUN/compressed/, tested and timed in the report as
the others are."""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from students.compress.export import Int8Refused
from transferset.app.report import compressed_rows
from transferset.app.report.outputs import SEARCH_STUDENT, SHIPPED, Compressed, RunOutputs
from transferset.app.stages.base import StageDef, StageKind, register
from transferset.app.stages.context import Run, StageFunctions
from transferset.app.stages.costs import Costing, Estimate

# An export's seconds on ONNX Runtime (the trace, int8's quantization and the check's runs on both graphs, writing):
# EXPORT_S and EXPORT_S_PER_M per million of the teacher's parameters (a student's are few: EXPORT_S alone), as
# measured on 2 cores (the MiniLM teacher's ship export 7.2 s, a BiLSTM student's 1.1-1.4 s)
EXPORT_S, EXPORT_S_PER_M = 1.5, 0.25


def export_estimate(stage: str, name: str, c: Costing) -> Estimate:
    """One export: the teacher's by its parameters (measured by the calibration), a student's at EXPORT_S."""
    params = c.rates.teacher_parameters if name == "teacher" else None
    return Estimate(stage, f"{params / 1e6:.1f} M parameters" if params else "one export",
                    EXPORT_S + (EXPORT_S_PER_M * params / 1e6 if params else 0.0))


def _int8_stage(fn: StageFunctions, name: str, source: str, out: str, length: Optional[int]) -> dict:
    """compress.int8's export of one model; a graph the check refuses stops the run saying what to change in it."""
    try:
        return fn.export(source, out, format="onnx", quantize="int8", max_length=length, overwrite=True)
    except Int8Refused as exc:
        raise Int8Refused(f"{exc}. In this run: remove {name} from compress.int8 and run it again (every finished "
                          "stage is reused)") from None


def exported(out: RunOutputs, name: str, teacher_length: Optional[int]) -> tuple[str, str, Optional[int]]:
    """An export's source (the teacher or a student, by `name`): its folder, its stage, and the tokens per row the
    export reads (the teacher's as its scored set did; a student's its own: None)."""
    if name == "teacher":
        return out.teacher, "teacher", teacher_length
    return out.students[name], f"students.{name}", None


def int8_stages(r: Run, out: RunOutputs, teacher_length: Optional[int]) -> list[StageDef]:
    stages = []
    for name in r.cfg.compress.int8:
        source, upstream, length = exported(out, name, teacher_length)
        folder = r.path("compressed", f"{name}-int8")
        stages.append(StageDef(f"compress.int8.{name}", folder, {"quantize": "int8", "max_length": length},
                               (upstream,), kind="compress.int8",
                               run=lambda work, source=source, length=length, name=name: _int8_stage(
                                   r.fn, name, source, work, length),
                               estimate=lambda c, name=name: export_estimate(f"compress.int8.{name}", name, c)))
        out.compressed[f"{name} (int8)"] = Compressed(folder, None, name, "int8")
    return stages


def _ship_stage(fn: StageFunctions, source: str, out: str, length: Optional[int]) -> dict:
    """compress.ship's export of one model: int8 where the export's check passes it, else float32."""
    try:
        return fn.export(source, out, format="onnx", quantize="int8", max_length=length, overwrite=True)
    except Int8Refused:
        return fn.export(source, out, format="onnx", max_length=length, overwrite=True)


def ship_stages(r: Run, out: RunOutputs, teacher_length: Optional[int]) -> list[StageDef]:
    """compress.ship: the teacher (not an ensemble) and every student but the search's choice (exported as it met
    the budget already), those compress.int8 names and those on `tokens: words`, each exported as it ships."""
    c = r.cfg.compress
    if not c.ship:
        return []
    # a student on words of its own (`tokens: words`) has no tokenizer an export can carry: it ships in PyTorch
    names = ([] if out.ensemble or "teacher" in c.int8 else ["teacher"]) + \
        [n for n in out.students if n != SEARCH_STUDENT and n not in c.int8 and r.cfg.students[n].vocab.tokens == "wordpiece"]
    stages = []
    for name in names:
        source, upstream, length = exported(out, name, teacher_length)
        folder = r.path("compressed", f"{name}-onnx")
        stages.append(StageDef(f"compress.ship.{name}", folder, {"quantize": "int8, else none", "max_length": length},
                               (upstream,), kind="compress.ship",
                               run=lambda work, source=source, length=length: _ship_stage(r.fn, source, work, length),
                               estimate=lambda c, name=name: export_estimate(f"compress.ship.{name}", name, c)))
        out.compressed[f"{name} (ONNX)"] = Compressed(folder, None, name, SHIPPED)
    return stages


def at_teacher_length(section, teacher_length: Optional[int]):
    """An exits: or prune: section reading rows as the scored set did, unless it sets its own max_length."""
    return section if section.max_length is not None else replace(section, max_length=teacher_length)


def exits_stages(r: Run, out: RunOutputs, teacher_length: Optional[int]) -> list[StageDef]:
    c = r.cfg.compress
    if c.exits is None:
        return []
    e = at_teacher_length(c.exits, teacher_length)
    folder = r.path("compressed", "teacher-exits")
    teacher, scored = out.teacher, out.scored
    out.compressed.update({f"teacher (exits, speed {s:g})": Compressed(folder, s, "teacher", "exits")
                           for s in c.exit_speeds})
    return [StageDef("compress.exits", folder, r.rules.compressed("exits", e), ("teacher", "score"),
                     run=lambda work: r.fn.exits(teacher, scored, work, e, overwrite=True, progress=False))]


def prune_stages(r: Run, out: RunOutputs, teacher_length: Optional[int]) -> list[StageDef]:
    c = r.cfg.compress
    if c.prune is None:
        return []
    pc = at_teacher_length(c.prune, teacher_length)
    folder = r.path("compressed", "teacher-pruned")
    teacher, scored, dev_scored = out.teacher, out.scored, out.dev_scored
    # heads: 0 removes none: the recovery alone, the teacher distilled on its own cached logits
    name = "teacher (pruned)" if pc.heads else "teacher (self-distilled)"
    out.compressed[name] = Compressed(folder, None, "teacher", "pruned" if pc.heads else "self-distilled")
    return [StageDef("compress.prune", folder, r.rules.compressed("prune", pc), ("teacher", "score", "dev.score"),
                     run=lambda work: r.fn.prune(pc, teacher, dev_scored, work, transfer_dir=scored, overwrite=True,
                                                 progress=False))]


def build(r: Run, out: RunOutputs) -> list[StageDef]:
    # the teacher's derivatives read rows as the scored set did: its logits are the exits' and the recovery's targets
    teacher_length = r.cfg.score.max_length or r.cfg.teacher.max_length
    stages = [*int8_stages(r, out, teacher_length), *ship_stages(r, out, teacher_length),
              *exits_stages(r, out, teacher_length), *prune_stages(r, out, teacher_length)]
    out.model_stages.extend(s.name for s in stages)
    return stages


KIND = register(StageKind("compress", build, after=("students",), report_rows=compressed_rows))
