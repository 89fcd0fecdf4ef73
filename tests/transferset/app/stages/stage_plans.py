"""The fixture the tests of this folder import (tests/test_mirror.py allows no third conftest module): a plan of
configs/demo.yaml (and overrides) on the real SST-2 folder, what each stage kind declares."""
import pytest

from transferset.app.runner import load_config, plan_stages, resolve_data


@pytest.fixture
def plan_of(tmp_path, sst2_dir):
    def plan(*overrides: str):
        cfg = load_config("configs/demo.yaml", [f"run_dir={tmp_path / 'r'}", f"data={sst2_dir}", *overrides])
        return plan_stages(cfg, resolve_data(cfg.data, cfg.test, cfg.dev))
    return plan


def stages(plan, prefix: str) -> dict:
    """The plan's stages whose names start with `prefix`, by name → (folder relative to the run, upstream)."""
    run = plan.outputs.run_dir
    return {s.name: (s.folder[len(run) + 1:] if s.folder and s.folder.startswith(run) else s.folder, s.upstream)
            for s in plan.stages if s.name.startswith(prefix)}
