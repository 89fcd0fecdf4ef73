"""transferset.fs.links: the symbolic links inside an output, found without entering them, and refused."""
import os

import pytest

from transferset.fs.links import links_on_the_way, links_under, refuse_links
from transferset.runtime.errors import ConfigError


def test_links_under_a_folder_are_listed_and_never_entered(tmp_path):
    other = tmp_path / "other"
    (other / "deep").mkdir(parents=True)
    (other / "deep" / "part-0.parquet").write_bytes(b"rows")
    out = tmp_path / "out"
    (out / "rejects").mkdir(parents=True)
    os.symlink(other, out / "data")
    os.symlink(other / "deep" / "part-0.parquet", out / "rejects" / "rejects.jsonl")
    (out / "stats.json").write_text("{}")
    assert links_under(str(out)) == ["data", "rejects/rejects.jsonl"]
    assert links_under(str(other)) == [] and links_under(str(tmp_path / "missing")) == []
    assert links_under("memory://bucket/out") == []


def test_links_on_the_way_to_a_folder_below_the_top_are_found(tmp_path):
    (tmp_path / "real" / "x").mkdir(parents=True)
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(tmp_path / "real", run / "students")
    assert links_on_the_way(str(run), str(run / "students" / "x")) == ["students"]
    assert links_on_the_way(str(run), str(run / "teacher")) == []
    assert links_on_the_way(str(run), str(tmp_path / "real")) == []  # not below the top: not the run's to check


def test_a_link_is_refused_in_one_line_naming_it_and_where_it_points(tmp_path):
    refuse_links(str(tmp_path), [])  # none: nothing to say
    os.symlink(tmp_path, tmp_path / "data")
    with pytest.raises(ConfigError) as exc:
        refuse_links(str(tmp_path), ["data", "rejects/x"], "--output")
    message = str(exc.value)
    assert "\n" not in message
    assert message.startswith(f"--output {tmp_path}: data is a symbolic link (to {os.path.realpath(tmp_path)}) "
                              "(and 1 more)")
