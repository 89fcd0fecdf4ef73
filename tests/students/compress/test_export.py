"""`transferset export --format onnx` (students/compress/export.py) and running the export (OnnxStudent): students
trained in this test run (the BiLSTM, trimmed vocabulary and max-pool; the `tang` BiLSTM; a 2-layer
transformer) and their tiny teacher (tests/students/shipped.py), on 200 real SST-2 dev rows, alone and
as sentence pairs."""
import json
import os

import numpy as np
import pytest

from shipped import dev_rows, labels_without_transferset, scored, shipped_models
from students.compress.export import export
from students.evaluate import evaluate
from students.student import EXPORT_KEY, ONNX_FILE, OnnxStudent, Student
from transferset import testing
from transferset.app.cli import main
from transferset.contract import schema
from transferset.runtime.errors import UserError
from tolerances import reordered

pytest.importorskip("onnxruntime")

MODELS = ("bilstm", "tang", "transformer", "teacher")
# ONNX Runtime's kernels against PyTorch's, in other batches: the same sums reordered (tests/tolerances.py). The
# widest chain of these models is the BiLSTM's recurrence: one reduction of embed + hidden = 24 + 16 terms a token,
# over up to 64 tokens, then the head; a unit of logit (the 2- and 4-layer transformers' bounds are lower).
EXPORT_TOL = reordered(1.0, terms=24 + 16, reductions=64 + 2)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, sst2_dir, sst2_dev200):
    return shipped_models(tmp_path_factory, sst2_dir, sst2_dev200, ("bilstm", "tang", "transformer"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory, model_dirs):
    """name → the export directory, written by the command line."""
    root = tmp_path_factory.mktemp("onnx")
    out = {}
    for name, path in model_dirs.items():
        # The tiny teacher truncates at 64 tokens, as a student trained on its scored set does.
        extra = ["--max-length", "64"] if name == "teacher" else []
        assert main(["export", "--model", path, "--output", str(root / name), "--format", "onnx", *extra]) == 0
        out[name] = str(root / name)
    return out


@pytest.mark.parametrize("name", MODELS)
def test_exported_logits_match_pytorch_on_200_sst2_dev_rows(name, model_dirs, exported, sst2_dev200):
    texts, _ = dev_rows(sst2_dev200, 200)
    pairs = texts[::-1]  # every row a pair of two real sentences
    ours = Student.from_pretrained(model_dirs[name], max_length=64 if name == "teacher" else None)
    onnx = Student.from_pretrained(exported[name])
    assert isinstance(onnx, OnnxStudent) and onnx.label_names == ours.label_names == ["0", "1"]
    assert onnx.encoder.backend(onnx.max_length) is not None  # texts alone: the tokenizer's backend, directly
    for texts_b in (None, pairs):
        ref = ours.logits(texts, texts_b)
        got = onnx.logits(texts, texts_b, batch_size=64)
        np.testing.assert_allclose(got, ref, atol=EXPORT_TOL * max(1.0, float(np.abs(ref).max())), rtol=0)
        assert len(set(np.round(ref[:, 0], 4))) > 20  # not a constant function: a row mix-up would show
    # Batch 1 (no padding at all) goes through the same graph.
    want = ours.logits(texts[:3])
    np.testing.assert_allclose(onnx.logits(texts[:3], batch_size=1), want,
                               atol=EXPORT_TOL * max(1.0, float(np.abs(want).max())), rtol=0)
    out = onnx.predict(texts[:50])
    assert out.labels == ours.predict(texts[:50]).labels


@pytest.mark.parametrize("name", ("bilstm", "transformer"))
def test_evaluate_takes_the_export_and_agrees(name, model_dirs, exported, sst2_dev200, capsys):
    ref = evaluate(model_dirs[name], sst2_dev200)
    assert evaluate(exported[name], sst2_dev200) == {**ref, "data": sst2_dev200}
    assert main(["evaluate", "--model", exported[name], "--data", sst2_dev200, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == ref["accuracy"]


@pytest.mark.parametrize("name", ("bilstm", "transformer", "teacher"))
def test_the_graph_takes_the_tokenizers_arrays_by_name(name, exported):
    import onnx
    from transformers import AutoTokenizer

    d = exported[name]
    graph = onnx.load(os.path.join(d, ONNX_FILE)).graph
    emitted = list(AutoTokenizer.from_pretrained(d)(["a film"], return_tensors="np").keys())
    assert sorted(i.name for i in graph.input) == sorted(emitted) == ["attention_mask", "input_ids", "token_type_ids"]
    assert [o.name for o in graph.output] == ["logits"]
    for i in graph.input:  # dynamic batch and length
        assert [d.dim_param for d in i.type.tensor_type.shape.dim] == ["batch", "sequence"]
    config = json.loads(open(os.path.join(d, schema.HF_CONFIG_FILE)).read())
    assert config["id2label"] == {"0": "0", "1": "1"} and config["label2id"] == {"0": 0, "1": 1}
    info = config[EXPORT_KEY]
    assert info["format"] == "onnx" and info["opset"] == 17 and info["check_max_abs_diff"] <= 1e-4
    assert info["max_length"] == 64 and AutoTokenizer.from_pretrained(d).model_max_length == 64


SNIPPET = """\
import json
import onnxruntime as ort
from transformers import AutoTokenizer

d = {d!r}                                       # the --output of `transferset export`
tokenizer = AutoTokenizer.from_pretrained(d)
id2label = json.load(open(f"{{d}}/config.json"))["id2label"]
session = ort.InferenceSession(f"{{d}}/model.onnx")
batch = tokenizer({texts!r}, truncation=True, padding=True, return_tensors="np")
logits = session.run(None, dict(batch))[0]      # (N, C)
print([id2label[str(i)] for i in logits.argmax(-1)])
"""


@pytest.mark.parametrize("name", ("bilstm", "transformer"))
def test_the_readme_snippet_runs_with_onnxruntime_alone(name, model_dirs, exported, sst2_dev_texts, tmp_path):
    texts = sst2_dev_texts[:20]
    code = SNIPPET.format(d=exported[name], texts=texts)
    assert len(code.strip().splitlines()) <= 11
    labels = labels_without_transferset(code, tmp_path)
    assert labels == Student.from_pretrained(model_dirs[name]).predict(texts).labels


def test_export_refuses_what_it_cannot_write_faithfully(tmp_path, tmp_path_factory, sst2_dir, model_dirs, exported,
                                                        capsys):
    # An existing export is kept unless --overwrite.
    rc = main(["export", "--model", model_dirs["bilstm"], "--output", exported["bilstm"]])
    err = capsys.readouterr().err
    assert rc == 1 and "already holds a complete run of `transferset export` (an ONNX export)" in err
    assert "pass --overwrite" in err
    # An export is not a model to export again.
    with pytest.raises(UserError, match="already an ONNX export"):
        export(exported["bilstm"], str(tmp_path / "again"))
    # Word tokens have no Hugging Face tokenizer to ship beside the graph.
    from students.build import setup
    from transferset.config import StudentConfig

    s = setup(StudentConfig(**testing.small_student(vocab={"tokens": "words"})),
              scored(tmp_path_factory, sst2_dir)[1])
    Student.from_setup(s).save_pretrained(str(tmp_path / "words"))
    with pytest.raises(UserError, match="tokens: words"):
        export(str(tmp_path / "words"), str(tmp_path / "words_onnx"))
    assert not (tmp_path / "words_onnx").exists()


def test_export_onto_a_model_folder_is_refused_and_leaves_it_as_it_was(tmp_path, model_dirs, capsys):
    """`export --model STUDENT --output TEACHER_COPY` is refused, with or without --overwrite, and the teacher's
    config.json and tokenizer stay: `evaluate` on that folder still runs the teacher, not the student."""
    import shutil

    copy = tmp_path / "teacher_copy"
    shutil.copytree(model_dirs["teacher"], copy)
    before = {p.name: p.read_bytes() for p in copy.iterdir()}
    assert schema.HF_CONFIG_FILE in before
    # A model folder is never an export's to replace, not even with --overwrite (a usage error).
    for flags in ([], ["--overwrite"]):
        rc = main(["export", "--model", model_dirs["bilstm"], "--output", str(copy), *flags])
        err = capsys.readouterr().err
        assert rc == 2 and f"--output {copy} holds a model ({schema.HF_CONFIG_FILE})" in err
        assert "an export never replaces a teacher or student folder" in err
    assert {p.name: p.read_bytes() for p in copy.iterdir()} == before
    assert Student.from_pretrained(str(copy)).label_names == ["0", "1"]  # still the teacher, not an export
    assert not isinstance(Student.from_pretrained(str(copy)), OnnxStudent)


@pytest.mark.parametrize("kind", ["teacher", "student", "student model/"])
def test_export_overwrite_never_replaces_a_teacher_or_student_folder(kind, tmp_path, model_dirs, capsys):
    """`export --overwrite` onto a folder `transferset teacher` wrote keeps the teacher's weights and metrics, no
    ONNX export in their place. A teacher or student folder is refused, flags or not: one line, exit 2, before
    anything is changed."""
    import shutil

    from transferset.fs.output import MODEL_NAMES, STUDENT_NAMES, Output

    folder = tmp_path / "model"
    if kind == "teacher":  # as `transferset teacher` leaves it: its record, its files, _COMPLETE
        with Output(str(folder), "teacher", names=MODEL_NAMES).writing() as out:
            out.prepare()
            shutil.copytree(model_dirs["teacher"], folder, dirs_exist_ok=True)
            (folder / schema.METRICS_FILE).write_text('{"best_dev_accuracy": 0.9}')
    elif kind == "student":
        shutil.copytree(model_dirs["bilstm"], folder)
        assert json.loads((folder / schema.MANIFEST_FILE).read_text())["command"] == "train"
    else:  # the model/ folder inside a student's: no record of its own
        shutil.copytree(os.path.join(model_dirs["transformer"], schema.STUDENT_MODEL_DIR), folder)
    before = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    for flags in ([], ["--overwrite"]):
        rc = main(["export", "--model", model_dirs["transformer"], "--output", str(folder), *flags])
        err = capsys.readouterr().err.strip()
        assert rc == 2, (flags, err)
        assert len(err.splitlines()) == 1 and f"--output {folder} holds" in err
        assert "an export never replaces a teacher or student folder; choose another --output" in err
    assert {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before


def test_export_from_and_to_a_remote_scheme(model_dirs, exported, tmp_path, monkeypatch):
    """tsfake:// (tests/fake_remote.py) stands for gs://: the model is copied in, the export uploaded."""
    import shutil

    import fake_remote

    monkeypatch.setenv("TRANSFERSET_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    fake_remote.use_root(str(tmp_path / "bucket"))
    shutil.copytree(model_dirs["bilstm"], fake_remote.local(fake_remote.url("bilstm")))
    out = export(fake_remote.url("bilstm"), fake_remote.url("onnx/bilstm"))
    assert out["onnx_bytes"] > 0
    local = fake_remote.local(fake_remote.url("onnx/bilstm"))
    assert sorted(os.listdir(local)) == sorted(os.listdir(exported["bilstm"]))
    texts = ["a gripping film", "dull , dull , dull"]
    np.testing.assert_allclose(Student.from_pretrained(local).logits(texts),
                               Student.from_pretrained(exported["bilstm"]).logits(texts), atol=1e-6)
    assert not (tmp_path / "tsfake:").exists()


@pytest.mark.parametrize("pool", ["max", "last"])
def test_a_two_layer_bilstm_graph_runs_each_layer_within_each_rows_length(tmp_path, pool):
    """BiLSTMGraph: one ONNX LSTM per layer with the rows' lengths (no sort, no packing); on rows of
    different lengths, padded together, onnxruntime gives the PyTorch model's logits row by row."""
    import onnx
    import onnxruntime as ort
    import torch

    from students.families.bilstm import BiLSTM, BiLSTMConfig
    from students.families.bilstm_onnx import BiLSTMGraph

    torch.manual_seed(0)
    model = BiLSTM(BiLSTMConfig(vocab_size=50, embed_dim=12, hidden=7, layers=2, pool=pool, head_dim=9)).eval()
    lengths = torch.tensor([5, 1, 9, 3])
    ids = torch.randint(1, 50, (4, 9)) * (torch.arange(9) < lengths[:, None])
    mask = (ids != 0).long()
    path = str(tmp_path / "m.onnx")
    with torch.no_grad():
        torch.onnx.export(BiLSTMGraph(model, None).eval(), (ids, mask), path, input_names=["input_ids", "attention_mask"],
                          output_names=["logits"], dynamic_axes={"input_ids": {0: "b", 1: "t"},
                                                                 "attention_mask": {0: "b", 1: "t"}},
                          opset_version=17, dynamo=False)
        nodes = onnx.load(path).graph.node
        ops = [n.op_type for n in nodes]
        assert ops.count("LSTM") == 2 and "TopK" not in ops and "ScatterElements" not in ops
        read = {name for n in nodes for name in n.input}
        top = [n for n in nodes if n.op_type == "LSTM"][-1]
        # `pool: last` reads the top layer's final states (Y_h) and never its per-step output (Y).
        assert (top.output[0] in read, top.output[1] in read) == ((True, False) if pool == "max" else (False, True))
        got = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(
            None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
        alone = torch.cat([model(ids[i:i + 1, :n], mask[i:i + 1, :n])["logits"] for i, n in enumerate(lengths.tolist())])
    # ONNX Runtime's LSTM against PyTorch's rows alone: reordered sums (tests/tolerances.py)
    np.testing.assert_allclose(got, alone.numpy(), atol=EXPORT_TOL * max(1.0, float(np.abs(alone.numpy()).max())),
                               rtol=0)
