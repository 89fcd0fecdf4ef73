"""transferset/config/student.py: a student's settings by concern, each section a dataclass whose fields are flags of
their own names; a section given as a mapping in Python is that section's settings over its defaults."""
import argparse

import pytest

from transferset.app.cli import flags
from transferset.config import (OptimConfig, RunConfig, StudentConfig, StudentDataConfig, StudentReportConfig,
                                VocabConfig)
from transferset.runtime import typed
from transferset.runtime.errors import ConfigError


def test_a_students_sections_load_from_yaml_merge_over_their_defaults_and_are_checked():
    s = typed.load(StudentConfig, {"vocab": {"trim_vocab": True}, "data": {"max_length": 64},
                                   "report": {"latency_examples": 8}}, "x.yaml")
    assert s.vocab == VocabConfig(trim_vocab=True) and s.data == StudentDataConfig(max_length=64)
    assert s.report == StudentReportConfig(latency_examples=8)
    with pytest.raises(ConfigError, match=r"students.s.vocab.tokens = 'chars': input should be 'wordpiece' or 'words'"):
        typed.load(RunConfig, {"students": {"s": {"vocab": {"tokens": "chars"}}}}, "run.yaml")
    with pytest.raises(ConfigError, match=r"students.s.data.max_length = 1: input should be greater than or equal to 2"):
        typed.load(RunConfig, {"students": {"s": {"data": {"max_length": 1}}}}, "run.yaml")


def test_a_section_given_as_a_mapping_in_python_is_that_sections_settings():
    s = StudentConfig(vocab={"embed_init": "random"}, optim={"lr": 1e-3}, report={"agreement_rows": 10})
    assert s.vocab == VocabConfig(embed_init="random") and s.optim == OptimConfig(lr=1e-3)
    assert s.report.agreement_rows == 10 and s.report.latency_examples == StudentReportConfig().latency_examples
    assert s == typed.load(StudentConfig, {"vocab": {"embed_init": "random"}, "optim": {"lr": 1e-3},
                                           "report": {"agreement_rows": 10}}, "x.yaml")
    with pytest.raises(TypeError, match="trim_vocb"):
        StudentConfig(vocab={"trim_vocb": True})


def test_each_sections_field_is_a_flag_of_its_own_name_a_switch_where_it_is_a_yes_or_no():
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser, StudentConfig)
    args = parser.parse_args(["--trim-vocab", "--max-length", "48", "--latency-examples", "4", "--tokens", "words",
                              "--allow-incomplete"])
    cfg = flags.from_args(StudentConfig, args, base={"vocab": {"embed_init": "random"}})
    assert cfg.vocab == VocabConfig(tokens="words", trim_vocab=True, embed_init="random")
    assert (cfg.data.max_length, cfg.data.allow_incomplete, cfg.report.latency_examples) == (48, True, 4)
    # a section's switch, as the command's own: --no-NAME sets it false over a file's true
    off = flags.from_args(StudentConfig, parser.parse_args(["--no-trim-vocab"]), base={"vocab": {"trim_vocab": True}})
    assert off.vocab.trim_vocab is False
