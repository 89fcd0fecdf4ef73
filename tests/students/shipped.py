"""Students trained once per test session for the shipping tests (predict, export), and SST-2 rows.

The teacher is a tiny 4-layer BERT classifier with weights drawn with std 0.2, and the students are
trained with `transferset train` itself on 128 SST-2 train rows it scored, one epoch: real output
directories, seconds each. Why not the conftest's tiny teacher (std 0.5): its activations are so
large that onnxruntime's and PyTorch's float32 kernels differ by ~1.2e-4 on logits of ~3 (4e-5
relative). With BERT's own 0.02 the logits hardly differ between rows (std 3e-5: a row mix-up could
pass); with 0.2 they spread by ~0.07 and the runtimes differ by ~1.5e-6, as on a real teacher (the
demo's fine-tuned MiniLM: 3.5e-6).

A module that needs them calls `scored` / `trained` from its own fixture; the directories under the
session's base temp folder are reused by every later module.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from transferset.contract import schema

# The students every shipping test runs: the BiLSTM with a trimmed vocabulary (its id remapping must
# travel with it) and max-pooling, the `tang` BiLSTM (last states), a 2-layer transformer; the static
# student (tests/students/families/test_static.py).
STUDENTS = {
    "bilstm": {"student": "bilstm", "vocab": {"trim_vocab": True}, "model": {"embed_dim": 24, "hidden": 16}},
    "tang": {"student": "bilstm", "model": {"shape": "tang", "embed_dim": 24, "hidden": 12, "head_dim": 16}},
    "transformer": {"student": "transformer", "model": {"n_layer": 2}},
    # the static family (mean+max pooled vectors, an MLP), trimmed vocabulary as the BiLSTM's
    "static": {"student": "static", "vocab": {"trim_vocab": True}, "model": {"embed_dim": 24, "hidden": 16}},
}
ROWS = 128


def scored(tmp_path_factory, sst2_dir) -> tuple[str, str]:
    """(teacher directory, scored set directory), made on first use."""
    import builders
    from conftest import MAX_LENGTH, _read_train, write_scored
    from transferset.teacher.scoring import Teacher

    base = tmp_path_factory.getbasetemp() / "shipped_scored"
    teacher_dir, out = base / "teacher", base / "scored"
    if (out / schema.COMPLETE_MARKER).exists():
        return str(teacher_dir), str(out)
    builders.tiny_classifier(str(teacher_dir), num_layers=4, initializer_range=0.2)
    examples = _read_train(sst2_dir, ROWS)
    teacher = Teacher.load(str(teacher_dir), layers=(2, 4), max_length=MAX_LENGTH, forward="padded")
    scores = teacher.predict([e.text for e in examples])
    meta = {schema.META_TOKENIZER: teacher.tokenizer_info(), schema.META_HIDDEN_SPEC: teacher.hidden_spec()}
    write_scored(out, examples, scores.hidden, scores.layers, scores.logits,
                 [e.label if i % 4 else None for i, e in enumerate(examples)], teacher_meta=meta,
                 teacher_dir=str(teacher_dir))
    return str(teacher_dir), str(out)


def trained(tmp_path_factory, name: str, scored_dir: str, dev: str) -> Path:
    """The `transferset train` output directory of STUDENTS[name] (trained on first use)."""
    import yaml

    from transferset.app.cli import main

    base = tmp_path_factory.getbasetemp() / f"shipped_{name}"
    out = base / "run"
    if (out / schema.METRICS_FILE).exists():
        return out
    base.mkdir(parents=True, exist_ok=True)
    config = base / "cfg.yaml"
    config.write_text(yaml.safe_dump({"threads": 1, "report": {"latency_examples": 8}, **STUDENTS[name]}))
    rc = main(["train", "--transfer", scored_dir, "--dev", dev, "--output", str(out), "--epochs", "1",
               "--no-progress", "--config", str(config)])
    assert rc == 0
    assert json.loads((out / schema.METRICS_FILE).read_text())["student"] == STUDENTS[name]["student"]
    return out


def dev_rows(path: str, n: int) -> tuple[list[str], list[int]]:
    """The first n (sentence, label) rows of an SST-2 TSV."""
    texts, labels = [], []
    with open(path, encoding="utf-8") as fh:
        for line in fh.read().splitlines()[1:n + 1]:
            text, label = line.split("\t")
            texts.append(text)
            labels.append(int(label))
    return texts, labels


def shipped_models(tmp_path_factory, sst2_dir, dev: str, names=("bilstm", "transformer")) -> dict[str, str]:
    """{name: trained student directory} for `names`, plus "teacher": the tiny teacher that scored their set."""
    teacher, scored_dir = scored(tmp_path_factory, sst2_dir)
    out = {name: str(trained(tmp_path_factory, name, scored_dir, dev)) for name in names}
    out["teacher"] = teacher
    return out


def labels_without_transferset(code: str, cwd) -> list:
    """Run `code` (which prints a list of labels last) in a fresh Python without transferset on the path;
    fails unless neither transferset nor students was imported. → the printed labels."""
    check = "\nimport sys\nassert not [m for m in sys.modules if m.split('.')[0] in ('transferset', 'students')]\n"
    proc = subprocess.run([sys.executable, "-c", code + check], capture_output=True, text=True, cwd=cwd,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1].replace("'", '"'))
