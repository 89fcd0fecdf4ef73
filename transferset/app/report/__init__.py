"""RUN/report.html: what distillation buys, with PNG plots and the results table.

Plots: augmentation mix and variants per example (transfer set), teacher confidence
(scored set), each student's training curves with stage boundaries (its curves.png), and every model's
accuracy against its latency: the teacher, the students and the run's `compress:` models (int8 exports,
the teacher with early exits at each speed, the pruned teacher).
The run directory may be a URL: the report is written to a local folder, then uploaded.
"""
from __future__ import annotations

import html
import json
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from students.student import EXPORT_KEY
from transferset import fs
from transferset.app.report.chosen import choose, learned_from_labels_only, line, where
from transferset.app.report.latency import PYTORCH, REPORT_ROUNDS, latency_note, model_latency
from transferset.app.report.outputs import SEARCH_STUDENT, SHIPPED, Compressed, ResultRow, RunOutputs
from transferset.app.report.search import search_html, search_markdown, search_plot
from transferset.config import ReportConfig, RunConfig
from transferset.contract import schema
from transferset.data import transfer
from transferset.data.card import text as markdown_text
from transferset.data.splits import SPLIT_STATS_FILE
from transferset.fs.remote import local_output
from transferset.runtime import timing, typed
from transferset.sources import read_texts
from transferset.teacher import ensemble

REPORT = "report.html"
FIGURES_DIR = "report_files"
RESULTS = "results.json"
TABLE = "results.md"


def _plt():
    # The backend must be chosen before pyplot is first imported: headless, whatever the caller has.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def augmentation_plots(transfer_dir: str, out_dir: str) -> dict[str, Any]:
    combos: Counter = Counter()
    per_source: Counter = Counter()
    for batch in transfer.iter_batches(transfer_dir, columns=[schema.SOURCE_ID, schema.OPS]):
        d = batch.to_pydict()
        for sid, ops in zip(d[schema.SOURCE_ID], d[schema.OPS]):
            combos["+".join(ops) or "original"] += 1
            if ops:
                per_source[sid] += 1
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    names = sorted(combos, key=lambda k: -combos[k])
    a.barh(names[::-1], [combos[n] for n in names[::-1]], color="tab:blue")
    a.set_xlabel("rows in the transfer set")
    a.set_title("augmentation mix (ops that changed the row)")
    counts = np.array(list(per_source.values()) or [0])
    b.hist(counts, bins=range(0, int(counts.max()) + 2), color="tab:orange", align="left")
    b.set_xlabel("distinct variants kept per example")
    b.set_ylabel("examples")
    b.set_title("variants per example (after dedup and leak guard)")
    fig.tight_layout()
    path = os.path.join(out_dir, "augmentation.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return {"plot": path, "rows_per_combination": dict(combos),
            "mean_variants_per_example": float(counts.mean()) if per_source else 0.0}


def confidence_plot(scored_dir: str, out_dir: str) -> dict[str, Any]:
    conf, is_orig = [], []
    for batch in transfer.iter_batches(scored_dir, columns=[schema.TEACHER_LOGITS, schema.OPS]):
        logits = transfer.fixed_list_to_numpy(batch.column(0)).astype(np.float64)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        conf.append((p / p.sum(axis=1, keepdims=True)).max(axis=1))
        is_orig.append(np.array([len(o) == 0 for o in batch.column(1).to_pylist()]))
    c, o = np.concatenate(conf), np.concatenate(is_orig)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    bins = np.linspace(c.min() if c.size else 0, 1, 30)
    ax.hist(c[~o], bins=bins, alpha=0.7, label="augmented variants")
    ax.hist(c[o], bins=bins, alpha=0.7, label="originals")
    ax.set_xlabel("teacher confidence (max softmax probability)")
    ax.set_ylabel("rows")
    ax.legend()
    ax.set_title("teacher confidence on the transfer set")
    fig.tight_layout()
    path = os.path.join(out_dir, "teacher_confidence.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return {"plot": path, "mean_confidence_originals": float(c[o].mean()) if o.any() else None,
            "mean_confidence_variants": float(c[~o].mean()) if (~o).any() else None}


def frontier_plot(rows: list[ResultRow], out_dir: str, busy: bool = False) -> dict[str, Any]:
    """Each model's accuracy (test when the run has a test split, else selection) against its batch-64 latency."""
    split = "test" if all(r.get("test_accuracy") is not None for r in rows) else "selection"
    key = "test_accuracy" if split == "test" else "dev_accuracy"
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = {"teacher": "tab:red", "student": "tab:blue", "compressed": "tab:green"}  # by the row's kind
    for r in rows:
        if r[key] is None:
            continue
        kind = r.get("kind") or ("teacher" if r["name"].startswith("teacher") else "student")
        ax.scatter(r["latency_64"], 100 * r[key], color=colours[kind])
        ax.annotate(r["name"].replace("student: ", ""), (r["latency_64"], 100 * r[key]), fontsize=7,
                    xytext=(4, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("CPU ms per example at batch 64, 1 thread (log scale)"
                  + (": taken on a busy machine" if busy else ""))
    ax.set_ylabel(f"{split} accuracy (%)")
    ax.set_title("accuracy against latency")
    fig.tight_layout()
    path = os.path.join(out_dir, "frontier.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return {"plot": path, "split": split}


HEADER = ("model", "selection accuracy", "test accuracy", "agreement with teacher (selection split)", "parameters",
          "CPU ms/example (batch 1)", "CPU ms/example (batch 64)", "speed-up vs teacher (batch 1 / 64)",
          "speed-up vs the teacher's ONNX export (batch 1)")
BUSY = "busy"  # beside a latency taken on a busy machine (see the latency note under the table)


def pct(value: Optional[float]) -> str:
    """An accuracy as a table cell: percent with one decimal, "-" when not measured."""
    return "-" if value is None else f"{100 * value:.1f}"


def _cells(r: ResultRow) -> list[str]:
    busy = r.get("latency_busy", False)
    if r["name"] == "teacher":
        speed = "1.0× / 1.0×"
    elif r.get("speedup_1") is None or r.get("speedup_64") is None:
        speed = f"- ({BUSY} machine)" if busy else "-"
    else:
        speed = f"{r['speedup_1']:.1f}× / {r['speedup_64']:.1f}×"
    mark = f" ({BUSY})" if busy else ""
    export = "-" if r.get("speedup_1_export") is None else f"{r['speedup_1_export']:.1f}×"
    return [r.get("display", r["name"]), pct(r["dev_accuracy"]), pct(r.get("test_accuracy")),
            pct(r.get("agreement")), f"{r['parameters']:,}", f"{r['latency_1']:.2f}{mark}", f"{r['latency_64']:.3f}{mark}",
            speed, export]


def results_table(rows: list[ResultRow], cond: Optional[dict] = None, rounds: int = REPORT_ROUNDS) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    # a model's name comes from the YAML (a student's key) or a folder's name: plain text, never Markdown or HTML
    lines += ["| " + " | ".join([markdown_text(cell) for cell in _cells(r)]) + " |" for r in rows]
    if cond is not None:
        lines += ["", latency_note(cond, rounds, rows)]
    return "\n".join(lines)


def ensemble_latency(cells: Sequence[dict]) -> dict:
    """An ensemble's model_latency entry from its members': it runs every member on every row, so its
    parameters, latencies and quartiles are the sums of theirs."""
    total = {k: sum(c[k] for c in cells) for k in ("parameters", "latency_1", "latency_64")}
    for k in ("spread_1", "spread_64"):
        total[k] = [sum(c[k][0] for c in cells), sum(c[k][1] for c in cells)]
    return total


def timed_fields(m: dict, against: dict, busy: bool) -> dict:
    """A results row's parameters, latencies and speed-ups, from its model_latency entry `m` and the entry of
    the model it is compared with (`against`); a ratio of figures a busy machine bent is left out (None)."""
    return {"parameters": m["parameters"], "latency_1": m["latency_1"], "latency_64": m["latency_64"],
            "latency_spread_1": m["spread_1"], "latency_spread_64": m["spread_64"], "latency_busy": busy,
            "runtime": m.get("runtime", PYTORCH),
            "speedup_1": None if busy else against["latency_1"] / m["latency_1"],
            "speedup_64": None if busy else against["latency_64"] / m["latency_64"]}


@dataclass
class Timed:
    """What a kind's report rows read (StageKind.report_rows): the run's outputs and config, every model's latency
    (`lat`, by the name model_latency timed it under), the test split's results by model and whether the machine was
    busy while timing. The teacher's rows come first and set lat["teacher"] (an ensemble's: its members' sum)."""

    out: RunOutputs
    cfg: RunConfig
    lat: dict
    tested: dict
    busy: bool

    def test_accuracy(self, name: str) -> Optional[float]:
        return self.tested[name]["accuracy"] if name in self.tested else None


def member_rows(members: Sequence[str], lat: dict, dev_accuracy: Sequence[Optional[float]],
                tested: Optional[dict], busy: bool) -> list[ResultRow]:
    """One results row per ensemble member (timed as "teacher K"), its speed-up against the whole ensemble
    ("teacher"): dev accuracy from the scored selection split, test accuracy from the ensemble's test result."""
    whole, rows = lat["teacher"], []
    tested_members = (tested or {}).get("members") or []
    for k, path in enumerate(members):
        m = lat[f"teacher {k}"]
        rows.append({"name": f"teacher {k}", "display": f"teacher member {k}: {fs.basename(path.rstrip('/'))}",
                     "dev_accuracy": dev_accuracy[k],
                     "test_accuracy": tested_members[k]["accuracy"] if k < len(tested_members) else None,
                     "agreement": None, **timed_fields(m, whole, busy)})
    return rows


def compressed_rows(t: Timed) -> list[ResultRow]:
    """One results row per model of the run's `compress:` section (transferset/app/stages/compress.py), its speed-up against
    the teacher. Its selection accuracy is measured here, on the split the students stopped on (nothing
    was chosen with it: the pruned teacher's heads were ranked on it, which its row says)."""
    from students.evaluate import evaluate  # the report's one evaluation: only runs with a compress: section

    out, cfg, lat, tlat, busy, test_accuracy = t.out, t.cfg, t.lat, t.lat["teacher"], t.busy, t.test_accuracy
    compressed = out.compressed
    columns = {k: v for k, v in cfg.augment.column_kwargs().items() if v is not None}
    rows = []
    for name, c in compressed.items():
        # as the test stage evaluates it (transferset/app/stages/heldout.py)
        selection = evaluate(c.path, out.selection, **columns, **({"speed": c.speed} if c.speed is not None else {}))
        row = {"name": name, "kind": "compressed", "compressed": {"from": c.source, "how": c.how, "path": c.path},
               "dev_accuracy": selection["accuracy"], "test_accuracy": test_accuracy(name), "agreement": None,
               **timed_fields(lat[name], tlat, busy),
               "path": c.path if c.speed is None else None}  # a model with exits answers at any speed: not shipped
        if c.speed is not None:
            row["speed"], row["mean_layers"] = c.speed, selection.get("mean_layers")
        if c.how == "pruned":
            row["display"] = f"{name}: heads ranked on the selection split"
        if c.how == SHIPPED:  # int8 where the export's check passed it, else float32
            quantize = fs.read_json(fs.join(c.path, schema.HF_CONFIG_FILE))[EXPORT_KEY]["quantize"]
            row["display"] = f"{c.source} ({quantize or 'float32'}, ONNX)"
        rows.append(row)
    return rows


def against_teacher_export(rows: list[ResultRow], busy: bool) -> None:
    """Each row's speed-up at batch 1 against the teacher's own ONNX export (compress.ship or int8), which a user
    could ship without distilling: `speedup_1_export`, None without that export or on a busy machine."""
    export = next((r for r in rows if r.get("compressed", {}).get("from") == "teacher"
                   and r["compressed"]["how"] in (SHIPPED, "int8")), None)
    for r in rows:
        r["speedup_1_export"] = None if export is None or busy else export["latency_1"] / r["latency_1"]


def selection_texts(dev: str, text_column: Optional[str] = None) -> list[str]:
    return list(read_texts(dev, text_column=text_column, opener=fs.open))


def write_report(out: RunOutputs, cfg: RunConfig, log=print) -> dict[str, Any]:
    """report.html, results.json and results.md in the run directory (written locally, then uploaded) from what the
    run's stages made (`out`)."""
    run_dir = out.run_dir
    # A teacher ensemble: each member is timed, the ensemble is their sum
    settings = cfg.report
    rounds = settings.latency_rounds
    timed = _time_models(out, settings, teachers_of(out), out.compressed, cfg.augment.text_column)
    cond = timed["conditions"]
    busy = cond["busy"]
    log(f"[report] latency: median of {rounds} interleaved rounds, {timing.describe(cond)}")
    tested = fs.read_json(out.test_results)["models"] if out.test_results else {}
    t = Timed(out, cfg, timed["models"], tested, busy)
    rows = [row for make in (out.report_rows or ROWS) for row in make(t)]
    against_teacher_export(rows, busy)
    choice = choose(rows, settings.min_speedup)
    first = line(choice, where(run_dir)) if choice is not None else None
    if first:
        log(f"[report] {first}")
    stats = {stage: fs.read_json(fs.join(folder, schema.STATS_FILE))
             for stage, folder in (("transfer", out.transfer), ("scored", out.scored))
             if fs.exists(fs.join(folder, schema.STATS_FILE))}
    if out.data and fs.exists(fs.join(out.data, SPLIT_STATS_FILE)):  # train was split
        stats["data"] = fs.read_json(fs.join(out.data, SPLIT_STATS_FILE))
    table = (f"{first}\n\n" if first else "") + results_table(rows, cond, rounds)
    _write_files(out, cfg, rows, cond, rounds, stats, table, first)
    report = fs.join(run_dir, REPORT)
    log(f"[report] {report}")
    return {"table": table, "report": report, "rows": rows, "chosen": choice}


def _time_models(out: RunOutputs, settings: ReportConfig, teachers: dict, compressed: dict[str, Compressed],
                 text_column: Optional[str]) -> dict:
    """Every model timed at report time, interleaved: figures taken at training time, each under its own
    machine load, made two identical students differ by 2x."""
    return model_latency({**teachers, **{f"student:{name}": folder for name, folder in out.students.items()},
                          **{name: c.path for name, c in compressed.items()}},
                         selection_texts(out.selection, text_column)[:settings.latency_rows], rounds=settings.latency_rounds,
                         speeds=out.speeds())


def teachers_of(out: RunOutputs) -> dict[str, Any]:
    """The teacher's models as the report times them: an ensemble's members as "teacher K", else "teacher"."""
    members = out.ensemble_members
    return {f"teacher {k}": p for k, p in enumerate(members)} if members else {"teacher": out.teacher}


def teacher_rows(t: Timed) -> list[ResultRow]:
    """The teacher's results row, then one per ensemble member; an ensemble's latency (lat["teacher"]) is set
    here, as the sum of its members'."""
    out, members, lat, tested, busy = t.out, t.out.ensemble_members, t.lat, t.tested, t.busy
    teachers = teachers_of(out)
    if members:
        lat["teacher"] = ensemble_latency([lat[name] for name in teachers])
        # the ensemble's and each member's selection accuracy, read back from the scored selection split
        selection = ensemble.accuracies(out.dev_scored)
        teacher_dev = selection["teacher"]
    else:
        metrics = fs.join(out.teacher, schema.METRICS_FILE)
        # a teacher given by its folder (teacher_path) that transferset did not train has no metrics.json: its
        # selection accuracy is read back from the scored selection split, as an ensemble's is
        teacher_dev = fs.read_json(metrics)["best_dev_accuracy"] if fs.exists(metrics) \
            else ensemble.accuracies(out.dev_scored)["teacher"]
    tlat = lat["teacher"]
    teacher_test = tested["teacher"]["accuracy"] if "teacher" in tested else None
    rows = [{"name": "teacher", "kind": "teacher", "dev_accuracy": teacher_dev, "test_accuracy": teacher_test,
             "agreement": None, "parameters": tlat["parameters"], "latency_1": tlat["latency_1"],
             "latency_64": tlat["latency_64"], "latency_spread_1": tlat["spread_1"],
             "latency_spread_64": tlat["spread_64"], "latency_busy": busy, "runtime": tlat.get("runtime", PYTORCH),
             "path": None if members else out.teacher}]
    if members:
        rows[0]["display"] = f"teacher: ensemble of {len(members)} ({out.combine or 'mean'})"
        rows += member_rows(members, lat, selection["members"], tested.get("teacher"), busy)
    return rows


def student_rows(t: Timed) -> list[ResultRow]:
    """One results row per student, from its metrics.json, its speed-up against the teacher."""
    out, lat, tlat, test_accuracy, busy = t.out, t.lat, t.lat["teacher"], t.test_accuracy, t.busy
    metrics = {name: fs.read_json(fs.join(folder, schema.METRICS_FILE)) for name, folder in out.students.items()}
    return [{"name": f"student: {name} ({m['student']}, {m['config']['phases']})", "kind": "student",
             "dev_accuracy": m["dev_accuracy"],
             "test_accuracy": test_accuracy(name), "agreement": m.get("teacher_agreement"),
             **timed_fields(lat[f"student:{name}"], tlat, busy),
             "transfer_rows": m["transfer"]["rows"], "labeled_rows": m["transfer"]["labeled_rows"],
             "path": out.students[name], "student": name, "labels_only": learned_from_labels_only(m["config"]),
             "searched": out.search is not None and name == SEARCH_STUDENT}
            for name, m in metrics.items()]


def _write_files(out: RunOutputs, cfg: RunConfig, rows: list[ResultRow], cond: dict, rounds: int, stats: dict,
                 table: str, first: Optional[str] = None) -> None:
    """The plots, report.html, results.json and results.md, written in a local folder then uploaded to the run."""
    run_dir = out.run_dir
    busy = cond["busy"]
    with local_output(run_dir) as work:
        fig_dir = os.path.join(work, FIGURES_DIR)
        os.makedirs(fig_dir, exist_ok=True)
        curves = []
        for name, folder in out.students.items():
            src = fs.join(folder, schema.CURVES_FILE)
            if fs.exists(src):
                dst = os.path.join(fig_dir, f"curves_{name}.png")
                fs.copy_file(src, dst)
                curves.append((name, dst))
        aug = augmentation_plots(out.transfer, fig_dir)
        frontier = frontier_plot(rows, fig_dir, busy) if len(out.students) > 1 else None
        conf = confidence_plot(out.scored, fig_dir)
        search = fs.read_json(out.search) if out.search and fs.exists(out.search) else None
        if search and (plot := search_plot(search, fig_dir, _plt())):
            search["plot"] = plot
        with open(os.path.join(work, REPORT), "w", encoding="utf-8") as fh:
            fh.write(_html(table_rows=rows, aug=aug, conf=conf, curves=curves, stats=stats, run_dir=work,
                           title=run_dir, dev=out.selection, test=out.test, frontier=frontier,
                           latency=latency_note(cond, rounds, rows), search=search, first=first))
        for part in (aug, conf, *([frontier] if frontier else []), *([search] if search and "plot" in search else [])):
            # results.json names the plots where they end up
            part["plot"] = fs.join(run_dir, FIGURES_DIR, os.path.basename(part["plot"]))
        results = {"rows": rows, "latency_conditions": cond, "augmentation": aug, "teacher_confidence": conf,
                   "frontier": frontier, "stats": stats, "selection": out.selection, "test": out.test,
                   "config": typed.to_dict(cfg),
                   **({"search": search} if search else {}), "chosen": first}
        with open(os.path.join(work, RESULTS), "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2, default=str)
        with open(os.path.join(work, TABLE), "w", encoding="utf-8") as fh:
            fh.write(table + (search_markdown(search) if search else "") + "\n")


def _img(path: str, run_dir: str, alt: str) -> str:
    return f'<img src="{html.escape(os.path.relpath(path, run_dir))}" alt="{html.escape(alt)}">'


def split_line(d: dict) -> str:
    """split.json in one sentence: every line of the train file, kept or rejected, and where the kept went."""
    kept = (f"{d['train_rows']} kept: {d['validation_rows']} validation"
            f"{' (drawn per class)' if d.get('validation_stratified') else ''}, {d['labeled_rows']} labeled, "
            f"{d['unlabeled_rows']} unlabeled, {d['rest_rows']} in no pool, "
            f"{d['pool_rows_dropped_as_validation_copies']} copies and "
            f"{d['pool_rows_dropped_inside_validation_rows']} phrases of validation rows left out")
    rejected = d.get("rejected_rows", 0)
    return (f"{d.get('input_rows', d['train_rows'])} train rows read; {kept}; {rejected} rejected"
            + (f" (each with its reason in data/{d.get('rejects')})" if rejected else "") + ".")


def _split_html(d: Optional[dict]) -> list[str]:
    return ["<h2>Train file</h2>", f"<p>{html.escape(split_line(d))}</p>"] if d else []


def _html(*, table_rows, aug, conf, curves, stats, run_dir, dev, test=None, frontier=None, title=None,
          latency: str = "", search: Optional[dict] = None, first: Optional[str] = None) -> str:
    trs = ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(r)) + "</tr>" for r in table_rows]
    t = stats.get("transfer", {})
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>transferset report</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child{text-align:left}"
        "img{max-width:100%}</style></head><body>",
        f"<h1>transferset report: {html.escape(title or run_dir)}</h1>",
        *([f"<p><strong>{html.escape(first)}</strong></p>"] if first else []),
        f"<p>Selection split (early stopping, the teacher's best epoch): {html.escape(dev)}. Test split (scored "
        f"once at the end, no choice saw it): {html.escape(test or 'none')}. "
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.</p>",
        "<h2>Results</h2><table><tr>" + "".join(f"<th>{h}</th>" for h in HEADER) + "</tr>" + "".join(trs) + "</table>",
        *([f"<p>{html.escape(latency)}</p>"] if latency else []),
        *(["<h2>Accuracy against latency</h2>", _img(frontier["plot"], run_dir, "accuracy against latency")]
          if frontier else []),
        *(search_html(search, _img(search["plot"], run_dir, "searched students") if "plot" in search else "")
          if search else []),
        *_split_html(stats.get("data")),
        "<h2>Transfer set</h2>",
        f"<p>{t.get('accepted_rows', '?')} input rows accepted, {t.get('rejected_rows', '?')} rejected; "
        f"{t.get('variants_generated', '?')} variants generated, {t.get('duplicates_dropped', '?')} duplicates and "
        f"{t.get('excluded_dropped', '?')} evaluation sentences dropped; {t.get('output_rows', '?')} rows. "
        f"Mean distinct variants kept per example: {aug['mean_variants_per_example']:.1f}.</p>",
        _img(aug["plot"], run_dir, "augmentation mix"),
        "<h2>Teacher confidence</h2>", _img(conf["plot"], run_dir, "teacher confidence"),
        "<h2>Training curves</h2>",
    ]
    for name, path in curves:
        parts.append(f"<h3>{html.escape(name)}</h3>" + _img(path, run_dir, f"training curves {name}"))
    parts.append("</body></html>")
    return "\n".join(parts)


# The rows of a report written from outputs no plan made: the shipped kinds' (StageKind.report_rows)
ROWS = (teacher_rows, student_rows, compressed_rows)
