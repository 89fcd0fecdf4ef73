"""transferset/app/cli/flags.py: a flag for every setting, with its help and the dataclass default, a YAML base under
the flags, and the values it refuses."""
import argparse
import dataclasses

import pytest

from transferset.app.cli import flags
from transferset.config import (AugmentConfig, BeamConfig, ExitsConfig, PredictConfig, ScoreConfig, PruneConfig,
                                RunConfig, StudentConfig, TeacherConfig, VocabConfig)
from transferset.runtime.errors import ConfigError

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
        if f.name in ("engine", "optim", "vocab", "data", "report"):  # a section: a flag per field of it, showing this trainer's default
            default = f.default_factory()
            for g in dataclasses.fields(default):
                action = actions[f"{f.name}.{g.name}"]
                assert action.default is argparse.SUPPRESS and action.help.endswith(f"(default: {getattr(default, g.name)})")
            continue
        action = actions[f.name]
        assert action.default is argparse.SUPPRESS  # a flag not given leaves the dataclass default
        default = f.default if f.default is not dataclasses.MISSING else None
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        assert action.help.endswith(f"(default: {shown})") or action.help == f"default: {shown}"


def test_help_comes_from_the_field_comment_not_a_section_heading():
    # under the heading `# a teacher ensemble, scored once by each member (...)`
    assert flags.field_help(RunConfig)["teacher_seeds"] == ("fine-tune one teacher per seed with the teacher: section, "
                                                            "e.g. [0, 1, 2]")
    assert flags.field_help(VocabConfig)["tokens"].startswith("wordpiece (the teacher's) | words")
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
    assert results[0]["layer_map"].startswith("student layer -> teacher layer for the layer losses")
    assert peak[0] == 1
    assert len(calls) == len(set(calls))  # each class read once


def test_flags_build_a_checked_config():
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser, AugmentConfig)
    cfg = flags.from_args(AugmentConfig, parser.parse_args(["--n-iter", "3", "--ops", "mask,ngram",
                                                             "--labels", "neg,pos"]))
    assert (cfg.n_iter, cfg.ops, cfg.labels, cfg.p_mask) == (3, ("mask", "ngram"), ("neg", "pos"), 0.1)
    with pytest.raises(ConfigError, match=r"^--n-iter x: input should be a valid integer"):
        flags.from_args(AugmentConfig, parser.parse_args(["--n-iter", "x"]))


def test_a_choice_named_none_is_that_choice_and_none_elsewhere_is_unset():
    """`--tracker none` (one of its choices) was read as null and refused: "input should be 'none', ..."."""
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser, StudentConfig)
    cfg = flags.from_args(StudentConfig, parser.parse_args(["--tracker", "none", "--max-length", "none"]),
                          base={"engine": {"tracker": "tensorboard"}, "data": {"max_length": 64}})
    assert (cfg.engine.tracker, cfg.data.max_length) == ("none", None)


def test_a_yaml_base_under_the_flags():
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser, StudentConfig)
    cfg = flags.from_args(StudentConfig, parser.parse_args(["--epochs", "2"]),
                          base={"epochs": 9, "losses": {"kd": 1.0}}, where="s.yaml")
    assert (cfg.epochs, cfg.weight("kd"), cfg.weight("mse")) == (2, 1.0, 0.0)


@pytest.mark.parametrize("cls, argv, message", [
    (PredictConfig, ["--speed", "nan"], "--speed nan: not a number (expected float or null)"),
    (PruneConfig, ["--heads", "nan"], "--heads nan: not a number (expected float)"),
    (PruneConfig, ["--heads", "inf"], "--heads inf: not a number (expected float)"),  # ≥ 0 holds
    (StudentConfig, ["--lr=-inf"], "--lr -inf: not a number"),
    (StudentConfig, ["--grad-clip", "NaN"], "--grad-clip NaN: not a number"),
])
def test_numeric_flags_refuse_nan_and_inf_as_not_a_number(cls, argv, message):
    """NaN and ±inf are "not a number" for every numeric flag: no range message (`--speed nan` "should be ≤ 1",
    `--heads nan` "≥ 0"), and an unbounded float does not take them."""
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser, cls)
    with pytest.raises(ConfigError) as exc:
        flags.from_args(cls, parser.parse_args(argv))
    assert str(exc.value).startswith(message) and "should be" not in str(exc.value)


def test_a_float_flag_outside_the_settings_refuses_nan():
    parser = argparse.ArgumentParser()
    parser.add_argument("--speed", type=flags.finite_float)
    assert parser.parse_args(["--speed", "0.5"]).speed == 0.5
    for value in ("nan", "inf", "-inf"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--speed", value])


def test_a_bad_flag_is_blamed_on_the_flag_and_a_bad_yaml_value_on_the_yaml():
    """`train --config small.yaml --epochs nan` said "small.yaml: epochs = nan": the flag set it, not the file."""
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser, StudentConfig)
    with pytest.raises(ConfigError) as exc:
        flags.from_args(StudentConfig, parser.parse_args(["--epochs", "nan"]), base={"epochs": 2}, where="small.yaml")
    assert str(exc.value) == "--epochs nan: not a number (expected int)"
    with pytest.raises(ConfigError) as exc:
        flags.from_args(StudentConfig, parser.parse_args([]), base={"epochs": "nan"}, where="small.yaml")
    assert str(exc.value) == "small.yaml: epochs = nan: not a number (expected int)"


def test_a_section_flag_is_named_as_the_user_types_it():
    """The teacher's engine flags were named `--engine[warmup]`, a flag that does not exist."""
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser, TeacherConfig)
    for argv, message in ((["--warmup", "nan"], "--warmup nan: not a number (expected float)"),
                          (["--grad-accum", "0"], "--grad-accum 0: input should be greater than or equal to 1")):
        with pytest.raises(ConfigError) as exc:
            flags.from_args(TeacherConfig, parser.parse_args(argv))
        assert str(exc.value).startswith(message) and "[" not in str(exc.value)
