"""transferset/runtime/typed.py on the run's settings: values round-trip through plain dicts, YAML mistakes are usage
errors, NaN and infinity are no numbers anywhere."""
import pytest

from transferset.config import RunConfig
from transferset.runtime import typed
from transferset.runtime.errors import ConfigError


def test_values_round_trip_through_plain_dicts():
    cfg = typed.load(RunConfig, {"students": {"a": {"losses": {"kd": 1.0}}}, "score": {"layers": "-1,2"},
                                  "beam": {"workers": 2, "options": {"project": "p"}}}, where="x")
    again = typed.load(RunConfig, typed.to_dict(cfg), where="x")
    assert again == cfg and cfg.score.layers == (-1, 2)


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
    from transferset.app.cli import main
    from transferset.runtime import typed

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
    from transferset.runtime import typed

    path = tmp_path / "ok.yaml"
    path.write_text("base: &b {epochs: 3, patience: 2}\nstudents:\n  a:\n    <<: *b\n    epochs: 5\n"
                    "  b:\n    epochs: 4\n")
    raw = typed.read_yaml(str(path))
    assert raw["students"] == {"a": {"epochs": 5, "patience": 2}, "b": {"epochs": 4}}


def test_typed_values_refuse_nan_and_inf_anywhere_in_a_run_config():
    # A bounded value fails its bound, and is said to be no number; then the unbounded ones, all of them.
    with pytest.raises(ConfigError, match=r"^run.yaml: augment.p_mask = nan: not a number \(expected float\)$"):
        typed.load(RunConfig, {"students": {"s": {}}, "augment": {"p_mask": float("nan")}}, where="run.yaml")
    values = {"teacher": {"optim": {"lr": float("inf")}}, "students": {"s": {"model": {"dropout": float("nan")}}}}
    with pytest.raises(ConfigError) as exc:
        typed.load(RunConfig, values, where="run.yaml")
    assert str(exc.value).splitlines() == ["run.yaml: teacher.optim.lr = inf: not a number (expected float)",
                                           "run.yaml: students.s.model.dropout = nan: not a number"]
    # A text setting that reads "nan" is text, not a number.
    assert typed.load(RunConfig, {"students": {"s": {}}, "teacher": {"model": "nan"}}, "x").teacher.model == "nan"
