"""The search: section's settings: refused when the config loads, before any stage."""
import json

import pytest

from transferset.app.run.runner import load_config
from transferset.config.search import DEFAULT_BASE, RESOLUTION_MS, SearchConfig


@pytest.mark.parametrize("settings, says", [
    ({}, "search: no budget: set budget_ms, budget_mb or budget_speedup"),
    ({"budget_ms": RESOLUTION_MS / 2}, "below what the timing can tell apart"),
    ({"budget_ms": 1, "space": {}}, "search.space is empty"),
    ({"budget_ms": 1, "rungs": [4, 1]}, "each rung more than the one before"),
    ({"budget_ms": 1, "keep": 1.0}, "search.keep=1.0: the fraction kept"),
])
def test_bad_search_settings_are_refused_when_the_config_loads(settings, says):
    with pytest.raises(ValueError, match=says):
        load_config("configs/demo.yaml", [f"search={json.dumps(settings)}"])


def test_a_candidate_is_the_base_under_its_own_settings():
    sc = SearchConfig(budget_ms=1, space={"a": {"student": "static", "losses": {"ce": 1.0, "mse": 1.0, "kd": 0.5}}}, base={"losses": {"ce": 1.0, "mse": 1.0, "kd": 1.0}, "epochs": 2})
    assert sc.candidates() == {"a": {"losses": {"ce": 1.0, "mse": 1.0, "kd": 0.5}, "epochs": 2, "student": "static"}}
    assert SearchConfig(budget_mb=5).candidates()["static"] == {**DEFAULT_BASE, "student": "static",
                                                                "vocab": {"embed_init": "contextual"}}
    # merged as a student's layers are (precedence.over), section by section: a candidate's own loss adds to the
    # base's, its `model:` to the base's
    sc = SearchConfig(budget_ms=1, space={"b": {"losses": {"mse": 1.0}, "model": {"hidden": 8}}},
                      base={"losses": {"kd": {"weight": 1.0, "temperature": 2.0}}, "model": {"embed_dim": 8}})
    assert sc.candidates()["b"] == {"losses": {"kd": {"weight": 1.0, "temperature": 2.0}, "mse": 1.0},
                                    "model": {"embed_dim": 8, "hidden": 8}}
