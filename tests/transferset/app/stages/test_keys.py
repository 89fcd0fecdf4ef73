"""transferset/app/stages/keys.py: one test per key rule (layout-1 folders and their conversion: test_migrate.py)."""
import dataclasses
import json

from transferset.app.stages import keys
from transferset.config import AugmentConfig, EngineConfig, ScoreConfig, StudentConfig, TeacherConfig, ValidationConfig


def test_every_setting_is_in_the_key_at_its_value_defaults_included():
    settings = keys.teacher(TeacherConfig())
    expected = {f.name for f in dataclasses.fields(TeacherConfig)} - set(keys.EXECUTION)
    assert set(settings) == expected and settings["epochs"] == TeacherConfig().epochs
    # the engine section whole, its precision at its value (`auto` is not `fp32`: layout 4 keyed it so, migrate's V4)
    assert settings["engine"] == dataclasses.asdict(TeacherConfig().engine)
    bf16, fp32 = (dataclasses.replace(TeacherConfig(), engine=dataclasses.replace(TeacherConfig().engine, precision=p))
                  for p in ("bf16", "fp32"))
    assert keys.teacher(bf16)["engine"]["precision"] == "bf16" and keys.teacher(fp32)["engine"]["precision"] == "fp32"
    assert len({json.dumps(k, sort_keys=True) for k in (settings, keys.teacher(fp32), keys.teacher(bf16))}) == 3


def test_changing_a_default_changes_the_key():
    """A default is a value like any other: a stage trained at the old one is not the same work."""
    assert keys.student(StudentConfig(epochs=StudentConfig().epochs + 1)) != keys.student(StudentConfig())
    slower = dataclasses.replace(StudentConfig().engine, warmup=0.2)
    assert keys.student(StudentConfig(engine=slower))["engine"]["warmup"] == 0.2
    assert keys.teacher(TeacherConfig(engine=EngineConfig(precision="bf16")))["engine"]["precision"] == "bf16"


def test_execution_settings_are_in_no_key():
    assert keys.teacher(TeacherConfig(checkpoint_steps=50)) == keys.teacher(TeacherConfig())
    assert keys.student(StudentConfig(resume=True, checkpoint_steps=7)) == keys.student(StudentConfig())
    assert not set(keys.EXECUTION) & set(keys.student(StudentConfig()))


def test_augment_keys_the_ops_it_uses_and_the_excluded_files():
    base = keys.augment(AugmentConfig(), ["fp"])
    assert base["exclude"] == ["fp"] and base["settings"]["n_iter"] == AugmentConfig().n_iter
    # how the MLM op runs (batch size, threads) is no row's business
    assert keys.augment(AugmentConfig(mlm_batch_size=7, torch_threads=3), ["fp"]) == base
    # the settings of an op the recipe does not use are in no key
    tang = AugmentConfig(recipe="tang")
    assert "p_mlm" not in keys.augment(tang, ["fp"])["settings"] and "p_mask" in keys.augment(tang, ["fp"])["settings"]
    assert keys.augment(AugmentConfig(recipe="tang", p_mlm=0.9), ["fp"]) == keys.augment(tang, ["fp"])
    assert keys.augment(AugmentConfig(words_per_variant=5), ["fp"]) != base


def test_score_keys_combine_only_with_an_ensemble():
    assert "combine" not in keys.score(ScoreConfig(combine="probs"), members=1)
    assert keys.score(ScoreConfig(), members=1) == keys.score(ScoreConfig(combine="probs"), members=1)
    assert keys.score(ScoreConfig(), members=3)["combine"] == "mean"  # at its default too
    assert keys.score(ScoreConfig(combine="probs"), members=3)["combine"] == "probs"


def test_score_keys_its_precision_at_its_value():
    # auto (the default), fp32 and bf16 are three keys; layout 4 keyed auto as fp32 (migrate's rules.V4)
    assert ScoreConfig().precision == "auto"
    assert [keys.score(ScoreConfig(precision=p), members=1)["precision"] for p in ("auto", "fp32", "bf16")] == \
        ["auto", "fp32", "bf16"]


def test_student_keys_its_layer_texts_set_and_its_losses_in_one_form():
    assert keys.student(StudentConfig(), layer_texts_set="abc")["layer_texts_set"] == "abc"
    plain = keys.student(StudentConfig())  # `losses:` unset: ce and mse at 1.0
    assert plain["losses"] == {"ce": {"weight": 1.0}, "mse": {"weight": 1.0}}
    # a loss at weight 0 trains nothing; a weight and its settings keyed whatever their spelling
    assert keys.student(StudentConfig(losses={"ce": 1, "mse": {"weight": 1.0}, "kd": 0.0, "repr": {"weight": 0}})) \
        == plain
    kd = keys.student(StudentConfig(losses={"kd": 1}))
    assert kd == keys.student(StudentConfig(losses={"kd": {"weight": 1.0, "temperature": 1.0}}))
    assert kd["losses"] == {"kd": {"weight": 1.0, "temperature": 1.0}}
    assert keys.student(StudentConfig(losses={"kd": {"weight": 1.0, "temperature": 2.0}})) != kd


def test_data_keys_the_train_file_and_every_carve_setting():
    class Cfg:
        labeled_limit, unlabeled_rows, lowres, unlabeled_limit = 10, None, None, None
        validation = ValidationConfig(rows=10, by="row")

    key = keys.data(Cfg, "fp")
    assert key["train"] == "fp" and key["validation"] == dataclasses.asdict(ValidationConfig(rows=10, by="row"))
    Cfg.validation = ValidationConfig(rows=10)
    assert keys.data(Cfg, "fp")["validation"]["by"] == ValidationConfig().by


def test_the_layout_record(tmp_path):
    assert keys.read_layout(str(tmp_path)) is None
    keys.write_layout(str(tmp_path))
    assert keys.read_layout(str(tmp_path)) == keys.LAYOUT
    (tmp_path / keys.LAYOUT_FILE).write_text("not json")
    assert keys.read_layout(str(tmp_path)) == -1


def test_todays_rules_and_every_earlier_layouts_are_key_rules():
    """build_plan takes any KeyRules: this module's (today's) or an earlier layout's, which migrate plans with."""
    from transferset.app.migrate.rules import RULES

    assert isinstance(keys, keys.KeyRules)
    assert all(isinstance(rules, keys.KeyRules) for rules in RULES.values())

    class NoScore:
        data = teacher = augment = student = compressed = staticmethod(lambda *a: {})
    assert not isinstance(NoScore, keys.KeyRules)
