"""file:// URLs are local paths everywhere; an unknown URL scheme is one usage-error line (exit 2)."""
import json
import os

import pytest

from transferset import fs
from transferset.app import cli
from transferset.contract import schema
from transferset.data import transfer
from transferset.runtime.errors import ConfigError
import builders as testing


def url(path) -> str:
    return "file://" + os.path.abspath(str(path))


def test_normalize_turns_file_urls_into_local_paths_and_leaves_the_rest():
    assert fs.normalize("file:///data/x.tsv") == "/data/x.tsv"
    assert fs.normalize("file://localhost/data/x.tsv") == "/data/x.tsv"
    assert fs.normalize("file://rel/x.tsv") == "rel/x.tsv"  # as fsspec reads it
    assert fs.normalize("FILE:///X") == "/X"
    for same in ("rel/x.tsv", "/abs/x", "gs://b/x", "memory://m/x", "hf:glue:sst2:train", "s3://b/k"):
        assert fs.normalize(same) == same
    assert fs.local_path("file:///data/x") == "/data/x" and fs.local_path("gs://b/x") is None
    with pytest.raises(ConfigError, match=r"^--input nosuch://x: unknown URL scheme nosuch://"):
        fs.normalize("nosuch://x", "--input")
    assert fs.normalize("azfs://acct/c/x", "--input", schemes=["azfs"]) == "azfs://acct/c/x"


def test_augment_then_score_with_file_urls_write_where_the_urls_point(tmp_path, tiny_teacher, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a path taken literally would land in ./file:/...
    src = tmp_path / "in.tsv"
    src.write_text("sentence\tlabel\n" + "".join(f"the film number {i} is good\t{i % 2}\n" for i in range(12)))
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\nthe film number 3 is good\t1\n")
    augmented, scored = tmp_path / "out" / "transfer", tmp_path / "out" / "scored"
    assert cli.main(["augment", "--input", url(src), "--exclude", url(dev), "--output", url(augmented),
                     "--ops", "mask", "--n-iter", "1"]) == 0
    stats = json.loads((augmented / schema.STATS_FILE).read_text())
    assert stats["excluded_dropped"] >= 1 and list(stats["inputs"]) == [str(src)]  # the path, not the URL
    assert (augmented / schema.COMPLETE_MARKER).exists()
    assert cli.main(["score", "--input", url(augmented), "--teacher", url(tiny_teacher),
                     "--output", url(scored)]) == 0
    assert (scored / schema.COMPLETE_MARKER).exists()
    meta = transfer.read_metadata(str(scored), scored=True)
    assert meta[schema.META_INPUT]["path"] == str(augmented)
    assert meta[schema.META_TEACHER_ID] == os.path.abspath(tiny_teacher)
    assert not (tmp_path / "file:").exists()


def test_stage_functions_take_file_urls_too(tmp_path, tiny_teacher):
    """The runner calls the stage functions directly: they normalise as the command line does."""
    from pipelines.augment import run_augment
    from pipelines.score import run_score
    from transferset.config import AugmentConfig, ScoreConfig

    src = tmp_path / "in.tsv"
    src.write_text("sentence\tlabel\n" + "".join(f"a good film {i}\t{i % 2}\n" for i in range(10)))
    run_augment(AugmentConfig(ops=("mask",), n_iter=1), inputs=[url(src)], output=url(tmp_path / "t"))
    stats = run_score(ScoreConfig(), input=url(tmp_path / "t"), teacher=url(tiny_teacher), output=url(tmp_path / "s"))
    assert stats["scored"] == transfer.num_rows(str(tmp_path / "t"))


def test_teacher_with_file_urls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = testing.tiny_classifier(str(tmp_path / "base"), initializer_range=0.02)
    data = tmp_path / "train.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"a {'good' if i % 2 else 'bad'} film\t{i % 2}\n" for i in range(8)))
    out = tmp_path / "teacher"
    assert cli.main(["teacher", "--train", url(data), "--dev", url(data), "--output", url(out), "--model", url(base),
                     "--epochs", "1", "--max-steps", "1", "--batch-size", "8", "--max-length", "16",
                     "--no-progress"]) == 0
    assert (out / schema.WEIGHTS_FILE).exists() and not (out / schema.LOCK_FILE).exists()
    assert not (tmp_path / "file:").exists()


@pytest.mark.parametrize("argv, option", [
    (["augment", "--input", "nosuch://x/in.tsv", "--output", "o"], "--input"),
    (["augment", "--input", "in.tsv", "--output", "nosuch://x/o"], "--output"),
    (["score", "--input", "i", "--teacher", "nosuch://x/t", "--output", "o"], "--teacher"),
    (["teacher", "--train", "nosuch://x/t.tsv", "--dev", "d.tsv", "--output", "o"], "--train"),
    (["train", "--transfer", "t", "--dev", "d.tsv", "--output", "nosuch://x/o"], "--output"),
    (["evaluate", "--model", "m", "--data", "nosuch://x/d.tsv"], "--data"),
    (["inspect", "nosuch://x/o"], "OUT"),
    (["run", "--config", "nosuch://x/c.yaml"], "--config"),
    (["predict", "--model", "m", "--input", "a.tsv", "--output", "nosuch://x/o"], "--output"),
    (["export", "--model", "nosuch://x/m", "--output", "o"], "--model"),
])
def test_unknown_scheme_is_one_usage_error_line_for_every_command(argv, option, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"transferset {argv[0]}: error: {option} nosuch://x/")
    assert "unknown URL scheme nosuch://" in err
    assert os.listdir(tmp_path) == []  # nothing written


@pytest.mark.parametrize("name, argv, dests", [
    ("train", ["--transfer", "file:///a/set", "--dev", "file://rel/dev.tsv", "--output", "file:///abs/dir",
               "--config", "file:///c.yaml"], {"transfer": "/a/set", "dev": "rel/dev.tsv", "output": "/abs/dir",
                                               "config": "/c.yaml"}),
    # --model repeats for a teacher ensemble: a list, each path converted
    ("evaluate", ["--model", "file:///m", "--model", "file://n", "--data", "file:///d.tsv"],
     {"model": ["/m", "n"], "data": "/d.tsv"}),
    ("run", ["--config", "file:///c.yaml"], {"config": "/c.yaml"}),
    ("inspect", ["file:///o"], {"directory": "/o"}),
    ("predict", ["--model", "file:///m", "--input", "file:///a.tsv", "file://b.jsonl", "--output", "file:///o"],
     {"model": "/m", "input": ["/a.tsv", "b.jsonl"], "output": "/o"}),
    ("export", ["--model", "file:///m", "--output", "file:///o"], {"model": "/m", "output": "/o"}),
])
def test_every_command_sees_local_paths_for_file_urls(name, argv, dests, monkeypatch):
    module, _, _ = cli.build_subparser(name)
    seen = {}
    monkeypatch.setattr(module, "run", lambda args, extra: seen.update(vars(args)) or 0)
    assert cli.main([name, *argv]) == 0
    assert {k: seen[k] for k in dests} == dests
