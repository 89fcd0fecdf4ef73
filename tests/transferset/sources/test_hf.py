"""transferset/sources/hf.py: `hf:NAME:SPLIT` read through `datasets`, and what it says when it cannot."""
import re

import pytest

from source_rows import LABELS
from transferset.sources import SourceError, SourceSpec, infer_label_names, parse_hf_spec, read_source


def test_hf_dataset_spec_reads_through_datasets(tmp_path):
    d = tmp_path / "local_ds"
    d.mkdir()
    (d / "train.csv").write_text("sentence,label\nfrom the hub,1\n,0\n")
    recs = list(read_source(SourceSpec(path=f"hf:{d}:train", label_names=LABELS)))
    assert recs[0].text == "from the hub" and recs[0].label == 1
    assert recs[1].reason == "empty text"
    assert parse_hf_spec("hf:glue:sst2:validation") == ("glue", "sst2", "validation")
    assert parse_hf_spec("hf:imdb:test") == ("imdb", None, "test")


@pytest.fixture
def hub_offline(monkeypatch):
    """The Hugging Face Hub unreachable at once, as on a machine without network (no 25 s of retries)."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_an_unknown_hf_dataset_offline_is_one_message(hub_offline):
    """An unknown dataset offline is one message at once, no ConnectionError traceback and no retries: a usage
    error (exit 2), whoever reads it first."""
    from transferset.runtime.errors import ConfigError
    from transferset.sources import check_readable

    for call in (lambda p: check_readable(p), lambda p: list(read_source(SourceSpec(path=p, label_names=LABELS))),
                 infer_label_names):
        with pytest.raises(SourceError, match=r"^hf:nosuch-user/nosuch-set:train: the dataset nosuch-user/nosuch-set: "
                                              r"not a local folder, and HF_HUB_OFFLINE is set with no copy of it in "
                                              r"the Hugging Face cache: give a local folder of the dataset's files, or "
                                              r"unset HF_HUB_OFFLINE on a machine with network$") as err:
            call("hf:nosuch-user/nosuch-set:train")
        assert isinstance(err.value, ConfigError)


def test_an_hf_folder_of_files_that_are_not_utf8_is_one_message(tmp_path, hub_offline):
    """`hf:` on a folder of non-UTF-8 files is one message, not a UnicodeDecodeError traceback."""
    from transferset.sources import check_readable

    d = tmp_path / "latin1"
    d.mkdir()
    (d / "train.csv").write_bytes("sentence,label\nun café noir,1\n".encode("latin-1"))
    for call in (lambda p: check_readable(p), lambda p: list(read_source(SourceSpec(path=p, label_names=LABELS)))):
        with pytest.raises(SourceError, match=rf"^hf:{re.escape(str(d))}:train: the files of .* are not UTF-8 text "
                                              r"\('utf-8' codec can't decode byte 0xe9"):
            call(f"hf:{d}:train")
    with pytest.raises(SourceError, match=r"empty: no such folder \(hf:PATH:SPLIT reads a local folder"):
        check_readable(f"hf:{tmp_path / 'empty'}:nosuch")  # the folder, not the split
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match=r"split 'nosuch'"):
        check_readable(f"hf:{tmp_path / 'empty'}:nosuch")
