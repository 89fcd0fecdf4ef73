"""The reading helpers the students added to transferset/data/transfer.py."""
import random

import numpy as np
import pyarrow as pa
import pytest

from transferset import testing
from transferset.contract import schema
from transferset.data import transfer


@pytest.fixture(scope="module")
def tiny_scored_dir(tmp_path_factory):
    """128 scored rows, r0..r127, in two shards of 64 and an empty one."""
    rng = np.random.default_rng(0)
    return testing.write_scored_set(str(tmp_path_factory.mktemp("scored")), [f"text {i}" for i in range(128)],
                                    rng.normal(size=(128, 2)), rng.normal(size=(128, 8)),
                                    ids=[f"r{i}" for i in range(128)])


def test_fixed_list_to_numpy_honours_slices_and_chunking():
    values = np.arange(12, dtype=np.float16).reshape(6, 2)
    arr = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1), type=pa.float16()), 2)
    out = transfer.fixed_list_to_numpy(arr.slice(2, 3))
    assert out.dtype == np.float32 and out.tolist() == [[4, 5], [6, 7], [8, 9]]
    chunked = pa.chunked_array([arr.slice(0, 1), arr.slice(4, 2)])
    assert transfer.fixed_list_to_numpy(chunked).tolist() == [[0, 1], [8, 9], [10, 11]]


def test_iter_batches_visits_shards_in_an_order_drawn_from_rng(tiny_scored_dir):
    def first_ids(rng):
        return [b.column(0)[0].as_py() for b in transfer.iter_batches(tiny_scored_dir, [schema.ID], 10000, rng=rng)]
    assert first_ids(None) == ["r0", "r64"]  # two non-empty shards, file order
    orders = {tuple(first_ids(random.Random(seed))) for seed in range(8)}
    assert orders == {("r0", "r64"), ("r64", "r0")}


def test_to_dataset_reads_the_scored_set_with_hf_datasets(tiny_scored_dir):
    ds = transfer.to_dataset(tiny_scored_dir, columns=[schema.TEXT, schema.TEACHER_LOGITS])
    assert len(ds) == 128 and ds.column_names == [schema.TEXT, schema.TEACHER_LOGITS]
    assert len(ds[0][schema.TEACHER_LOGITS]) == 2
