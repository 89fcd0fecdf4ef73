"""transferset/packed/kernels.py: rows laid end to end, and the runs of equal length each attention call takes."""
import numpy as np
import torch

from transferset import packed
from transferset.packed import kernels


def test_groups_of_equal_length():
    lengths = np.array([5, 5, 3, 3, 3, 1])
    offsets = np.array([0, 5, 10, 13, 16, 19])
    assert kernels.groups_of_equal_length(lengths, offsets) == [(0, 2, 5), (10, 3, 3), (19, 1, 1)]
    assert kernels.groups_of_equal_length(np.array([], dtype=np.int64), np.array([], dtype=np.int64)) == []


def test_layout_gives_each_row_its_first_token_and_the_runs_of_equal_length():
    lengths, offsets, groups = kernels.layout([4, 4, 2, 7])
    assert lengths.tolist() == [4, 4, 2, 7] and offsets.tolist() == [0, 4, 8, 10]
    assert groups == [(0, 2, 4), (8, 1, 2), (10, 1, 7)]  # adjacent rows of equal length share a run


def test_pack_lays_rows_end_to_end_and_fills_missing_token_types_with_zeros():
    ids, types = kernels.pack([[5, 6, 7], [8, 9]], [None, None], torch.device("cpu"))
    assert ids.tolist() == [5, 6, 7, 8, 9] and types is None  # no row has types: none are made up
    ids, types = kernels.pack([[5, 6, 7], [8, 9]], [[0, 1, 1], None], torch.device("cpu"))
    assert ids.tolist() == [5, 6, 7, 8, 9] and types.tolist() == [0, 1, 1, 0, 0]
    assert ids.dtype == types.dtype == torch.int64


def test_the_package_keeps_its_public_names():
    # `from transferset.packed import X` predates the package's modules
    assert packed.pack is kernels.pack and packed.layout is kernels.layout and packed.attention is kernels.attention
    assert packed.PackedBert is packed.PackedClassifier
