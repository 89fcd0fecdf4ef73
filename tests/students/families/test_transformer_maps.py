"""students/families/transformer_maps.py: which teacher layer stands behind each student layer (the layer losses' pairs,
`layer_map`, are tested with the losses: tests/students/losses/test_layerwise.py)."""
import pytest

from students.families import transformer, transformer_maps


def test_teacher_layer_map_skip_keeps_every_mth_layer_ending_at_the_top():
    assert transformer_maps.teacher_layer_map(3, 6, "skip") == [2, 4, 6]
    assert transformer_maps.teacher_layer_map(2, 6, "skip") == [3, 6]
    assert transformer_maps.teacher_layer_map(4, 12, "skip") == [3, 6, 9, 12]
    assert transformer_maps.teacher_layer_map(3, 6, "first") == [1, 2, 3]
    assert transformer_maps.teacher_layer_map(2, 4, "random") == [2, 4]  # PKD targets of a random student
    with pytest.raises(ValueError, match="7-layer student"):
        transformer_maps.teacher_layer_map(7, 6, "skip")
    with pytest.raises(ValueError, match="init must be one of"):
        transformer_maps.teacher_layer_map(2, 6, "every")


def test_the_family_module_still_offers_the_maps_under_its_name():
    # `from students.families.transformer import layer_pairs` (and the like) predates this module
    assert transformer.teacher_layer_map is transformer_maps.teacher_layer_map
    assert transformer.layer_pairs is transformer_maps.layer_pairs
    assert transformer.INITS == transformer_maps.INITS == ("skip", "first", "random")
