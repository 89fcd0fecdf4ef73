"""Fixtures shared by the ops' tests (imported by them, not a conftest.py: `from conftest import ...` in
other tests takes whichever conftest module was imported last): 400 SST-2 training sentences as words, and the same with their POS tags."""
import pytest

from transferset.augment.pos import Tagger
from transferset.config import AugmentConfig
from transferset.sources import SourceSpec, read_source


@pytest.fixture(scope="module")
def sentences(sst2_dir):
    recs = read_source(SourceSpec(path=str(sst2_dir / "train.tsv"), label_names=("0", "1"), limit=400))
    return [r.text.split() for r in recs]


@pytest.fixture(scope="module")
def tagged(sentences):
    tagger = Tagger(AugmentConfig().spacy_model)
    return sentences, tagger.tag(sentences)
