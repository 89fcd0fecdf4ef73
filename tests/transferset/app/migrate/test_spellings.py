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
    message = "run.yaml: teacher.lr: unknown setting; known: epochs\nrun.yaml: students.a.nonsense: unknown setting"
    assert spellings.explain(message) == message  # the teacher's lr was never a student's; nonsense was never a name
    monkeypatch.setitem(spellings.RENAMED, "rate", "lr")  # a rename with no note: said in its own words
    said = spellings.explain("student.yaml: rate: unknown setting; known: lr")
    assert said.splitlines()[1] == ("  `rate` is an earlier spelling: it is now `lr: VALUE`; rewrite it in the config, "
                                    "and run `transferset migrate RUN_DIR` on a run folder made before")
