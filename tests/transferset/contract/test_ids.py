"""transferset.contract.ids: the one repeated-id check of the score stage and the students."""
import os
import subprocess
import sys

import numpy as np
import pytest

from transferset.contract import ids


@pytest.mark.parametrize("stable", [True, False])
def test_repeated_hashes_are_those_seen_twice_across_parts_or_already_seen(stable):
    parts = [ids.id_hashes(["a", "b", "c"], stable=stable), ids.id_hashes(["d", "a", "e", "e"], stable=stable)]
    assert all(p.dtype == np.uint64 for p in parts)
    h = dict(zip("abcdez", ids.id_hashes(list("abcdez"), stable=stable).tolist()))
    assert ids.repeated_hashes(parts).tolist() == sorted([h["a"], h["e"]])
    with_seen = ids.repeated_hashes(parts, [ids.id_hashes(["c", "z"], stable=stable)])
    assert with_seen.tolist() == sorted([h["a"], h["c"], h["e"], h["z"]])
    assert ids.in_sorted(with_seen, ids.id_hashes(list("abz"), stable=stable)).tolist() == [True, False, True]
    assert ids.repeated_hashes([]).tolist() == [] and ids.in_sorted(ids.repeated_hashes([]), parts[0]).tolist() == [
        False] * 3


def test_stable_hashes_are_the_same_in_another_process():
    code = "from transferset.contract import ids; print(ids.id_hashes(['a', 'row-1']).tolist())"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "123"})
    assert other.stdout.strip() == str(ids.id_hashes(["a", "row-1"]).tolist())
    assert ids.id_hashes(["a"]).tolist() == [ids.id_hash("a")] and 0 <= ids.id_hash("a") < 2 ** 64
