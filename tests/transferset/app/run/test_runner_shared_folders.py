"""Configs that share configs/demo.yaml's run folder plan the same keys for every stage they share: after
`make demo` they reuse its transfer set, scores and students instead of building them again over its folder."""
import pytest
import yaml

from test_runner import CONFIGS
from transferset.app.run.runner import load_config, plan_stages, resolve_data
from transferset.runtime.errors import UserError

DEMO = next(p for p in CONFIGS if p.name == "demo.yaml")
SHARING = [p for p in CONFIGS if p != DEMO and yaml.safe_load(p.read_text())["run_dir"] ==
           yaml.safe_load(DEMO.read_text())["run_dir"]]


def _keys(path, run_dir, data) -> dict:
    """Each planned stage's key by name, for the stages whose key the plan can compute before anything ran."""
    cfg = load_config(str(path), [f"run_dir={run_dir}", f"data={data}"])
    keys: dict = {}
    for s in plan_stages(cfg, resolve_data(cfg.data, cfg.test, cfg.dev)).stages:
        try:
            keys[s.name] = s.key([keys[u] for u in s.upstream])
        except (UserError, KeyError, TypeError):  # a stage reading a file that is not there yet (its upstream's)
            keys[s.name] = None
    return keys


def test_some_configs_share_the_demos_folder():
    assert {p.name for p in SHARING} >= {"demo_static.yaml", "demo_compress.yaml"}


@pytest.mark.parametrize("path", SHARING, ids=lambda p: p.name)
def test_a_config_sharing_the_demos_folder_reuses_its_stages(path, tmp_path, sst2_dir):
    demo, other = _keys(DEMO, tmp_path / "r", sst2_dir), _keys(path, tmp_path / "r", sst2_dir)
    shared = {n for n in demo.keys() & other.keys() if n != "test"}  # the test stage lists every student
    assert {"data", "teacher", "augment", "score", "students.distilled"} <= shared
    assert {n: other[n] for n in shared} == {n: demo[n] for n in shared}
    assert all(demo[n] for n in ("data", "teacher", "augment", "score", "students.distilled"))
