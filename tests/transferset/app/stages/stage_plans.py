"""The fixture the tests of this folder import (tests/test_mirror.py allows no third conftest module): a plan of
configs/demo.yaml (and overrides) on the real SST-2 folder, what each stage kind declares; a tiny search run."""
import pytest
import yaml

from transferset.app.run.runner import load_config, plan_stages, resolve_data


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


def search_config(tmp_path, data, teacher, budget_mb, **search):
    """A tiny run (600 SST-2 rows, a given teacher) with a search of 4 BiLSTM and static candidates under `budget_mb`."""
    small = {"threads": 1, "report": {"latency_examples": 8}, "epochs": 1}
    cfg = {"run_dir": str(tmp_path / "run"), "data": str(data), "validation": {"rows": 60, "seed": 0},
           "labeled_limit": 200, "unlabeled_rows": 50, "teacher_path": teacher,
           "augment": {"recipe": "tang", "n_iter": 1, "seed": 0},
           "students": {"plain": {**small, "student": "bilstm", "model": {"embed_dim": 8, "hidden": 8}}},
           "report": {"latency_rows": 8, "latency_rounds": 1},
           "search": {"budget_mb": budget_mb, "rungs": [1, 2], "keep": 0.5, "timing_rows": 8, "timing_rounds": 1,
                      "space": {"small": {"student": "bilstm", "model": {"embed_dim": 8, "hidden": 8}},
                                "wide": {"student": "bilstm", "model": {"embed_dim": 8, "hidden": 32}},
                                "static": {"student": "static"},
                                "huge": {"student": "bilstm", "model": {"embed_dim": 8, "hidden": 512}}},
                      "base": {"threads": 1, "report": {"latency_examples": 8}, "losses": {"kd": 1.0}},
                      "int8": False, **search}}
    path = tmp_path / f"search_{budget_mb}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return load_config(str(path))


def search_data(tmp_path, sst2_dir, head_tsv):
    """600 SST-2 train rows and 80 dev rows, in a folder `run --data` reads."""
    data = tmp_path / "data"
    data.mkdir()
    head_tsv(sst2_dir / "train.tsv", data / "train.tsv", 600)
    head_tsv(sst2_dir / "dev.tsv", data / "dev.tsv", 80)
    return data
