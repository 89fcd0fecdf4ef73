"""Shared fixtures: the real SST-2 files from ../shared/data (never copied into the repo)."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

import builders as testing

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
SST2 = SHARED_DATA / "sst2"


@pytest.fixture(scope="session", autouse=True)
def cache_folder(tmp_path_factory):
    """The suite's own $TRANSFERSET_CACHE (copied teachers, contextual vectors), never the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRANSFERSET_CACHE", str(tmp_path_factory.mktemp("transferset-cache")))
        yield


@pytest.fixture(scope="session", autouse=True)
def fp32_where_auto():
    """`precision: auto` (the teacher's default) resolves as on a device without bfloat16 arithmetic, so a test's
    figures are the same on every machine (module fixtures included); the tests of `auto` set has_bf16 as they need."""
    from transferset.training import engine

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "has_bf16", lambda device: False)
        yield


@pytest.fixture(scope="session")
def sst2_dir() -> Path:
    if not (SST2 / "train.tsv").exists():
        pytest.fail(f"SST-2 not found at {SST2}: the tests read the real data from ../shared/data")
    return SST2


def _head_tsv(src: Path, dst: Path, n: int) -> Path:
    with open(src, encoding="utf-8") as fh, open(dst, "w", encoding="utf-8") as out:
        out.writelines(itertools.islice(fh, n + 1))
    return dst


@pytest.fixture(scope="session")
def head_tsv():
    """Copy the header and the first n rows of a TSV into a temp file (test-local data only)."""
    return _head_tsv


WORDS = ("film movie story plot actor acting great good bad awful boring funny dull charming "
         "the a is was and of to it this that not very really").split()


@pytest.fixture(scope="session")
def tiny_mlm_dir(tmp_path_factory):
    """A tiny BertForMaskedLM saved to disk, so tests load it through the real from_pretrained path."""
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    d = tmp_path_factory.mktemp("tiny_mlm")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "##s", "##ing", "##film", "un"] + WORDS
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizer(vocab=str(d / "vocab.txt"), do_lower_case=True)  # transformers 5: `vocab`, not vocab_file
    assert tok.tokenize("unfilms") == ["un", "##film", "##s"]
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    BertForMaskedLM(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


@pytest.fixture(scope="session")
def tiny_teacher(tmp_path_factory):
    """A tiny randomly initialised BERT classifier saved with save_pretrained (safetensors)."""
    return testing.tiny_classifier(str(tmp_path_factory.mktemp("tiny_teacher")))


@pytest.fixture(scope="session")
def reference(tiny_teacher):
    """The plain Hugging Face path the scorer must agree with: model(**tokenizer(text)) one row at a time."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_teacher)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_teacher).eval()

    def run(text, text_b=None, max_length=128):
        with torch.no_grad():
            enc = tok(text, text_b, truncation=True, max_length=max_length, return_tensors="pt")
            out = model(**enc, output_hidden_states=True)
        return out.logits[0].numpy(), [h[0].numpy() for h in out.hidden_states]  # (C,), [(T, H)] per layer

    return run


@pytest.fixture(scope="session")
def sst2_sentences(sst2_dir) -> list[str]:
    """The first 400 SST-2 train sentences: what the tiny teachers' tokenizers are trained on."""
    return testing.read_sentences(str(sst2_dir / "train.tsv"), 400)


@pytest.fixture(scope="session")
def family_teacher(tmp_path_factory, sst2_sentences):
    """family → a tiny random sequence classifier of that family (transferset.testing.FAMILIES) with its
    tokenizer trained on SST-2 sentences, saved as a teacher folder; each built once per session."""
    built: dict[str, str] = {}

    def get(family: str) -> str:
        if family not in built:
            built[family] = testing.tiny_family_classifier(
                str(tmp_path_factory.mktemp(f"teacher_{family}")), family, sst2_sentences)
        return built[family]

    return get
