"""transferset.runtime.malloc: with the mmap threshold fixed, a freed large block goes back to the system."""
import subprocess
import sys

import pytest

PROBE = """
import ctypes, ctypes.util, sys
import psutil
from transferset.runtime import malloc
if sys.argv[1] == "fixed":
    assert malloc.fix_mmap_threshold() and malloc.fix_mmap_threshold()  # once, then a no-op
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
proc = psutil.Process()
block = libc.malloc(20_000_000)
libc.free(block)  # glibc raises its mmap threshold to 20 MB here, unless it is fixed
before = proc.memory_info().rss
for i in range(5):  # blocks of a few sizes, as a teacher's batches of several shapes
    block = libc.malloc(10_000_000 + 4096 * i)
    ctypes.memset(block, 1, 10_000_000)
    libc.free(block)
print((proc.memory_info().rss - before) / 2**20)
"""


def kept_mb(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_large_block_goes_back_to_the_system_once_the_threshold_is_fixed():
    assert kept_mb("default") > 8  # glibc's own behaviour: the 10 MB block stays resident after free
    assert kept_mb("fixed") < 1


def test_primitive_cache_capped_unless_the_user_set_it(monkeypatch):
    from transferset.runtime import malloc

    monkeypatch.delenv(malloc.ONEDNN_CACHE_ENV, raising=False)
    assert malloc.limit_primitive_cache() == "16" and malloc.os.environ[malloc.ONEDNN_CACHE_ENV] == "16"
    monkeypatch.setenv(malloc.ONEDNN_CACHE_ENV, "256")
    assert malloc.limit_primitive_cache() == "256"  # a value from the environment wins


def test_the_scoring_worker_caps_the_cache_before_loading_the_teacher(monkeypatch, tiny_teacher):
    from pipelines.score import TeacherModelHandler
    from transferset.runtime import malloc

    monkeypatch.delenv(malloc.ONEDNN_CACHE_ENV, raising=False)
    seen = {}

    def loader(path, **kwargs):
        seen["cache"] = malloc.os.environ.get(malloc.ONEDNN_CACHE_ENV)
        return "teacher"

    assert TeacherModelHandler(tiny_teacher, loader=loader).load_model() == "teacher"
    assert seen["cache"] == str(malloc.ONEDNN_CACHE_CAPACITY)
