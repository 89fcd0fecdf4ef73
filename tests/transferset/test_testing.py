"""transferset.testing: the builders users' own tests import, without a test framework or torch."""
import subprocess
import sys

import builders
from transferset import testing
from transferset.contract import schema
from transferset.data import transfer


def test_importing_the_builders_loads_no_test_framework_and_no_model_library():
    code = ("import sys, transferset.testing; "
            "print(sorted(m for m in ('pytest', 'hypothesis', 'torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_projects_builders_are_the_package_ones(tmp_path):
    assert builders.write_transfer_set is testing.write_transfer_set and builders.tiny_classifier is testing.tiny_classifier
    out = testing.write_scored_set(str(tmp_path / "s"), ["a good film", "a dull plot", "fine"], [[0, 1], [2, 0], [0, 3]],
                                   [[0.5, 1.0], [1.5, 2.0], [0.0, 0.25]], ("neg", "pos"), labels=[1, 0, None])
    table = transfer.read_table(out)
    assert table.column(schema.TEACHER_LABEL).to_pylist() == [1, 0, 1]
    assert table.column(schema.LABEL).to_pylist() == [1, 0, None]
    assert table.column(schema.TEACHER_HIDDEN).to_pylist()[2] == [0.0, 0.25]


def test_the_small_student_builder_merges_settings_and_round_trips_through_yaml(tmp_path):
    from transferset.config import StudentConfig
    from transferset.runtime import typed

    assert testing.small_student() == {"threads": 1, "model": {"embed_dim": 8, "hidden": 8}}
    # a model given is merged into the small one; the width sets both small sizes
    values = testing.small_student(16, epochs=2, model={"head_dim": 4, "hidden": 12})
    assert values == {"threads": 1, "epochs": 2, "model": {"embed_dim": 16, "hidden": 12, "head_dim": 4}}
    cfg = StudentConfig(**values)
    assert (cfg.threads, cfg.epochs, cfg.model) == (1, 2, {"embed_dim": 16, "hidden": 12, "head_dim": 4})
    path = testing.write_student_config(str(tmp_path / "small.yaml"), vocab={"embed_init": "random"})
    loaded = typed.load(StudentConfig, typed.read_yaml(path), path)
    assert loaded == StudentConfig(**testing.small_student(vocab={"embed_init": "random"})) and loaded.vocab.embed_init == "random"
