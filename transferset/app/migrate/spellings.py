"""Settings' earlier spellings, `transferset migrate`'s alone: what each is written as now, for the one line that says
so when a config still uses one (the commands' error handler, transferset/app/cli/) and for the rules that read
run folders made before (transferset/app/migrate/rules.py). The config loads today's spellings only: an earlier one
is an unknown setting there."""
from __future__ import annotations

import re
from typing import Optional

# A student setting's earlier name → its name now, and what that line adds about the rename (by earlier name).
RENAMED = {"schedule": "phases"}
RENAME_NOTES = {"schedule": "the phase plan; the learning rate's curve is `engine: {schedule: ...}`"}
# Loss weights that were settings of their own names (`kd: 1.0`, `temperature: 2.0`): each is now a loss under
# `losses:` (temperature is kd's own setting).
LOSS_SETTINGS = ("ce", "mse", "kd", "repr", "pkd", "emb_mse", "hidden_mse", "att_mse", "att_kl", "value_kl", "cos")
# The optimizer's settings that were settings of the student's own: each is now a field of its `optim:` section.
OPTIM_SETTINGS = ("lr", "embed_lr", "weight_decay", "grad_clip")
# A student's settings that are now fields of its `vocab:`, `data:` and `report:` sections (config/student.py), by
# section: each flag keeps its name.
STUDENT_SECTIONS = {"vocab": ("tokens", "min_count", "max_vocab", "trim_vocab", "embed_init", "freeze_embeddings"),
                    "data": ("max_length", "shuffle_rows", "dev_text_b_column", "allow_incomplete"),
                    "report": ("latency_examples", "agreement_rows")}
# A BiLSTM's named shapes, which were presets (`preset: tang`): today `model: {shape: tang}` (students/families/
# bilstm.py, SHAPES); a preset is a transformer recipe's settings.
SHAPE_PRESETS = ("tang", "xtremedistil")
# The teacher's, prune's and exits' settings that are now fields of their `optim:` section (config.TrainerOptimConfig),
# by the section's place in a run config (a command's own file holds them at its top, as a student's file does).
TRAINER_OPTIM = {"teacher": ("lr", "weight_decay"), "compress.prune": ("lr", "weight_decay", "grad_clip"),
                 "compress.exits": ("lr",)}


def moved(name: str, section: str = "students") -> Optional[str]:
    """What a setting under an earlier name is now written as, its value a placeholder (the error line names the key
    alone): a student's (`section` "students"), or one of a TRAINER_OPTIM section; None: a setting of today."""
    if section in TRAINER_OPTIM:
        return f"`optim: {{{name}: VALUE}}` (the optimizer's section)" if name in TRAINER_OPTIM[section] else None
    value = "WEIGHT" if name in LOSS_SETTINGS else "VALUE"
    if name in RENAMED:
        note = f" ({RENAME_NOTES[name]})" if name in RENAME_NOTES else ""
        return f"`{RENAMED[name]}: {value}`{note}"
    if name in LOSS_SETTINGS:
        return f"`losses: {{{name}: {value}}}` (each loss with its weight; unset: ce and mse at 1.0)"
    if name == "temperature":
        return f"`losses: {{kd: {{weight: W, temperature: {value}}}}}` (kd's own setting)"
    if name in OPTIM_SETTINGS:
        return f"`optim: {{{name}: {value}}}` (the optimizer's section; the flag keeps its name)"
    for section_name, names in STUDENT_SECTIONS.items():
        if name in names:
            return f"`{section_name}: {{{name}: {value}}}` (the student's `{section_name}:` section; the flag keeps its " \
                   "name)"
    return None


# "WHERE: students.old.schedule: unknown setting; known: ..." (transferset.runtime.typed's line for a key no
# section has), the key as the config wrote it: students.NAME.KEY, teacher.KEY, compress.prune.KEY, or KEY alone in
# a command's own file
_UNKNOWN = re.compile(r"(?:^|: )((?:students\.[^.\s:]+\.|teacher\.|compress\.(?:prune|exits)\.)?)([A-Za-z_]+): "
                      r"unknown setting")


def explain(message: str) -> str:
    """A config error's message with a line after each unknown setting that is an earlier spelling: what it is
    written as now, and that `transferset migrate` converts a run folder made before."""
    out = []
    for line in message.splitlines():
        out.append(line)
        found = _UNKNOWN.search(line)
        section = found.group(1).rstrip(".") if found else ""
        now = moved(found.group(2), "students" if not section or section.startswith("students.") else section) \
            if found else None
        if now is not None:
            out.append(f"  `{found.group(1)}{found.group(2)}` is an earlier spelling: it is now {now}; rewrite it in "
                       "the config, and run `transferset migrate RUN_DIR` on a run folder made before")
    return "\n".join(out)
