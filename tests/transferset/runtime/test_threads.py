"""transferset/runtime/threads.py: torch's CPU threads set by one helper, the only caller of torch.set_num_threads."""
import pathlib
import re

import torch

from transferset.runtime.threads import set_torch_threads, torch_threads

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_set_and_restore():
    before = torch.get_num_threads()
    try:
        assert set_torch_threads(None) == before and torch.get_num_threads() == before  # None: left alone
        assert set_torch_threads(0) == before and torch.get_num_threads() == before
        with torch_threads(1):
            assert torch.get_num_threads() == 1
            with torch_threads(2):
                assert torch.get_num_threads() == 2
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == before
        assert set_torch_threads(2) == before and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_no_other_module_sets_torch_threads():
    """Only transferset/runtime/threads.py sets torch's threads, so the MLM, the teacher's loader, the score
    worker, training, predicting and latency share one rule for None instead of one each."""
    calls = [f"{p.relative_to(ROOT)}:{n}" for top in ("transferset", "students", "pipelines", "benchmarks")
             for p in sorted((ROOT / top).rglob("*.py")) if p.name != "threads.py" or p.parent.name != "runtime"
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\bset_num(_interop)?_threads\(", line)]
    assert calls == []
