"""Model cards: a README.md in the Hugging Face model-card format in every teacher, student and export folder.

Written from the folder's own records (metrics.json, model/transferset.json, an export's config.json, the
scored set's Parquet metadata), so a folder found next month, or pushed to a model hub, says what it is:
YAML front matter (task, labels, base model, metrics on the selection and test splits where known), then
what it was distilled from, the transfer set's size and recipe, the training settings, latency with the
machine it was timed on, and the lines that load and run it. `transferset run` rewrites each model's card
with its test-stage figures (the report's results.json), the same figures the report shows.

The front matter is written by huggingface_hub.ModelCardData, which refuses a model-index the hub cannot parse.
Local folders and URLs alike (transferset.fs). Nothing here imports torch, students or pipelines.
"""
from __future__ import annotations

import html
import json
import os
import re
from typing import Any, Optional

import yaml
from huggingface_hub import ModelCardData

from transferset import fs
from transferset.config.precedence import loss_weight
from transferset.contract import schema

CARD_FILE = "README.md"
EXPORT_KEY = "transferset_export"  # the record an export's config.json holds (students.compress.export writes it)
TEACHER, STUDENT, EXPORT = "teacher", "student", "export"
_LATENCY_NAMES = {"batch_1": "CPU ms per example (batch 1)", "batch_64": "CPU ms per example (batch 64)"}
# model-index results name a dataset (the hub's parser requires its type and name); the split is in each metric's name
_DATASET = {"type": "custom", "name": "own labeled data"}


def _read_json(path: str) -> Optional[dict]:
    try:
        return fs.read_json(path) if fs.exists(path) else None
    except (OSError, ValueError):
        return None  # a damaged record: the card says less, it does not stop the command that saved the model


def kind_of(folder: str) -> Optional[str]:
    """teacher (a fine-tuned Hugging Face classifier with metrics.json), student (OUT/model/ and metrics.json),
    export (model.onnx), else None."""
    if fs.exists(fs.join(folder, "model.onnx")):
        return EXPORT
    if fs.isdir(fs.join(folder, schema.STUDENT_MODEL_DIR)) and fs.exists(fs.join(folder, schema.METRICS_FILE)):
        return STUDENT
    if fs.exists(fs.join(folder, schema.HF_CONFIG_FILE)):
        return TEACHER
    return None


def _set_metadata(directory: Optional[str]) -> dict:
    """The transfer set's recorded metadata (augment settings, teacher, labels), {} when it cannot be read."""
    if not directory:
        return {}
    try:
        from transferset.data import transfer  # pyarrow: only when a set is read

        return transfer.read_metadata(directory, scored=True)
    except Exception:  # noqa: BLE001 - a moved or deleted set: the card names it and says no more
        return {}


def records(folder: str) -> dict[str, Any]:
    """What the card is made of, from the folder's own files: {kind, labels, base_model, figures, ...}.

    figures: {"selection": accuracy, "test": accuracy, "latency": {batch_1, batch_64}, "machine": text}, each
    None when the folder's records do not hold it."""
    kind = kind_of(folder)
    metrics = _read_json(fs.join(folder, schema.METRICS_FILE)) or {}
    out: dict[str, Any] = {"kind": kind, "folder": folder, "figures": {"selection": None, "test": None,
                                                                       "latency": None, "machine": None}}
    if kind == TEACHER:
        config = _read_json(fs.join(folder, schema.HF_CONFIG_FILE)) or {}
        id2label = config.get("id2label") or {}
        out.update(labels=metrics.get("label_names") or [id2label[k] for k in sorted(id2label, key=int)],
                   base_model=backbone(metrics.get("base_model")) or backbone(config.get("_name_or_path")),
                   train=metrics.get("train"), selection_file=metrics.get("dev"),
                   train_rows=metrics.get("train_rows"), settings=metrics.get("config") or {})
        out["figures"]["selection"] = metrics.get("best_dev_accuracy")
    elif kind == STUDENT:
        sidecar = _read_json(fs.join(folder, schema.STUDENT_MODEL_DIR, schema.STUDENT_SIDECAR_FILE)) or {}
        t = metrics.get("transfer") or {}
        meta = _set_metadata(t.get("dir"))
        augment = meta.get(schema.META_AUGMENT_CONFIG)
        if isinstance(augment, str):
            augment = json.loads(augment)
        out.update(labels=sidecar.get("label_names") or meta.get(schema.META_LABEL_NAMES) or [],
                   teacher=t.get("teacher_id") or meta.get(schema.META_TEACHER_ID) or sidecar.get("teacher_id"),
                   family=metrics.get("student") or sidecar.get("family"),
                   parameters=metrics.get("parameters"), transfer_dir=t.get("dir"), transfer_rows=t.get("rows"),
                   labeled_rows=t.get("labeled_rows"), augment=augment or {}, selection_file=metrics.get("dev"),
                   agreement=metrics.get("teacher_agreement"), settings=metrics.get("config") or {})
        out["base_model"] = backbone(out["teacher"])
        out["figures"].update(selection=metrics.get("dev_accuracy"),
                              latency=_latency(metrics.get("latency_ms_per_example")),
                              machine=_machine(metrics.get("latency_conditions")))
    elif kind == EXPORT:
        config = _read_json(fs.join(folder, schema.HF_CONFIG_FILE)) or {}
        export = config.get(EXPORT_KEY) or {}
        id2label = config.get("id2label") or {}
        source = export.get("source")
        src = records(_model_folder(source)) if source and kind_of(_model_folder(source)) else {}
        out.update({k: v for k, v in src.items() if k not in ("kind", "folder", "figures")})
        out.update(labels=[id2label[k] for k in sorted(id2label, key=int)] or src.get("labels", []),
                   source=source, source_kind=src.get("kind"), export=export,
                   parameters=export.get("parameters", src.get("parameters")))
        if export.get("quantize") is None:  # the same function as the source: its figures stand (latency aside)
            out["figures"].update(selection=src.get("figures", {}).get("selection"),
                                  test=src.get("figures", {}).get("test"))
    out["chosen_by"] = _read_json(fs.join(folder, schema.SEARCH_CHOICE_FILE)) if kind else None
    return out


# A model hub id: NAME or OWNER/NAME (letters, digits, '-', '_', '.'), what `base_model:` must hold.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def backbone(model: Any, depth: int = 0) -> Optional[str]:
    """The hub id a model came from: `model` itself when it is one (not a local path), else what a local
    teacher folder's records say it was fine-tuned from; None when only a local path is known, so a card
    never carries its author's file system as `base_model`."""
    if not isinstance(model, str) or not model or depth > 3:
        return None
    if _HUB_ID.match(model) and not os.path.exists(model) and not model.startswith("."):
        return model
    if fs.is_remote(model) or not os.path.isdir(model):
        return None
    metrics = _read_json(os.path.join(model, schema.METRICS_FILE)) or {}
    config = _read_json(os.path.join(model, schema.HF_CONFIG_FILE)) or {}
    return backbone(metrics.get("base_model"), depth + 1) or backbone(config.get("_name_or_path"), depth + 1)


def shown_path(path: Any, folder: str) -> str:
    """`path` as a card shows it: a local path relative to the folder it shares with the model's `folder` (a run's
    teacher/ for its students), its name alone when they share none; a hub id or a URL as it is."""
    path = str(path)
    if fs.is_remote(path) or fs.is_remote(folder) or not os.path.isabs(path) and not os.path.exists(path):
        return path
    a, b = os.path.abspath(path), os.path.abspath(folder)
    common = os.path.commonpath([a, b])
    if common == os.path.dirname(common):  # only the root in common
        return os.path.basename(a.rstrip(os.sep)) or a
    return os.path.relpath(a, common) if a != common else os.path.basename(a)


def text(value: Any) -> str:
    """A recorded value as plain text in Markdown (a card's body, a table's cell): one line, HTML escaped, and
    the marks of links, emphasis, code and table cells escaped (a label `<script>` or `[x](javascript:...)` is
    shown, never run or linked)."""
    line = html.escape(" ".join(str(value).splitlines()), quote=False)
    line = re.sub(r"([\\`*\[\]|~])", r"\\\1", line)
    return re.sub(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", r"\\_", line)  # labels_only stays as it is


def code(value: Any) -> str:
    """A recorded value as one Markdown code span (shown as is: no HTML or link inside one), on one line."""
    line = " ".join(str(value).splitlines())
    fence = "`" * (max((len(run) for run in re.findall(r"`+", line)), default=0) + 1)
    pad = " " if line.startswith("`") or line.endswith("`") else ""
    return f"{fence}{pad}{line}{pad}{fence}"


def _model_folder(path: str) -> str:
    """A student's run folder for its model/ (what export and evaluate accept either way)."""
    trimmed = path.rstrip("/")
    if fs.basename(trimmed) == schema.STUDENT_MODEL_DIR:
        parent = trimmed[: -len(schema.STUDENT_MODEL_DIR)].rstrip("/")
        if parent and fs.exists(fs.join(parent, schema.METRICS_FILE)):
            return parent
    return trimmed


def _latency(cells: Optional[dict]) -> Optional[dict]:
    if not cells:
        return None
    return {k: cells[k] for k in _LATENCY_NAMES if cells.get(k) is not None} or None


def _machine(cond: Optional[dict]) -> Optional[str]:
    """The machine a latency was taken on, in words (transferset.runtime.timing's conditions)."""
    if not cond:
        return None
    threads = cond.get("threads", 1)
    parts = [f"{threads} thread{'' if threads == 1 else 's'}"]
    if cond.get("cpu_count"):
        parts.append(f"a machine of {cond['cpu_count']} CPUs")
    load = cond.get("load_average_after")
    if cond.get("busy"):
        parts.append(f"busy ({cond.get('busy_because') or 'other work'}), so slower than alone")
    elif load:
        parts.append(f"load average {load[0]:.2f}")
    return ", ".join(parts)


def figures_from_results(results: dict, name: str) -> Optional[dict]:
    """A model's card figures from a run's results.json row named `name` (the report's own figures)."""
    for row in results.get("rows", []):
        if row.get("name") == name:
            latency = {k: row.get(f"latency_{k.split('_')[1]}") for k in _LATENCY_NAMES}
            return {"selection": row.get("dev_accuracy"), "test": row.get("test_accuracy"),
                    "latency": {k: v for k, v in latency.items() if v is not None} or None,
                    "machine": _machine({**(results.get("latency_conditions") or {}),
                                         "busy": row.get("latency_busy")})}
    return None


def front_matter(rec: dict) -> dict:
    """The card's YAML header: the model hub's keys (pipeline_tag, base_model, tags, model-index) and labels."""
    fig = rec["figures"]
    metrics = []
    for split, value in (("selection", fig["selection"]), ("test", fig["test"])):
        if value is not None:
            metrics.append({"type": "accuracy", "name": f"accuracy on the {split} split", "value": float(value)})
    for key, value in (fig["latency"] or {}).items():
        metrics.append({"type": "latency", "name": _LATENCY_NAMES[key], "value": float(value)})
    meta: dict[str, Any] = {"pipeline_tag": "text-classification",
                            "library_name": "transformers" if rec["kind"] == TEACHER else "transferset",
                            "tags": ["text-classification", "transferset",
                                     *(["knowledge-distillation"] if rec["kind"] != TEACHER else []),
                                     *(["onnx"] if rec["kind"] == EXPORT else [])],
                            "labels": list(rec.get("labels") or [])}
    if rec.get("base_model"):
        meta["base_model"] = rec["base_model"]
    if metrics:
        meta["model-index"] = [{"name": fs.basename(rec["folder"].rstrip("/")) or "model", "results": [
            {"task": {"type": "text-classification", "name": "Text Classification"}, "dataset": dict(_DATASET),
             "metrics": metrics}]}]
    return meta


def _pct(value: Optional[float]) -> str:
    return "not measured" if value is None else f"{100 * value:.1f}%"


def render(rec: dict) -> str:
    """The card: front matter, then the model's story in a few short sections. Every recorded value in the body
    is escaped (`text`, `code`) and every local path is shown relative to the model (`shown_path`)."""
    kind, fig, folder = rec["kind"], rec["figures"], rec["folder"]
    name = fs.basename(folder.rstrip("/")) or "model"
    labels = ", ".join(text(label) for label in rec.get("labels") or []) or "unknown"
    base = f" (fine-tuned from {code(rec['base_model'])})" if rec.get("base_model") else ""
    meta = front_matter(rec)
    lines = ["---", ModelCardData(**meta).to_yaml(original_order=list(meta)), "---", "",
             f"# {text(name)}", ""]
    tuned = f" fine-tuned from {code(rec['base_model'])}" if rec.get("base_model") else ""
    what = {TEACHER: f"A text classifier{tuned}: the teacher of a transferset run.",
            STUDENT: f"A {text(rec.get('family'))} student distilled by transferset from the teacher "
                     f"{_path(rec.get('teacher'), folder)}{base}.",
            EXPORT: f"An ONNX export ({(rec.get('export') or {}).get('quantize') or 'float32'}) of "
                    f"{_path(rec.get('source'), folder)}, a {rec.get('source_kind') or 'model'}."}[kind]
    selection = f" ({_path(rec['selection_file'], folder)})" if rec.get("selection_file") else ""
    lines += [what, "", f"Labels, in class order: {labels}.", "", "## Accuracy and speed", "",
              f"- selection split: {_pct(fig['selection'])}{selection}", f"- test split: {_pct(fig['test'])}"]
    if fig["latency"]:
        cells = ", ".join(f"{v:.3g} ms at batch {k.split('_')[1]}" for k, v in fig["latency"].items())
        lines.append(f"- CPU latency per example: {cells}" + (f" (timed on {fig['machine']})" if fig["machine"] else ""))
    else:
        lines.append("- latency: not timed here (`transferset run`'s report times every model together)")
    if rec.get("agreement") is not None:
        lines.append(f"- agreement with the teacher: {_pct(rec['agreement'])}")
    lines += _how_it_was_made(rec, base)
    lines += ["", "## Use it", "", "```python", *_usage(kind, folder), "```", ""]
    return "\n".join(lines)


def _path(path: Any, folder: str) -> str:
    return code(shown_path(path, folder)) if path else "an unrecorded model"


def _how_it_was_made(rec: dict, base: str) -> list[str]:
    kind, folder = rec["kind"], rec["folder"]
    lines: list[str] = []
    if kind in (STUDENT, EXPORT) and rec.get("transfer_dir"):
        aug = rec.get("augment") or {}
        recipe = ",".join(aug.get("ops") or []) or aug.get("recipe") or "unknown"
        lines += ["", "## How it was made", "",
                  f"- distilled from: {_path(rec.get('teacher'), folder)}{base}",
                  f"- transfer set: {_path(rec['transfer_dir'], folder)}, {rec.get('transfer_rows')} rows "
                  f"({rec.get('labeled_rows')} with a gold label); recipe {text(recipe)}, "
                  f"{text(aug.get('n_iter', '?'))} variants per labeled example, seed {text(aug.get('seed', '?'))}",
                  f"- training: {text(_settings(rec.get('settings') or {}))}"]
    elif kind == TEACHER:
        origin = code(rec["base_model"]) if rec.get("base_model") else "a local model"
        lines += ["", "## How it was made", "",
                  f"- fine-tuned from {origin} on {_path(rec.get('train'), folder)} ({rec.get('train_rows')} rows)",
                  f"- training: {text(_settings(rec.get('settings') or {}))}"]
    if rec.get("chosen_by"):
        lines.append(_chosen_by(rec["chosen_by"]))
    if kind == EXPORT and rec.get("export"):
        e = rec["export"]
        lines.append(f"- export: opset {e.get('opset')}, max_length {e.get('max_length')}, checked against PyTorch "
                     f"(max |logit difference| {e.get('check_max_abs_diff', 0):.2g})")
    return lines


_BUDGET_UNITS = {"budget_ms": "{:g} ms per example", "budget_mb": "{:g} MB",
                 "budget_speedup": "{:g}x the teacher's speed"}
_TIMED_ON = {"onnx": "its ONNX export on ONNX Runtime", "pytorch": "the saved student in PyTorch",
             "int8": "its int8 ONNX export on ONNX Runtime", "exits": "the saved student in PyTorch"}


def budget_text(budget: dict) -> str:
    """A search's budget in words (`search:`'s budget_ms, budget_mb, budget_speedup; None: not a bound)."""
    return ", ".join(_BUDGET_UNITS[k].format(v) for k, v in budget.items() if v is not None)


def _chosen_by(c: dict) -> str:
    """The card's line for a student a search chose (its SEARCH_CHOICE_FILE, transferset/app/stages/search.py)."""
    runner_up = (f"; the runner-up, {text(c['runner_up']['name'])}, reached {_pct(c['runner_up']['accuracy'])}"
                 if c.get("runner_up") else "")
    epochs = ", ".join(str(e) for e in c.get("rungs") or [])
    return (f"- chosen by a search: budget {text(budget_text(c.get('budget') or {}))}, timed at batch 1 on one CPU "
            f"thread ({_TIMED_ON.get(c.get('runtime'), text(c.get('runtime')))}, {text(c.get('timed', 'untrained'))}: "
            f"{c.get('latency_1', float('nan')):.3g} ms); the most accurate on the selection split "
            f"({_pct(c.get('selection_accuracy'))}) of the {c.get('within_budget')} candidates within the budget "
            f"(of {c.get('candidates')}), by successive halving over {epochs} epochs{runner_up}")


_SETTINGS_SHOWN = ("student", "phases", "preset", "epochs", "optim", "batch_size", "max_length", "losses", "seed",
                   "model")


def _settings(settings: dict) -> str:
    settings = {**settings, "max_length": (settings.get("data") or {}).get("max_length")}  # the `data:` section's
    shown = {k: settings[k] for k in _SETTINGS_SHOWN if settings.get(k) not in (None, {}, "")}
    if isinstance(shown.get("losses"), dict):
        shown["losses"] = _losses(shown["losses"])
    return ", ".join(f"{k} {v}" for k, v in shown.items()) or "not recorded"


def _losses(losses: dict) -> str:
    """`losses:` as the card says it: each loss with a non-zero weight, its own settings after it (kd 1.0 at
    temperature 2.0)."""
    def one(name, value):
        value = value if isinstance(value, dict) else {"weight": value}
        rest = "".join(f" at {k} {v}" for k, v in value.items() if k != "weight")
        return f"{name} {value.get('weight')}{rest}"

    return " + ".join(one(k, v) for k, v in losses.items() if loss_weight(v))


def _usage(kind: str, folder: str) -> list[str]:
    if kind == TEACHER:
        return ["from transformers import pipeline", f"classify = pipeline('text-classification', model={folder!r})",
                "print(classify('a charming and funny film'))"]
    return ["from students.student import Student", f"model = Student.from_pretrained({folder!r})",
            "print(model.predict(['a charming and funny film']).labels)"]


def write_card(folder: str, figures: Optional[dict] = None, shown_as: Optional[str] = None) -> Optional[str]:
    """Write FOLDER/README.md from the folder's records (`figures`: a run's measured ones, which win); the
    card's path, or None when the folder holds no model this module knows. `shown_as`: the folder's final
    path, where FOLDER is a local staging folder uploaded afterwards (the card's name and loading lines)."""
    rec = records(folder)
    if rec["kind"] is None:
        return None
    rec["folder"] = shown_as or folder
    if figures:
        rec["figures"].update({k: v for k, v in figures.items() if v is not None})
    path = fs.join(folder, CARD_FILE)
    fs.write_text(path, render(rec))
    return path


def read_front_matter(path: str) -> dict:
    """A card's YAML header (what a model hub reads)."""
    text = fs.read_text(path)
    if not text.startswith("---\n"):
        raise ValueError(f"{path}: no front matter")
    return yaml.safe_load(text[4:text.index("\n---", 4)])


def update_run_cards(models: dict, results_file: str) -> list[str]:
    """Rewrite the card of every model of a run with the figures of its results.json (selection and test
    accuracy, latency and the machine): `models` holds "teacher" (its folder, or None: no card of its own),
    "students" ({name: folder}) and "compressed" ({results row name: folder})."""
    results = fs.read_json(results_file)
    folders = {"teacher": models.get("teacher")}
    folders.update({row["name"]: models["students"][name] for row in results.get("rows", [])
                    for name in models.get("students", {}) if row["name"].startswith(f"student: {name} (")})
    folders.update(models.get("compressed") or {})
    written = []
    for name, folder in folders.items():
        if folder and fs.isdir(folder):
            card = write_card(folder, figures_from_results(results, name))
            if card:
                written.append(card)
    return written
