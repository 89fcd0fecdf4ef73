"""transferset/training/checkpoints.py: a killed training resumes at the exact step; other settings are refused."""
import pytest
import torch

from linear_task import Linear, _loss, _run
from linear_task import engine  # noqa: F401 (a fixture)
from transferset.runtime.errors import UserError
from transferset.training import Checkpoints, PhaseSpec, Recipe


def _killed_on_step(n):
    """The loss of the tiny task, until the n-th call: then a kill."""
    calls = {"n": 0}

    def loss(net, batch):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt
        return _loss(net, batch)

    return loss


def test_checkpoints_resume_the_exact_step_and_refuse_other_settings(engine, tmp_path):
    spec = PhaseSpec("p", epochs=2, keep_best=False)
    torch.manual_seed(0)
    whole = Linear()
    _run(Recipe(engine), spec, whole, lambda: {"accuracy": 0.5})

    torch.manual_seed(0)
    killed = Linear()
    ckpt = Checkpoints(str(tmp_path / "ck"), {"lr": 0.1}, every_steps=5)
    with pytest.raises(KeyboardInterrupt):
        _run(Recipe(engine, ckpt), spec, killed, lambda: {"accuracy": 0.5}, loss=_killed_on_step(7))
    with pytest.raises(UserError, match=r"other settings \(lr differ\)"):
        Recipe(engine, Checkpoints(str(tmp_path / "ck"), {"lr": 0.2}), resume=True)
    resumed = Linear()
    recipe = Recipe(engine, ckpt, resume=True)
    assert recipe.global_step == 5
    _run(recipe, spec, resumed, lambda: {"accuracy": 0.5})
    assert all(torch.equal(resumed.state_dict()[k], whole.state_dict()[k]) for k in whole.state_dict())
    assert [h["rows"] for h in recipe.history] == [32, 32]
    recipe.finish()
    assert not (tmp_path / "ck").exists()


def test_a_resumed_training_keeps_the_metrics_lines_before_its_checkpoint(tmp_path):
    """metrics.jsonl of a resumed run started at the checkpoint's step: the steps before it were gone."""
    import json

    from transferset.config import EngineConfig
    from transferset.training import Engine

    spec = PhaseSpec("p", epochs=2, keep_best=False)

    def engine_in(name):
        return Engine.create(EngineConfig(device="cpu"), output=str(tmp_path / name), log=lambda m: None,
                             progress_bar=False)

    def lines(name):
        return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]

    whole_engine = engine_in("whole")
    whole_engine.start_tracking("t", {})
    torch.manual_seed(0)
    _run(Recipe(whole_engine), spec, Linear(), lambda: {"accuracy": 0.5})
    killed_engine = engine_in("killed")
    ckpt = Checkpoints(str(tmp_path / "ck"), {"lr": 0.1}, every_steps=5)
    killed_engine.start_tracking("t", {})
    torch.manual_seed(0)
    with pytest.raises(KeyboardInterrupt):
        _run(Recipe(killed_engine, ckpt), spec, Linear(), lambda: {"accuracy": 0.5}, loss=_killed_on_step(7))
    assert [r["step"] for r in lines("killed")][-1] == 6  # steps 1-6 written, the checkpoint at 5
    resumed_engine = engine_in("killed")
    recipe = Recipe(resumed_engine, ckpt, resume=True)
    resumed_engine.start_tracking("t", {})
    _run(recipe, spec, Linear(), lambda: {"accuracy": 0.5})
    steps = [r["step"] for r in lines("killed")]
    assert steps == [r["step"] for r in lines("whole")] and steps[:5] == [1, 2, 3, 4, 4]  # an epoch's 4 steps, its eval
    assert lines("killed") == lines("whole")  # the same values too: the resume is exact
