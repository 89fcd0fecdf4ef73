import builtins

import pytest
import torch

from students.data import vectors
from students.data.tokens import pca_project, teacher_input_embeddings
from transferset.runtime.errors import UserError

TEXTS = [["the movie was good", "the film was bad", "a good story and a bad plot", "the acting was great"],
         ["i love this film", "i hate this movie", "the best story ever", "the worst plot ever"]]


@pytest.fixture(scope="module")
def tokenizer(tiny_teacher):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_teacher)


def test_sif_weights_are_model2vecs_formula_on_zipf_ranks():
    # two ids: 1/(id+2) = 1/2, 1/3, normalised p = 0.6, 0.4; weight sif / (sif + p)
    w = vectors.sif_weights(2, sif=0.4)
    assert w.tolist() == pytest.approx([0.4 / 1.0, 0.4 / 0.8])
    many = vectors.sif_weights(1000)
    assert bool((many[1:] > many[:-1]).all())  # rarer (later) ids weigh more
    assert 0 < float(many[0]) < float(many[-1]) < 1


def test_model2vec_rows_are_the_pca_of_each_token_alone_through_the_encoder_then_weighted(tiny_teacher, tokenizer):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_teacher).eval()
    direct = []
    with torch.no_grad():  # one sequence at a time: [SEP] id [CLS], mean of the last layer over the three positions
        for i in range(len(tokenizer)):
            ids = torch.tensor([[tokenizer.sep_token_id, i, tokenizer.cls_token_id]])
            direct.append(model(input_ids=ids).last_hidden_state[0].mean(0))
    direct = torch.stack(direct)
    batched = vectors.encoder_token_outputs(tiny_teacher, tokenizer, batch_size=7)  # a ragged last batch
    assert batched.shape == direct.shape
    assert torch.allclose(batched, direct, atol=1e-5)
    table = vectors.embedding_table(tokenizer, tiny_teacher, 8, "model2vec", [])
    expected = pca_project(direct, 8) * vectors.sif_weights(len(tokenizer))[:, None]
    assert table.shape == (len(tokenizer), 8)
    # a principal axis is defined up to its sign, and eigh picks it afresh for inputs 1e-6 apart
    signs = torch.sign((table * expected).sum(0))
    assert torch.allclose(table, expected * signs, atol=1e-4)


def test_teacher_method_is_the_pca_of_the_input_embeddings(tiny_teacher, tokenizer):
    table = vectors.embedding_table(tokenizer, tiny_teacher, 8, "teacher", [], seed=3)
    assert torch.equal(table, pca_project(teacher_input_embeddings(tiny_teacher, len(tokenizer)), 8, 3))


def test_word2vec_rows_of_seen_ids_are_gensims_and_unseen_ids_map_affinely(tokenizer):
    from gensim.models import Word2Vec

    fallback = torch.randn(len(tokenizer), 8, generator=torch.Generator().manual_seed(0))
    seen = sorted({i for batch in TEXTS for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]
                   for i in ids})
    unseen = [i for i in range(len(tokenizer)) if i not in seen]
    u1, u2, u3 = unseen[:3]
    fallback[u3] = (fallback[u1] + fallback[u2]) / 2
    table = vectors.word2vec_table(tokenizer, TEXTS, 8, fallback, seed=5)
    again = vectors.word2vec_table(tokenizer, TEXTS, 8, fallback, seed=5)
    assert torch.equal(table, again)  # seeded, one worker
    sentences = [[str(i) for i in ids] for batch in TEXTS
                 for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]]
    w2v = Word2Vec(sentences, vector_size=8, sg=1, window=5, min_count=1, epochs=5, seed=5, workers=1)
    own = torch.tensor(w2v.wv.vectors)
    for i in seen:
        assert torch.allclose(table[i], own[w2v.wv.key_to_index[str(i)]] / own.std(), atol=1e-5)
    # an affine map keeps midpoints; a random or teacher-space row would not
    assert torch.allclose(table[u3], (table[u1] + table[u2]) / 2, atol=1e-4)
    assert not torch.allclose(table[u1], fallback[u1], atol=1e-2)


def test_word2vec_without_gensim_names_the_extra(monkeypatch, tokenizer):
    real = builtins.__import__

    def no_gensim(name, *args, **kwargs):
        if name.startswith("gensim"):
            raise ImportError("No module named 'gensim'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gensim)
    with pytest.raises(UserError, match=r"transferset\[vectors\]"):
        vectors.word2vec_table(tokenizer, TEXTS, 8, torch.zeros(len(tokenizer), 8))


def test_word2vec_on_no_text_is_refused(tokenizer):
    with pytest.raises(UserError, match="no text"):
        vectors.word2vec_table(tokenizer, [[]], 8, torch.zeros(len(tokenizer), 8))


def test_contextual_rows_are_each_ids_output_states_averaged_over_the_texts(tiny_teacher, tokenizer):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_teacher).eval()
    sums, counts = {}, {}
    with torch.no_grad():  # one text at a time, no padding: every real token's last-layer state
        for text in [t for batch in TEXTS for t in batch]:
            enc = tokenizer(text, return_tensors="pt")
            hidden = model(**enc).last_hidden_state[0]
            for pos, i in enumerate(enc["input_ids"][0].tolist()):
                if i not in tokenizer.all_special_ids:
                    sums[i] = sums.get(i, 0) + hidden[pos]
                    counts[i] = counts.get(i, 0) + 1
    # batches of 3 over 8 texts: padding and a ragged last batch must count for nothing
    got_sums, got_counts = vectors.contextual_outputs(tiny_teacher, tokenizer, TEXTS, 32, batch_size=3)
    assert {i: int(c) for i, c in enumerate(got_counts.tolist()) if c} == counts
    for i in counts:
        assert torch.allclose(got_sums[i].float(), sums[i], atol=1e-4)
    table = vectors.contextual_table(tokenizer, tiny_teacher, TEXTS, 32)
    good = tokenizer.convert_tokens_to_ids("good")
    assert torch.allclose(table[good], sums[good] / counts[good], atol=1e-5)
    # unseen ids: the teacher's input rows through the affine map fitted on the seen ids (a midpoint stays one)
    inputs = teacher_input_embeddings(tiny_teacher, len(tokenizer))
    seen = torch.tensor(sorted(counts))
    expected = vectors.mapped_fill(inputs, seen, table[seen])
    assert torch.allclose(table, expected, atol=1e-5)
    unseen = [i for i in range(len(tokenizer)) if i not in counts]
    assert not torch.allclose(table[unseen[0]], inputs[unseen[0]], atol=1e-2)
    # the table as embedding_table gives it, at a width: the same rows PCA'd
    narrow = vectors.embedding_table(tokenizer, tiny_teacher, 8, "contextual", TEXTS, seed=1, max_length=32)
    assert torch.allclose(narrow, pca_project(table, 8, 1), atol=1e-4)
    # a limit reads the first texts only
    _, first = vectors.contextual_outputs(tiny_teacher, tokenizer, TEXTS, 32, limit=2)
    assert int(first.sum()) == sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in TEXTS[0][:2])


def test_contextual_on_no_text_is_refused(tiny_teacher, tokenizer):
    with pytest.raises(UserError, match="no text"):
        vectors.contextual_table(tokenizer, tiny_teacher, [[]], 32)


def test_contextual_table_is_kept_in_the_cache_and_read_back_for_the_same_inputs_only(tiny_teacher, tokenizer,
                                                                                    tmp_path, monkeypatch):
    monkeypatch.setenv("TRANSFERSET_CACHE", str(tmp_path))
    made = vectors.contextual_table(tokenizer, tiny_teacher, TEXTS, 32)
    kept = sorted((tmp_path / "vectors").iterdir())
    assert [p.name.startswith("contextual-") and p.suffix == ".pt" for p in kept] == [True]
    assert vectors.contextual_cache(tokenizer, tiny_teacher, [t for b in TEXTS for t in b], 32) == str(kept[0])

    passes = []
    real = vectors.contextual_outputs
    monkeypatch.setattr(vectors, "contextual_outputs", lambda *a, **k: passes.append(a) or real(*a, **k))
    again = vectors.contextual_table(tokenizer, tiny_teacher, TEXTS, 32)
    assert passes == [] and torch.equal(again, made)  # read back: no pass of the teacher
    # other texts, another max_length or fewer texts (a limit): each its own pass and file, as made without a cache
    other = [["a dull and boring movie"]]
    vectors.contextual_table(tokenizer, tiny_teacher, other, 32)
    shorter = vectors.contextual_table(tokenizer, tiny_teacher, TEXTS, 4)
    vectors.contextual_table(tokenizer, tiny_teacher, TEXTS, 32, limit=3)
    assert len(passes) == 3 and len(list((tmp_path / "vectors").iterdir())) == 4
    sums, counts = real(tiny_teacher, tokenizer, TEXTS, 4)
    good = tokenizer.convert_tokens_to_ids("good")
    assert int(counts[good]) > 0 and torch.allclose(shorter[good], (sums[good] / counts[good]).float(), atol=1e-5)
    # an unreadable file is made again and written over
    kept[0].write_bytes(b"not a tensor")
    assert torch.equal(vectors.contextual_table(tokenizer, tiny_teacher, TEXTS, 32), made) and len(passes) == 4
    assert torch.equal(torch.load(kept[0], weights_only=True), made)


def test_contextual_cache_key_follows_the_teachers_weights(tiny_teacher, tokenizer, tmp_path):
    import shutil

    copy = tmp_path / "teacher"
    shutil.copytree(tiny_teacher, copy)
    flat = [t for b in TEXTS for t in b]
    assert vectors.contextual_cache(tokenizer, str(copy), flat, 32) == vectors.contextual_cache(
        tokenizer, tiny_teacher, flat, 32)  # a copied teacher: the same vectors
    weights = next(p for p in copy.iterdir() if p.name.endswith(vectors.WEIGHT_SUFFIXES))
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x01")
    assert vectors.contextual_cache(tokenizer, str(copy), flat, 32) != vectors.contextual_cache(
        tokenizer, tiny_teacher, flat, 32)
