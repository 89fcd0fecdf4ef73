"""transferset.config: the typed settings, their flags and --help, and the checks on load."""
import argparse
import dataclasses
import re

import pytest

from transferset import typed
from transferset.app import flags
from transferset.errors import ConfigError
from transferset.config import (AugmentConfig, BeamConfig, ExitsConfig, PredictConfig, RunConfig, ScoreConfig,
                                PruneConfig, StudentConfig, TeacherConfig)

STAGES = (AugmentConfig, TeacherConfig, ScoreConfig, StudentConfig, BeamConfig, PredictConfig, ExitsConfig)


@pytest.mark.parametrize("cls", STAGES, ids=lambda c: c.__name__)
def test_every_setting_has_a_flag_with_help_and_the_dataclass_default(cls):
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser, cls)
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    for f in dataclasses.fields(cls):
        if (cls, f.name) in ((StudentConfig, "model"), (StudentConfig, "losses"), (BeamConfig, "options")):  # YAML only
            assert f.name not in actions
            continue
        if f.name == "engine":  # a section: a flag per field of it, showing this trainer's default
            default = f.default_factory()
            for g in dataclasses.fields(default):
                action = actions[f"engine.{g.name}"]
                assert action.default is argparse.SUPPRESS and action.help.endswith(f"(default: {getattr(default, g.name)})")
            continue
        action = actions[f.name]
        assert action.default is argparse.SUPPRESS  # a flag not given leaves the dataclass default
        default = f.default if f.default is not dataclasses.MISSING else None
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        assert action.help.endswith(f"(default: {shown})") or action.help == f"default: {shown}"


def test_help_comes_from_the_field_comment_not_a_section_heading():
    helps = flags.field_help(StudentConfig)
    assert helps["ce"] == "cross-entropy on gold labels (rows with a label)"
    assert helps["tokens"].startswith("wordpiece (the teacher's) | words")
    assert flags.field_help(ScoreConfig)["layers"].startswith("hidden_states layers to store")


def test_flags_built_by_threads_at_once_parse_each_class_once_and_never_two_at_a_time(monkeypatch):
    # CPython 3.11's ast is not safe for two threads at once: two `score` commands started together in one
    # process once failed building their flags ("AST constructor recursion depth mismatch").
    import threading
    import time

    real, active, peak, calls = flags.inspect.getsourcelines, [0], [0], []

    def slow_getsourcelines(obj):
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        calls.append(obj)
        time.sleep(0.01)  # widen the window a second parse would fall into
        try:
            return real(obj)
        finally:
            active[0] -= 1

    monkeypatch.setattr(flags.inspect, "getsourcelines", slow_getsourcelines)
    monkeypatch.setattr(flags, "_HELP", {})
    results, start = [], threading.Barrier(6)

    def build():
        start.wait()
        results.append(flags.field_help(StudentConfig))

    threads = [threading.Thread(target=build) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 6 and all(r == results[0] for r in results)
    assert results[0]["ce"] == "cross-entropy on gold labels (rows with a label)"
    assert peak[0] == 1
    assert len(calls) == len(set(calls))  # each class read once


def test_flags_build_a_checked_config():
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser, AugmentConfig)
    cfg = flags.from_args(AugmentConfig, parser.parse_args(["--n-iter", "3", "--ops", "mask,ngram",
                                                             "--labels", "neg,pos"]))
    assert (cfg.n_iter, cfg.ops, cfg.labels, cfg.p_mask) == (3, ("mask", "ngram"), ("neg", "pos"), 0.1)
    with pytest.raises(ConfigError, match=r"command line: --n-iter = 'x': input should be a valid integer"):
        flags.from_args(AugmentConfig, parser.parse_args(["--n-iter", "x"]))


def test_a_yaml_base_under_the_flags():
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser, StudentConfig)
    cfg = flags.from_args(StudentConfig, parser.parse_args(["--epochs", "2"]), base={"epochs": 9, "kd": 1.0},
                           where="s.yaml")
    assert (cfg.epochs, cfg.kd, cfg.mse) == (2, 1.0, StudentConfig().mse)


def test_values_round_trip_through_plain_dicts():
    cfg = typed.load(RunConfig, {"students": {"a": {"kd": 1.0}}, "score": {"layers": "-1,2"},
                                  "beam": {"workers": 2, "options": {"project": "p"}}}, where="x")
    again = typed.load(RunConfig, typed.to_dict(cfg), where="x")
    assert again == cfg and cfg.score.layers == (-1, 2)


@pytest.mark.parametrize("values, message", [
    ({"teacher": {"epochs": 0}}, "teacher.epochs = 0: input should be greater than or equal to 1 (expected int)"),
    ({"augment": {"n_iter": -1}}, "augment.n_iter = -1: input should be greater than or equal to 0 (expected int)"),
    ({"augment": {"words_per_variant": 0}}, "augment.words_per_variant = 0: input should be greater than or equal to 1"),
    ({"augment": {"p_mlm": 1.5}}, "augment.p_mlm = 1.5: input should be less than or equal to 1 (expected float)"),
    ({"unlabeled_rows": -2}, "unlabeled_rows = -2: input should be greater than or equal to -1 (expected int or null)"),
    ({"score": {"hidden": "max"}}, "score.hidden = 'max': input should be 'cls' or 'mean'"),
    ({"students": {"s": {"temperature": 0}}}, "students.s.temperature = 0: input should be greater than 0"),
    ({"lowres": {"per_class": 5}, "unlabeled_rows": 10}, "lowres and unlabeled_rows both choose"),
    ({"students": {}}, "no students"),
    ({"beam": {"workers": "two"}}, "beam.workers = 'two': input should be a valid integer"),
])
def test_semantic_checks_name_the_section(values, message):
    values = {"students": {"s": {}}, **values}
    with pytest.raises(ConfigError) as exc:
        typed.load(RunConfig, values, where="run.yaml")
    assert message in str(exc.value) and str(exc.value).startswith("run.yaml: ")


@pytest.mark.parametrize("text, message", [
    ("- a\n- b\n", "a config is a YAML mapping of settings, got list"),
    ("students: {s: [\n", "not valid YAML"),
    ("epochs: !!python/object/apply:os.system ['touch pwned']\n", "not valid YAML, line 1: .*python/object/apply"),
    ("epochs: 1\n\tbad: tab\n", "not valid YAML"),
    # PyYAML keeps the last of two equal keys silently; a pasted second `epochs:` must not win unseen
    ("students:\n  s:\n    epochs: 3\n    patience: 2\n    epochs: 5\n",
     r"bad.yaml, line 5: `epochs` is set twice \(lines 3 and 5\); keep one"),
    ("students: {s: {epochs: 3, epochs: 5}}\n", r"line 1: `epochs` is set twice \(lines 1 and 1\)"),
])
def test_yaml_mistakes_are_usage_errors_and_nothing_is_written(tmp_path, capsys, monkeypatch, text, message):
    from transferset import typed
    from transferset.app.cli import main

    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError, match=message):
        typed.read_yaml(str(bad))
    out = tmp_path / "out"
    assert main(["train", "--transfer", "t", "--dev", "d.tsv", "--output", str(out), "--config", str(bad)]) == 2
    assert main(["run", "--config", str(bad), f"run_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # no output, no pwned


def test_a_merge_key_may_be_overridden_and_equal_keys_in_other_mappings_are_fine(tmp_path):
    """Only one mapping naming a key twice is refused: `<<: *base` then the same key overrides, as YAML says."""
    from transferset import typed

    path = tmp_path / "ok.yaml"
    path.write_text("base: &b {epochs: 3, patience: 2}\nstudents:\n  a:\n    <<: *b\n    epochs: 5\n"
                    "  b:\n    epochs: 4\n")
    raw = typed.read_yaml(str(path))
    assert raw["students"] == {"a": {"epochs": 5, "patience": 2}, "b": {"epochs": 4}}


def test_augment_settings_nested_per_op_are_the_flat_ones():
    """`ops: {mask: {p: 0.3}, ngram: {max_n: 3}}` is `ops: [mask, ngram]` with p_mask 0.3 and max_n 3: the flat
    form users write today stays, and both give the same config (hence the same key)."""
    from transferset import typed
    from transferset.config import AugmentConfig

    nested = typed.load(AugmentConfig, {"ops": {"mask": {"p": 0.3}, "ngram": {"max_n": 3}, "pos": None}}, where="x")
    flat = typed.load(AugmentConfig, {"ops": ["mask", "ngram", "pos"], "p_mask": 0.3, "max_n": 3}, where="x")
    assert nested == flat and nested.ops == ("mask", "ngram", "pos") and nested.p_mask == 0.3
    for bad, says in [({"ops": {"maks": {}}}, "ops: unknown augmenter 'maks'; known: mask, mlm, ngram, pos"),
                      ({"ops": {"mask": {"q": 1}}}, "ops.mask.q: not a setting of mask; its settings: ['p', 'p_mask'"),
                      ({"ops": {"mask": {"p": 0.2}}, "p_mask": 0.1}, "ops.mask.p and p_mask both set it"),
                      ({"ops": {"mask": {"p": 2.0}}}, "p_mask")]:
        with pytest.raises(ConfigError, match=re.escape(says)):
            typed.load(AugmentConfig, bad, where="cfg.yaml: augment")
@pytest.mark.parametrize("cls, argv, message", [
    (PredictConfig, ["--speed", "nan"], "command line: --speed = nan: not a number (expected float or null)"),
    (PruneConfig, ["--heads", "nan"], "command line: --heads = nan: not a number (expected float)"),
    (PruneConfig, ["--heads", "inf"], "command line: --heads = inf: not a number (expected float)"),  # ≥ 0 holds
    (StudentConfig, ["--lr=-inf"], "command line: --lr = -inf: not a number"),
    (StudentConfig, ["--temperature", "NaN"], "command line: --temperature = NaN: not a number"),
])
def test_numeric_flags_refuse_nan_and_inf_as_not_a_number(cls, argv, message):
    """Issue 42 item 9: `--speed nan` said "should be ≤ 1" and `--heads nan` "≥ 0"; an unbounded float took NaN."""
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser, cls)
    with pytest.raises(ConfigError) as exc:
        flags.from_args(cls, parser.parse_args(argv))
    assert str(exc.value).startswith(message) and "should be" not in str(exc.value)


def test_typed_values_refuse_nan_and_inf_anywhere_in_a_run_config():
    # A bounded value fails its bound, and is said to be no number; then the unbounded ones, all of them.
    with pytest.raises(ConfigError, match=r"^run.yaml: augment.p_mask = nan: not a number \(expected float\)$"):
        typed.load(RunConfig, {"students": {"s": {}}, "augment": {"p_mask": float("nan")}}, where="run.yaml")
    values = {"teacher": {"lr": float("inf")}, "students": {"s": {"model": {"dropout": float("nan")}}}}
    with pytest.raises(ConfigError) as exc:
        typed.load(RunConfig, values, where="run.yaml")
    assert str(exc.value).splitlines() == ["run.yaml: teacher.lr = inf: not a number (expected float)",
                                           "run.yaml: students.s.model.dropout = nan: not a number"]
    # A text setting that reads "nan" is text, not a number.
    assert typed.load(RunConfig, {"students": {"s": {}}, "teacher": {"model": "nan"}}, "x").teacher.model == "nan"


def test_a_float_flag_outside_the_settings_refuses_nan():
    parser = argparse.ArgumentParser()
    parser.add_argument("--speed", type=flags.finite_float)
    assert parser.parse_args(["--speed", "0.5"]).speed == 0.5
    for value in ("nan", "inf", "-inf"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--speed", value])
