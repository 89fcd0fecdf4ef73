"""`tokens: words` counts its vocabulary over the transfer set: a min_count or max_vocab that keeps no word, or
almost none, makes every word [UNK] and a student that predicts one label for every row. `train` refuses the
first (exit 2, nothing trained) and says the second in one line before it trains."""
import json
from collections import Counter

import pyarrow.parquet as pq
import pytest

from transferset import testing
from transferset.app.cli import main
from transferset.contract import schema
from students.data.tokens import PAD, SEP, UNK, WordTokens


@pytest.fixture(scope="module")
def word_counts(tiny_scored_dir) -> Counter:
    """Each word's count over the scored set's texts, as the vocabulary counts them."""
    counts: Counter = Counter()
    for text in pq.read_table(f"{tiny_scored_dir}/{schema.DATA_DIR}", columns=[schema.TEXT]).column(0).to_pylist():
        counts.update(WordTokens.split(text))
    return counts


@pytest.fixture(scope="module")
def words_config(tmp_path_factory) -> str:
    return testing.write_student_config(str(tmp_path_factory.mktemp("words") / "cfg.yaml"), report={"latency_examples": 8},
                                        vocab={"embed_init": "random", "tokens": "words"})


def _train(tiny_scored_dir, sst2_dev200, out, config, capsys, *flags):
    rc = main(["train", "--transfer", tiny_scored_dir, "--dev", sst2_dev200, "--output", str(out),
               "--config", config, "--epochs", "1", "--no-progress", *flags])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if "word vocabulary keeps" in line]


def test_a_min_count_above_every_words_count_is_refused(tmp_path, tiny_scored_dir, sst2_dev200, words_config,
                                                        word_counts, capsys):
    word, top = min(word_counts.items(), key=lambda wc: (-wc[1], wc[0]))
    for min_count in (100000, top + 1):
        rc, err = _train(tiny_scored_dir, sst2_dev200, tmp_path / "o", words_config, capsys,
                         "--min-count", str(min_count))
        assert rc == 2, err
        assert f"min_count {min_count} keeps no word" in err and f"{word!r} is seen {top} times" in err, err
        assert f"set min_count to {top} or less" in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "o" / schema.STUDENT_MODEL_DIR).exists()


def test_a_max_vocab_with_no_room_for_a_word_is_refused(tmp_path, tiny_scored_dir, sst2_dev200, words_config,
                                                        word_counts, capsys):
    rc, err = _train(tiny_scored_dir, sst2_dev200, tmp_path / "o", words_config, capsys, "--max-vocab", "3")
    assert rc == 2, err
    assert "max_vocab 3 keeps no word" in err and f"{len(word_counts)} distinct words" in err, err
    assert "set max_vocab to at least 4" in err and not (tmp_path / "o" / schema.STUDENT_MODEL_DIR).exists()


def _vocab(out) -> list[str]:
    return json.loads((out / schema.STUDENT_MODEL_DIR / "vocab.json").read_text(encoding="utf-8"))


def test_a_vocabulary_of_few_of_the_words_seen_is_said_in_one_line(tmp_path, tiny_scored_dir, sst2_dev200,
                                                                    words_config, word_counts, capsys):
    top = max(word_counts.values())
    kept = sorted((w for w, c in word_counts.items() if c >= top), key=lambda w: (-word_counts[w], w))
    share = 100 * len(kept) / len(word_counts)
    assert share < 5  # what this test is about: the set's most frequent words only
    rc, err = _train(tiny_scored_dir, sst2_dev200, tmp_path / "min", words_config, capsys, "--min-count", str(top))
    assert rc == 0, err
    assert _vocab(tmp_path / "min") == [PAD, UNK, SEP, *kept]
    warning, = _warnings(err)
    unknown = 100 - 100 * sum(word_counts[w] for w in kept) / sum(word_counts.values())
    assert f"keeps {len(kept)} of the {len(word_counts)} distinct words of the transfer set ({share:.1f} %; " \
           f"min_count {top}, max_vocab 50000): the rest, {unknown:.1f} % of the words read, are [UNK]" in warning

    rc, err = _train(tiny_scored_dir, sst2_dev200, tmp_path / "cap", words_config, capsys, "--max-vocab", "13")
    assert rc == 0, err
    assert _vocab(tmp_path / "cap")[3:] == sorted(word_counts, key=lambda w: (-word_counts[w], w))[:10]
    warning, = _warnings(err)
    assert f"keeps 10 of the {len(word_counts)} distinct words" in warning and "max_vocab 13" in warning, warning

    # min_count 2 keeps more than 5 % of the distinct words: no line
    assert sum(1 for c in word_counts.values() if c >= 2) >= 0.05 * len(word_counts)
    rc, err = _train(tiny_scored_dir, sst2_dev200, tmp_path / "most", words_config, capsys, "--min-count", "2")
    assert rc == 0, err
    assert len(_vocab(tmp_path / "most")) == 3 + sum(1 for c in word_counts.values() if c >= 2) and not _warnings(err)


def test_run_refuses_a_students_min_count_that_keeps_no_word_and_reuses_its_scored_set_after(
        tmp_path, sst2_dir, head_tsv, tiny_teacher4, capsys):
    """`run` trains its students with `train`'s code: the refusal comes at that student's stage, before it trains;
    the teacher's and the scored set's stages, whose keys no student setting enters, are reused once it is fixed."""
    import re

    import yaml

    data = tmp_path / "data"
    data.mkdir()
    head_tsv(sst2_dir / "train.tsv", data / "train.tsv", 80)
    head_tsv(sst2_dir / "dev.tsv", data / "dev.tsv", 40)
    student = {"student": "bilstm", "phases": "joint", "vocab": {"tokens": "words", "embed_init": "random"}, "epochs": 1,
               **testing.small_student(report={"latency_examples": 8})}
    config = {"run_dir": str(tmp_path / "run"), "labeled_limit": 60, "validation": {"rows": 20, "seed": 0},
              "teacher_path": tiny_teacher4, "teacher": {"max_length": 32},
              "augment": {"recipe": "tang", "n_iter": 1, "seed": 0}, "students": {"words": student}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    argv = ["run", "--config", str(tmp_path / "run.yaml"), f"data={data}", "report.latency_rows=8",
            "report.latency_rounds=1"]
    assert main([*argv, "students.words.vocab.min_count=100000"]) == 2
    err = capsys.readouterr().err
    said = re.search(r"min_count 100000 keeps no word of the transfer set \('.+' is seen (\d+) times", err)
    assert said and "Traceback" not in err, err
    assert not (tmp_path / "run" / "students" / "words" / schema.STUDENT_MODEL_DIR).exists()

    top = said.group(1)
    assert main([*argv, f"students.words.vocab.min_count={top}"]) == 0
    err = capsys.readouterr().err
    assert "[score] up to date" in err and len(_warnings(err)) == 1 and f"min_count {top}," in _warnings(err)[0]
    assert len(_vocab(tmp_path / "run" / "students" / "words")) > 3
