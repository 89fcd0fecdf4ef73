"""benchmarks/quality/*.yaml: every setting `benchmarks/quality.py --setting NAME` runs is a valid run config once
its students are expanded per seed, so a typo (or a key pasted twice) fails here, not an hour into a benchmark."""
import importlib.util
from pathlib import Path

import pytest

from transferset.config import RunConfig, StudentConfig
from transferset.runtime import typed

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = sorted((ROOT / "benchmarks" / "quality").glob("*.yaml"))


@pytest.fixture(scope="module")
def quality():
    spec = importlib.util.spec_from_file_location("quality_benchmark", ROOT / "benchmarks" / "quality.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_are_settings():
    assert {p.stem for p in SETTINGS} >= {"demo", "ensemble5", "full_levers", "layerwise_demo3_rest"}


@pytest.mark.parametrize("path", SETTINGS, ids=lambda p: p.stem)
def test_every_benchmark_setting_validates_with_one_student_per_seed(path, quality):
    raw = typed.read_yaml(str(path))
    # each variant gives seeds 0..n-1 (3, or fewer where it says `seeds: n`), each with its own seed
    counts = {name: min(3, int((settings or {}).get("seeds", 3))) for name, settings in raw["students"].items()}
    cfg = typed.load(RunConfig, {**quality.expand(raw, 3), "run_dir": "runs/x"}, where=str(path))
    assert all(isinstance(s, StudentConfig) for s in cfg.students.values())
    for name, n in counts.items():
        assert [cfg.students[f"{name}_s{k}"].seed for k in range(n)] == list(range(n))
    assert len(cfg.students) == sum(counts.values())
    assert path.read_text().startswith("#")  # its header says what it measures and how to run it
