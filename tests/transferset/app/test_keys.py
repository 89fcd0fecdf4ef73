"""transferset/app/keys.py: one test per key rule (the keys of run directories made before: test_keys_frozen.py)."""
import dataclasses
from dataclasses import fields

import pytest

from transferset.app import keys
from transferset.config import (AugmentConfig, ExitsConfig, PruneConfig, ScoreConfig, StudentConfig, TeacherConfig,
                                ValidationConfig)


@pytest.mark.parametrize("kind, cls", [("teacher", TeacherConfig), ("augment", AugmentConfig), ("score", ScoreConfig),
                                       ("student", StudentConfig), ("exits", ExitsConfig), ("prune", PruneConfig),
                                       ("validation", ValidationConfig)])
def test_frozen_names_only_settings_that_exist(kind, cls):
    """A misspelt FROZEN name would leave a setting out of old keys while at its default, silently. (The settings
    that moved into the engine section are there under their old names: keys.ENGINE_LEGACY.)"""
    assert set(keys.FROZEN[kind]) - set(keys.ENGINE_LEGACY.get(kind, ())) <= {f.name for f in fields(cls)}


@pytest.mark.parametrize("kind, cls", [("teacher", TeacherConfig), ("student", StudentConfig), ("exits", ExitsConfig),
                                       ("prune", PruneConfig)])
def test_an_engine_at_the_trainers_defaults_keys_as_its_flat_settings_did(kind, cls):
    """The engine section took over the teacher's warmup, the students' device / bf16 / report_to and prune's
    device: at a trainer's default engine they are in its key under those names, and no `engine` entry is."""
    old_default = dataclasses.replace(cls().engine, **keys.ENGINE_KEY_DEFAULT.get(kind, {}))
    settings = keys.section(kind, cls(engine=old_default))
    assert "engine" not in settings and set(keys.ENGINE_LEGACY[kind]) <= set(settings)
    changed = keys.section(kind, cls(engine=dataclasses.replace(old_default, grad_accum=4)))
    assert changed["engine"] == {"grad_accum": 4}


def test_a_bilstm_at_the_new_default_schedule_gets_a_new_key_and_one_set_to_constant_keeps_its_old_one():
    """A BiLSTM's default became linear warm-up 0.1 (issue 44); a BiLSTM trained before at the constant rate must
    not be reused for it, and one set back to the constant rate must be. Transformers keep the constant rate
    (the presets too) and their keys."""
    from transferset import typed

    default = typed.load(StudentConfig, {}, "student")
    assert (default.engine.schedule, default.engine.warmup) == ("linear", 0.1)
    assert keys.student(default)["engine"] == {"schedule": "linear", "warmup": 0.1}
    assert typed.load(StudentConfig, {"engine": {"grad_accum": 2}}, "student").engine.schedule == "linear"
    constant = typed.load(StudentConfig, {"engine": {"schedule": "constant", "warmup": 0}}, "student")
    assert "engine" not in keys.student(constant)
    for values in ({"student": "transformer"}, {"preset": "tinybert"}, {"preset": "distilbert"}):
        transformer = typed.load(StudentConfig, values, "student")
        assert (transformer.engine.schedule, transformer.engine.warmup) == ("constant", 0.0), values
        assert "engine" not in keys.student(transformer), values
    linear = typed.load(StudentConfig, {"preset": "tinybert", "engine": {"schedule": "linear", "warmup": 0.1}}, "s")
    assert keys.student(linear)["engine"] == {"schedule": "linear", "warmup": 0.1}


def test_a_setting_not_frozen_enters_the_key_only_when_it_differs_from_its_default(monkeypatch):
    student = StudentConfig(epochs=3)
    assert keys.section("student", student)["epochs"] == 3 and "epochs" in keys.FROZEN["student"]
    monkeypatch.setitem(keys.FROZEN, "student", tuple(k for k in keys.FROZEN["student"] if k not in ("epochs", "lr")))
    settings = keys.section("student", student)
    assert settings["epochs"] == 3  # not at its default
    assert "lr" not in settings  # at its default (None)
    assert settings["batch_size"] == 64  # frozen: in the key at its default


def test_teacher_checkpoint_steps_is_in_no_key():
    assert keys.teacher(TeacherConfig(checkpoint_steps=50)) == keys.teacher(TeacherConfig())
    assert keys.teacher(TeacherConfig(epochs=2)) != keys.teacher(TeacherConfig())
    assert "checkpoint_steps" not in keys.teacher(TeacherConfig(checkpoint_steps=50))


def test_augment_execution_settings_are_in_no_key_and_words_per_variant_only_when_set():
    base = keys.augment(AugmentConfig(), ["fp"])
    assert base["exclude"] == ["fp"]
    assert set(AugmentConfig.EXECUTION) and not set(AugmentConfig.EXECUTION) & set(base["settings"])
    assert keys.augment(AugmentConfig(mlm_batch_size=7, torch_threads=3), ["fp"]) == base
    assert "words_per_variant" not in base["settings"]
    assert keys.augment(AugmentConfig(words_per_variant=5), ["fp"])["settings"] == {**base["settings"],
                                                                                    "words_per_variant": 5}


def test_score_combine_is_in_the_key_only_with_an_ensemble():
    assert "combine" not in keys.score(ScoreConfig(combine="probs"), members=1)
    assert keys.score(ScoreConfig(), members=1) == keys.score(ScoreConfig(combine="probs"), members=1)
    assert keys.score(ScoreConfig(), members=3)["combine"] == "mean"  # at its default too
    assert keys.score(ScoreConfig(combine="probs"), members=3)["combine"] == "probs"


def test_student_layer_epochs_and_layer_texts_once_in_keys_as_none_give_legacy_forms():
    cfg = StudentConfig()
    settings = keys.student(cfg)
    assert "layer_epochs" not in settings and "layer_texts" not in settings
    assert keys.student_legacy(cfg, settings) == [{**settings, "layer_epochs": None},
                                                  {**settings, "layer_epochs": None, "layer_texts": None}]
    set_epochs = StudentConfig(layer_epochs=3)
    assert keys.student(set_epochs)["layer_epochs"] == 3
    assert keys.student_legacy(set_epochs, keys.student(set_epochs)) == []  # no earlier form trained that
    with_texts = StudentConfig(layer_texts="somewhere")
    assert keys.student_legacy(with_texts, keys.student(with_texts)) == [
        {**keys.student(with_texts), "layer_epochs": None}]


def test_a_students_layer_texts_set_fingerprint_enters_its_key():
    assert keys.student(StudentConfig(), layer_texts_set="abc")["layer_texts_set"] == "abc"


def test_a_loss_at_weight_0_leaves_the_students_key_as_it_was():
    plain = keys.student(StudentConfig())
    assert "losses" not in plain
    assert keys.student(StudentConfig(losses={"new_loss": 0.0})) == plain
    assert keys.student(StudentConfig(losses={"new_loss": {"weight": 0.0, "scale": 3.0}})) == plain
    assert keys.student(StudentConfig(losses={"new_loss": 0.5, "other": 0}))["losses"] == {"new_loss": 0.5}


def test_a_validation_carved_by_row_keeps_the_key_from_before_by_existed():
    assert keys.validation(None) is None
    assert keys.validation(ValidationConfig(rows=10, by="row")) == {"rows": 10, "seed": 0}
    assert keys.validation(ValidationConfig(rows=10)) == {"rows": 10, "seed": 0, "by": "sentence"}


def test_a_misspelt_registered_loss_is_refused_when_the_config_loads(tmp_path):
    from transferset.app.runner import load_config
    from transferset.errors import ConfigError

    with pytest.raises(ConfigError, match=r"students.distilled.losses: unknown loss 'kdd'; known: att_kl, .*, kd, mse, "):
        load_config("configs/demo.yaml", [f"run_dir={tmp_path}", "students.distilled.losses={kdd: 1.0}"])
