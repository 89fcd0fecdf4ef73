"""What every stage kind reads: the run's split files and the fingerprints that enter keys."""
from transferset.app.stages.context import fingerprint, splits_train
from stage_plans import plan_of  # noqa: F401 (a fixture)


def test_the_run_reads_the_split_files_when_train_is_split(plan_of, tmp_path, sst2_dir):
    out = plan_of().outputs
    assert out.selection == str(tmp_path / "r" / "data" / "validation.jsonl")  # the carve chooses
    assert out.test == str(sst2_dir / "dev.tsv")  # the dev file only reports
    no_carve = plan_of("validation=null", "labeled_limit=50", "unlabeled_rows=null").outputs
    assert (no_carve.selection, no_carve.test, no_carve.data) == (str(sst2_dir / "dev.tsv"), None, None)


def test_fingerprint_is_the_content(tmp_path):
    a, b = tmp_path / "a.tsv", tmp_path / "b.tsv"
    a.write_text("sentence\tlabel\nx\t1\n")
    b.write_text("sentence\tlabel\nx\t1\n")
    assert fingerprint(str(a)) == fingerprint(str(b)) != fingerprint(str(tmp_path / "missing"))
    b.write_text("sentence\tlabel\nx\t0\n")
    assert fingerprint(str(a)) != fingerprint(str(b))
    assert fingerprint("hf:glue:sst2:train") == "hf:glue:sst2:train"


def test_splits_train_follows_the_split_settings(plan_of):
    from transferset.app.run.runner import load_config
    assert splits_train(load_config("configs/demo.yaml"))
    assert not splits_train(load_config("configs/demo.yaml", ["validation=null", "unlabeled_rows=null"]))
