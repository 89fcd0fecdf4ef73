"""students/data/teacher_files.py, the parts that read only the scored set's metadata and columns: the teacher's
depth and the columns pkd reads (the teacher and tokenizer folders are tested through `train`)."""
import pytest

from students.data import teacher_files
from transferset.contract import schema
from transferset.runtime.errors import UserError

META = {schema.META_HIDDEN_SPEC: {schema.HIDDEN_LAYER: 4, schema.HIDDEN_NUM_LAYERS: 4}}
L1, L2 = schema.hidden_layer_column(1), schema.hidden_layer_column(2)  # teacher_hidden_l1, teacher_hidden_l2
NAMES = [schema.ID, schema.TEXT, schema.TEACHER_HIDDEN, L2, L1]


def test_the_teachers_depth_comes_from_the_hidden_spec_first():
    assert teacher_files.teacher_depth(META, None) == 4
    assert teacher_files.teacher_depth({}, None) is None  # neither the spec nor a teacher folder tells


def test_pkd_reads_each_mapped_layer_from_its_column_and_the_last_from_teacher_hidden():
    assert teacher_files.pkd_columns("set", NAMES, META, [2, 4]) == [L2, schema.TEACHER_HIDDEN]
    assert teacher_files.pkd_columns("set", NAMES, META, [1, 2]) == [L1, L2]


def test_pkd_refuses_a_layer_the_set_lacks_with_the_layers_it_has_and_the_command_that_adds_it():
    with pytest.raises(UserError) as exc:
        teacher_files.pkd_columns("set", NAMES, META, [3, 4])
    assert str(exc.value) == ("set: pkd needs the teacher's hidden states of layers [3, 4] (student layer j ↔ teacher "
                              "layer), the set has layers [1, 2, 4]; rescore with `transferset score --layers 3,4`")
