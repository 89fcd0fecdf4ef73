"""transferset/app/migrate/rules.py: the earlier layouts' forms of a student's settings, each way (the earlier key
rules themselves: tests/transferset/app/migrate/test_migrate.py and test_migrate_layout3.py, folder by folder)."""
from students.losses import canonical
from transferset.app.migrate.rules import flat_student, grouped_student
from transferset.config import StudentConfig
from transferset.runtime import typed


def test_the_flat_form_and_todays_convert_into_each_other():
    cfg = typed.load(StudentConfig, {"preset": "pkd", "losses": {"cos": 0.5}, "optim": {"lr": 3e-4}}, "test")
    flat = flat_student(typed.to_dict(cfg))
    assert (flat["ce"], flat["kd"], flat["pkd"], flat["cos"], flat["mse"], flat["temperature"]) == (
        0.3, 0.7, 100.0, 0.5, 0.0, 5.0)
    assert (flat["lr"], flat["embed_lr"], flat["weight_decay"], flat["grad_clip"]) == (3e-4, None, 0.01, 1.0)
    assert flat["losses"] == {} and "optim" not in flat  # no loss a package registers
    back = typed.load(StudentConfig, grouped_student(flat), "test")
    assert canonical(back.losses) == canonical(cfg.losses) and back.optim == cfg.optim
    assert grouped_student({"lr": 1e-3, "epochs": 2}) == {"epochs": 2, "optim": {"lr": 1e-3}}
    # a partial mapping: ce and mse at their earlier default unless it names them or a preset with losses
    assert grouped_student({"kd": 1.0, "temperature": 2.0, "epochs": 3}) == {
        "epochs": 3, "losses": {"ce": 1.0, "mse": 1.0, "kd": {"weight": 1.0, "temperature": 2.0}}}
    assert grouped_student({"preset": "tinybert", "kd": 2.0}) == {"preset": "tinybert", "losses": {"kd": 2.0}}
    # a BiLSTM preset is its named shape now; the zero weights as written
    assert grouped_student({"preset": "tang", "ce": 0.0, "mse": 0.0, "kd": 1.0}) == {
        "model": {"shape": "tang"}, "losses": {"ce": 0.0, "mse": 0.0, "kd": 1.0}}
    # and back: the shape a preset again, beside the rest of `model:`
    flat = flat_student(typed.to_dict(typed.load(StudentConfig, {"model": {"shape": "tang", "layers": 2}}, "test")))
    assert (flat["preset"], flat["model"]) == ("tang", {"layers": 2})
    assert grouped_student({"preset": "xtremedistil", "model": {"layers": 2}})["model"] == {"shape": "xtremedistil",
                                                                                          "layers": 2}
    assert grouped_student({"epochs": 3}) == {"epochs": 3}  # nothing to convert
