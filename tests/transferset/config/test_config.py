"""transferset.config: the checks on load name the section. (The flags: tests/transferset/app/cli/test_flags.py; loading
and YAML: tests/transferset/runtime/test_typed.py; the nested augment settings: test_augment_settings.py.)"""
import pytest

from transferset.config import RunConfig
from transferset.runtime import typed
from transferset.runtime.errors import ConfigError


@pytest.mark.parametrize("values, message", [
    ({"teacher": {"epochs": 0}}, "teacher.epochs = 0: input should be greater than or equal to 1 (expected int)"),
    ({"augment": {"n_iter": -1}}, "augment.n_iter = -1: input should be greater than or equal to 0 (expected int)"),
    ({"augment": {"words_per_variant": 0}}, "augment.words_per_variant = 0: input should be greater than or equal to 1"),
    ({"augment": {"p_mlm": 1.5}}, "augment.p_mlm = 1.5: input should be less than or equal to 1 (expected float)"),
    ({"unlabeled_rows": -2}, "unlabeled_rows = -2: input should be greater than or equal to -1 (expected int or null)"),
    ({"score": {"hidden": "max"}}, "score.hidden = 'max': input should be 'cls' or 'mean'"),
    ({"students": {"s": {"batch_size": 0}}}, "students.s.batch_size = 0: input should be greater than or equal to 1"),
    ({"lowres": {"per_class": 5}, "unlabeled_rows": 10}, "lowres and unlabeled_rows both choose"),
    ({"students": {}}, "no students"),
    ({"beam": {"workers": "two"}}, "beam.workers = 'two': input should be a valid integer"),
    # a decay of 1 would keep the first weights for ever
    ({"students": {"s": {"optim": {"ema": 1.0}}}}, "students.s.optim.ema = 1.0: input should be less than 1"),
    ({"augment": {"join_max": 1}}, "augment.join_max = 1: input should be greater than or equal to 2"),
    ({"augment": {"joins": -0.5}}, "augment.joins = -0.5: input should be greater than or equal to 0"),
])
def test_semantic_checks_name_the_section(values, message):
    values = {"students": {"s": {}}, **values}
    with pytest.raises(ConfigError) as exc:
        typed.load(RunConfig, values, where="run.yaml")
    assert message in str(exc.value) and str(exc.value).startswith("run.yaml: ")


def test_the_teacher_prune_and_exits_take_an_optim_section_whose_missing_fields_are_their_trainers():
    """One `optim:` section (lr, weight_decay, grad_clip), as a student's; a partial one keeps the rest of its
    trainer's defaults: the teacher's and prune's clip at 1.0, exits' branches at none."""
    from transferset.config import EXITS_OPTIM, PRUNE_OPTIM, TEACHER_OPTIM, ExitsConfig, PruneConfig, TeacherConfig

    for cls, defaults in ((TeacherConfig, TEACHER_OPTIM), (PruneConfig, PRUNE_OPTIM), (ExitsConfig, EXITS_OPTIM)):
        assert typed.to_dict(cls().optim) == defaults == typed.to_dict(typed.load(cls, {}, "x").optim)
        partial = typed.load(cls, {"optim": {"lr": 0.5}}, "x").optim
        assert typed.to_dict(partial) == {**defaults, "lr": 0.5}
    assert (TEACHER_OPTIM["lr"], PRUNE_OPTIM["lr"], EXITS_OPTIM["lr"], EXITS_OPTIM["grad_clip"]) == (5e-5, 3e-5, 1e-3, 0.0)
    with pytest.raises(ConfigError, match=r"teacher.optim.weight_decay = -1"):
        typed.load(RunConfig, {"students": {"s": {}}, "teacher": {"optim": {"weight_decay": -1}}}, "run.yaml")
