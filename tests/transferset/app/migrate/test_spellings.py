"""transferset/app/migrate/spellings.py: a setting's earlier spelling is migrate's alone; the config refuses it as
an unknown setting, and the commands' error says what it is written as now."""
import pytest
import yaml

from transferset.app import cli
from transferset.app.cli import train
from transferset.app.migrate import spellings
from transferset.runtime.errors import ConfigError


def test_an_earlier_spelling_is_refused_as_unknown_and_the_command_says_its_spelling_now(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"data": str(tmp_path), "students": {"old": {"schedule": "joint", "kd": 1.0}}}))
    assert cli.main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "students.old.schedule: unknown setting" in err and "students.old.kd: unknown setting" in err
    assert ("`students.old.schedule` is an earlier spelling: it is now `phases: VALUE` (the phase plan; the learning "
            "rate's curve is `engine: {schedule: ...}`); rewrite it in the config, and run `transferset migrate "
            "RUN_DIR` on a run folder made before") in err
    assert "`students.old.kd` is an earlier spelling: it is now `losses: {kd: WEIGHT}` (each loss with its weight" in err
    # a student's own file (`transferset train --config`): the key alone
    student = tmp_path / "student.yaml"
    student.write_text(yaml.safe_dump({"temperature": 2.0, "lr": 1e-3}))
    _, parser, _ = cli.build_subparser("train")
    with pytest.raises(ConfigError) as raised:
        train.load_config(parser.parse_args(["--transfer", "s", "--dev", "d.tsv", "--output", "o",
                                             "--config", str(student)]))
    said = spellings.explain(str(raised.value))
    assert "`temperature` is an earlier spelling: it is now `losses: {kd: {weight: W, temperature: VALUE}}`" in said
    assert "`lr` is an earlier spelling: it is now `optim: {lr: VALUE}` (the optimizer's section; the flag" in said


def test_a_setting_of_today_or_of_another_section_gets_no_line(monkeypatch):
    message = "run.yaml: teacher.kd: unknown setting; known: epochs\nrun.yaml: students.a.nonsense: unknown setting"
    assert spellings.explain(message) == message  # kd was never the teacher's; nonsense was never a name
    monkeypatch.setitem(spellings.RENAMED, "rate", "lr")  # a rename with no note: said in its own words
    said = spellings.explain("student.yaml: rate: unknown setting; known: lr")
    assert said.splitlines()[1] == ("  `rate` is an earlier spelling: it is now `lr: VALUE`; rewrite it in the config, "
                                    "and run `transferset migrate RUN_DIR` on a run folder made before")


def test_the_teacher_prune_and_exits_optimizer_settings_are_under_optim_now(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"data": str(tmp_path), "teacher": {"lr": 1e-4},
                                    "compress": {"prune": {"grad_clip": 0.5}, "exits": {"weight_decay": 0.1}},
                                    "students": {"s": {}}}))
    assert cli.main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert ("`teacher.lr` is an earlier spelling: it is now `optim: {lr: VALUE}` (the optimizer's section); rewrite "
            "it in the config") in err
    assert "`compress.prune.grad_clip` is an earlier spelling: it is now `optim: {grad_clip: VALUE}`" in err
    # exits never had a weight decay of its own: an unknown setting, no earlier spelling
    assert "compress.exits.weight_decay: unknown setting" in err and "`compress.exits.weight_decay`" not in err


def test_a_run_folders_config_of_before_reads_with_the_optimizer_settings_under_optim():
    from transferset.app.migrate import teacher_fingerprint, today_names

    raw = today_names({"teacher": {"epochs": 2, "lr": 1e-4, "weight_decay": 0.0},
                       "compress": {"prune": {"lr": 1e-5, "grad_clip": 0.5}, "exits": {"lr": 1e-2, "epochs": 3}}})
    assert raw == {"teacher": {"epochs": 2, "optim": {"lr": 1e-4, "weight_decay": 0.0}},
                   "compress": {"prune": {"optim": {"lr": 1e-5, "grad_clip": 0.5}},
                                "exits": {"epochs": 3, "optim": {"lr": 1e-2}}}}
    import json
    old = {"settings": json.dumps({"epochs": 2, "lr": 1e-4, "weight_decay": 0.01, "patience": 1}), "train": "t"}
    settings = json.loads(teacher_fingerprint(old)["settings"])
    assert settings["optim"] == {"lr": 1e-4, "weight_decay": 0.01, "grad_clip": 1.0} and "lr" not in settings


def test_a_students_tokens_data_and_report_settings_at_the_top_are_said_as_their_sections(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"data": str(tmp_path), "students": {"old": {
        "trim_vocab": True, "max_length": 64, "latency_examples": 8}}}))
    assert cli.main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    for name, section in (("trim_vocab", "vocab"), ("max_length", "data"), ("latency_examples", "report")):
        assert f"students.old.{name}: unknown setting" in err
        assert (f"`students.old.{name}` is an earlier spelling: it is now `{section}: {{{name}: VALUE}}` (the "
                f"student's `{section}:` section; the flag keeps its name)") in err
