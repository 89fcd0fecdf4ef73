"""students/families/transformer_maps.py: which teacher layer stands behind each student layer (the layer losses' pairs,
`layer_map`, are tested with the losses: tests/students/losses/test_layerwise.py)."""
import pytest

from students.families import transformer_maps


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


def test_init_may_name_the_teacher_layers_to_copy_one_per_student_layer():
    assert transformer_maps.teacher_layer_map(4, 12, [1, 5, 9, 12]) == [1, 5, 9, 12]
    assert transformer_maps.teacher_layer_map(3, 6, "1, 3,6") == [1, 3, 6]
    with pytest.raises(ValueError, match="names 3 teacher layers for a 4-layer student: give n_layer: 3"):
        transformer_maps.teacher_layer_map(4, 12, [1, 6, 12])
    with pytest.raises(ValueError, match="each between 1 and 6"):
        transformer_maps.teacher_layer_map(2, 6, [3, 7])
    with pytest.raises(ValueError, match="must be different"):
        transformer_maps.teacher_layer_map(2, 6, "4,4")
