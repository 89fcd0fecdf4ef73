"""Layer-wise transfer: layer maps, the captured attention states, the narrow student, the online teacher,
the two-step / pkt phase plans and the presets, on the tiny 4-layer teacher (hidden 32, 2 heads)."""
import json
import math

import pytest
import torch

from students.build import setup
from students.families import transformer_layers, transformer_maps
from students.losses import LossWeights
from students.losses.layers import LAYER_PAIRS, STUDENT_STATES, TEACHER_STATES
from students.phases import phases
from students.trainer import fit, set_trainable, train_batches
from transferset.config import STUDENT_PRESETS, StudentConfig
from transferset.contract import schema
from transferset.runtime import typed
from transferset.runtime.errors import UserError


# --------------------------------------------------------------------------- layer maps


def test_layer_pairs_uniform_first_last_and_explicit():
    assert transformer_maps.layer_pairs("uniform", 2, 6) == [(1, 3), (2, 6)]  # TinyBERT's g(m) = 3m
    assert transformer_maps.layer_pairs("skip", 3, 6) == [(1, 2), (2, 4), (3, 6)]
    assert transformer_maps.layer_pairs("first", 2, 6) == [(1, 1), (2, 2)]
    assert transformer_maps.layer_pairs("last", 2, 6) == [(1, 5), (2, 6)]
    assert transformer_maps.layer_pairs("last-1", 3, 6) == [(3, 6)]           # MiniLM: the last layers only
    assert transformer_maps.layer_pairs("last-2", 3, 6) == [(2, 5), (3, 6)]
    assert transformer_maps.layer_pairs("1,3,6", 3, 6) == [(1, 1), (2, 3), (3, 6)]
    assert transformer_maps.layer_pairs([2, 6], 2, 6) == [(1, 2), (2, 6)]
    assert transformer_maps.layer_pairs("3:6, 1:2", 3, 6) == [(1, 2), (3, 6)]


@pytest.mark.parametrize("spec, message", [
    ("1,2", "2 teacher layers for a 3-layer student"),
    ("1:2,1:3", "a student layer appears twice"),
    ("1:7", r"out of range \(student layers 1..3, teacher layers 1..6\)"),
    ("last-4", "K must be between 1 and 3"),
    ("middle", "'middle' is not a layer number; choose one of uniform"),
    ("1:2,3", "not both"),
])
def test_layer_pairs_refuses_maps_that_do_not_fit(spec, message):
    with pytest.raises(ValueError, match=message):
        transformer_maps.layer_pairs(spec, 3, 6)


def test_layer_map_in_yaml_takes_a_list():
    assert typed.load(StudentConfig, {"layer_map": [2, 4]}, "test").layer_map == "2,4"
    assert typed.load(StudentConfig, {"layer_map": 6}, "test").layer_map == "6"


# --------------------------------------------------------------------------- captured attention states


def _tiny(tiny_teacher4, attn="eager"):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(tiny_teacher4, attn_implementation=attn).eval()
    enc = AutoTokenizer.from_pretrained(tiny_teacher4)(["a good film", "the plot is dull and bad , too"],
                                                       padding=True, return_tensors="pt")
    return model, enc


def test_captured_scores_are_q_kt_and_give_the_eager_attention_probabilities(tiny_teacher4):
    model, enc = _tiny(tiny_teacher4)
    mask = enc["attention_mask"].bool()
    with torch.no_grad():
        out = transformer_layers.forward(model, enc["input_ids"], mask, enc["token_type_ids"], states=[1, 3])
        ref = model(**enc, output_attentions=True, output_hidden_states=True)
    assert sorted(out["qkv"]) == [1, 3]
    from students.losses.layers import States

    st = States(out["hidden_states"], out["qkv"])
    for k in (1, 3):
        layer = model.bert.encoder.layer[k - 1].attention.self
        h = ref.hidden_states[k - 1]                                     # the layer's input
        q = layer.query(h).view(2, -1, 2, 16).transpose(1, 2)
        key = layer.key(h).view(2, -1, 2, 16).transpose(1, 2)
        manual = q @ key.transpose(-1, -2) / math.sqrt(16)
        torch.testing.assert_close(st.scores(k), manual)
        # softmax over the real keys is what eager attention returns as output_attentions (eval: no dropout)
        probs = torch.softmax(st.scores(k).masked_fill(~mask[:, None, None, :], -1e9), -1)
        torch.testing.assert_close(probs, ref.attentions[k - 1], atol=1e-6, rtol=1e-5)
        v = layer.value(h).view(2, -1, 2, 16).transpose(1, 2)
        torch.testing.assert_close(st.values(k), v)
    assert len(out["hidden_states"]) == 5
    # Ours are gone afterwards (transformers installs some of its own on a first forward).
    hooks = sum(len(m._forward_hooks) for m in model.modules())
    with torch.no_grad():
        transformer_layers.forward(model, enc["input_ids"], mask, enc["token_type_ids"], states=[1, 2, 3, 4])
    assert sum(len(m._forward_hooks) for m in model.modules()) == hooks


def test_capture_works_with_sdpa_attention_too(tiny_teacher4):
    eager, enc = _tiny(tiny_teacher4)
    sdpa, _ = _tiny(tiny_teacher4, "sdpa")
    with torch.no_grad():
        mask = enc["attention_mask"].bool()
        a = transformer_layers.forward(eager, enc["input_ids"], mask, enc["token_type_ids"], states=[2])
        b = transformer_layers.forward(sdpa, enc["input_ids"], mask, enc["token_type_ids"], states=[2])
    for x, y in zip(a["qkv"][2], b["qkv"][2]):
        torch.testing.assert_close(x, y)


# --------------------------------------------------------------------------- the narrow student


def _cfg(**values) -> StudentConfig:
    return typed.load(StudentConfig, {"student": "transformer", "threads": 1, "report": {"latency_examples": 8}, **values}, "test")


NARROW = {"n_layer": 2, "hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 24}


def test_a_narrow_student_is_built_from_the_teachers_config_with_random_init(tiny_scored_dir, tiny_teacher4):
    from transformers import AutoConfig

    s = setup(_cfg(model=NARROW, losses={"hidden_mse": 1.0, "emb_mse": 1.0, "repr": 1.0}), tiny_scored_dir)
    c = s.model.config
    assert (c.hidden_size, c.num_attention_heads, c.intermediate_size, c.num_hidden_layers) == (16, 2, 24, 2)
    assert s.model_config.init == "random" and c.vocab_size == AutoConfig.from_pretrained(tiny_teacher4).vocab_size
    assert (s.online.proj.in_features, s.online.proj.out_features) == (16, 32)  # W_h
    assert (s.projection.in_features, s.projection.out_features) == (16, 32)    # repr's, as before
    assert list(s.family.param_groups(s.model)) == ["embeddings", "encoder.1", "encoder.2", "head", "classifier"]
    with pytest.raises(UserError, match=r"differ from the teacher's, so the student cannot start from its weights"):
        setup(_cfg(model={**NARROW, "init": "skip"}), tiny_scored_dir)


def test_a_narrow_students_embeddings_are_the_teachers_projected_on_its_principal_axes(tiny_scored_dir, tiny_teacher4):
    from students.data.tokens import teacher_state

    state = teacher_state(tiny_teacher4)
    t_word, t_pos, t_type = (state[f"bert.embeddings.{t}.weight"] for t in
                             ("word_embeddings", "position_embeddings", "token_type_embeddings"))
    s = setup(_cfg(model=NARROW, losses={"hidden_mse": 1.0}), tiny_scored_dir)
    emb = s.model.bert.embeddings
    # One map B (32 → 16): orthonormal columns, the word table's top principal axes, largest variance first.
    basis = torch.linalg.lstsq(t_word, emb.word_embeddings.weight.detach()).solution
    assert torch.allclose(t_word @ basis, emb.word_embeddings.weight, atol=1e-5)
    assert torch.allclose(basis.T @ basis, torch.eye(16), atol=1e-4)
    variance = ((t_word - t_word.mean(0)) @ basis).var(0)
    assert torch.all(variance[:-1] >= variance[1:] - 1e-6)
    top = torch.linalg.eigvalsh(torch.cov(t_word.T)).flip(0)[:16]
    assert torch.allclose(variance, top, rtol=1e-3)
    # The same map for the position and token-type tables: their sum is the projection of the teacher's.
    assert torch.allclose(emb.position_embeddings.weight, t_pos @ basis, atol=1e-5)
    assert torch.allclose(emb.token_type_embeddings.weight, t_type @ basis, atol=1e-5)
    # embed_init: random keeps the old random tables.
    r = setup(_cfg(model=NARROW, losses={"hidden_mse": 1.0}, vocab={"embed_init": "random"}), tiny_scored_dir)
    assert not torch.allclose(r.model.bert.embeddings.word_embeddings.weight, emb.word_embeddings.weight, atol=1e-3)
    std = float(r.model.bert.embeddings.word_embeddings.weight[1:].detach().std())  # row 0: padding, zero
    assert std == pytest.approx(r.model.config.initializer_range, rel=0.2)


# --------------------------------------------------------------------------- the online teacher


def test_the_online_teacher_adds_its_states_and_w_h_learns(tiny_scored_dir, tiny_teacher4):
    from transformers import AutoModelForSequenceClassification

    s = setup(_cfg(model=NARROW, losses={"hidden_mse": 1.0, "att_mse": 1.0}, optim={"lr": 1e-3}), tiny_scored_dir)
    assert s.online.pairs == [(1, 2), (2, 4)]
    assert not list(s.online.teacher.parameters())[0].requires_grad
    (phase,) = phases("joint", LossWeights.of(s.cfg), 1, s.family.param_groups(s.model).keys())
    params = set_trainable(s, phase)
    assert any(p is s.online.proj.weight for p in params)
    batch = next(iter(train_batches(s, tiny_scored_dir, 0)))
    from students.losses import online

    out = online.forward(s, batch, phase.weights)
    teacher = AutoModelForSequenceClassification.from_pretrained(tiny_teacher4).eval()
    with torch.no_grad():
        ref = teacher(input_ids=batch["ids"], attention_mask=batch["mask"].long(), token_type_ids=batch["type_ids"],
                      output_hidden_states=True)
    torch.testing.assert_close(batch[TEACHER_STATES].hidden[4], ref.hidden_states[4])
    assert sorted(batch[TEACHER_STATES].qkv) == [2, 4] and sorted(out[STUDENT_STATES].qkv) == [1, 2]
    assert out[STUDENT_STATES].hidden[1].shape[-1] == 32 and out[LAYER_PAIRS] == [(1, 2), (2, 4)]
    before = s.online.proj.weight.detach().clone()
    teacher_before = [p.detach().clone() for p in s.online.teacher.parameters()]
    losses = [parts for _, parts in fit(s, phase, [batch])]
    assert set(losses[0]) == {"hidden_mse", "att_mse"}
    assert not torch.equal(before, s.online.proj.weight)
    assert all(torch.equal(a, b) for a, b in zip(teacher_before, s.online.teacher.parameters()))
    # A phase without a layer loss never runs the teacher.
    plain = {k: v for k, v in next(iter(train_batches(s, tiny_scored_dir, 0))).items()}
    online.forward(s, plain, LossWeights(kd=1.0))
    assert TEACHER_STATES not in plain


@pytest.mark.parametrize("values, message", [
    ({"student": "bilstm", "losses": {"att_kl": 1.0}, "model": {"embed_dim": 8, "hidden": 8}},
     "a bilstm student has neither: use `student: transformer`"),
    ({"losses": {"att_kl": 1.0}, "model": {**NARROW, "num_attention_heads": 4}}, "the student has 4 heads, the teacher 2"),
    ({"losses": {"hidden_mse": 1.0}, "phases": "pkt", "layer_map": "last-1"}, r"maps no teacher layer to student layers \[1\]"),
    ({"losses": {"hidden_mse": 1.0}, "layer_map": "1,2,3"}, "3 teacher layers for a 2-layer student"),
    ({"losses": {"hidden_mse": 1.0, "emb_mse": 1.0}, "phases": "pkt", "vocab": {"freeze_embeddings": True}},
     "freeze_embeddings keeps them fixed"),
])
def test_combinations_that_cannot_work_are_refused(tiny_scored_dir, values, message):
    values = {"model": {"n_layer": 2}, **values}
    with pytest.raises(UserError, match=message):
        setup(_cfg(**values), tiny_scored_dir)


def test_a_student_with_another_tokenizer_is_refused_for_token_level_losses(tiny_scored_dir, tmp_path, tiny_teacher4):
    import builders as testing
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    vocab = testing.write_vocab(str(tmp_path / "vocab.txt"), ["cinema"] + testing.WORDS[::-1])
    tokenizer = BertTokenizer(vocab=vocab)
    tokenizer.save_pretrained(tmp_path)
    BertForSequenceClassification(BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1,
                                             num_attention_heads=2, intermediate_size=16)).save_pretrained(tmp_path)
    with pytest.raises(UserError, match="the student's tokenizer differs from the teacher's"):
        setup(_cfg(model={"pretrained": str(tmp_path)}, losses={"cos": 1.0}), tiny_scored_dir)
    # A pretrained checkpoint that tokenizes as the teacher does is fine (here: the teacher itself).
    assert setup(_cfg(model={"pretrained": tiny_teacher4}, losses={"cos": 1.0}), tiny_scored_dir).online.proj is None


# --------------------------------------------------------------------------- schedules

FINE = ("embeddings", "encoder.1", "encoder.2", "encoder.3", "head", "classifier")


def test_two_step_trains_the_intermediate_layers_then_the_prediction_layer():
    w = LossWeights(emb_mse=1.0, hidden_mse=2.0, att_mse=1.0, kd=1.0, ce=0.5, temperature=2.0)
    first, second = phases("two-step", w, 3, FINE)
    assert first.trainable == ("embeddings", "encoder.1", "encoder.2", "encoder.3") and not first.early_stop
    assert first.weights.active() == {"emb_mse": 1.0, "hidden_mse": 2.0, "att_mse": 1.0}
    assert second.trainable == FINE and second.early_stop
    assert second.weights == LossWeights(kd=1.0, ce=0.5, temperature=2.0)
    with pytest.raises(ValueError, match="two-step phase plan: its first step"):
        phases("two-step", LossWeights(kd=1.0), 1, FINE)


def test_layer_epochs_lengthen_the_layer_phases_only():
    w = LossWeights(emb_mse=1.0, hidden_mse=1.0, kd=1.0)
    assert [p.epochs for p in phases("two-step", w, 3, FINE, layer_epochs=10)] == [10, 3]
    assert [p.epochs for p in phases("two-step", w, 3, FINE)] == [3, 3]
    assert [p.epochs for p in phases("pkt", w, 2, FINE, layer_epochs=5)] == [5, 5, 5, 5, 2]
    assert [p.epochs for p in phases("joint", w, 2, FINE, layer_epochs=5)] == [2]
    with pytest.raises(ValueError, match="layer_epochs must be at least 1, got 0"):
        phases("two-step", w, 3, FINE, layer_epochs=0)


def test_pkt_trains_one_layer_at_a_time_bottom_up_then_predicts():
    w = LossWeights(hidden_mse=1.0, att_kl=1.0, emb_mse=0.5, cos=1.0, kd=2.0)
    plan = phases("pkt", w, 2, FINE)
    assert [(p.name, p.trainable, p.weights.layers) for p in plan] == [
        ("1 pkt embeddings", ("embeddings",), None),
        ("1 pkt layer 1", ("encoder.1",), (1,)),
        ("1 pkt layer 2", ("encoder.2",), (2,)),
        ("1 pkt layer 3", ("encoder.3",), (3,)),
        ("2 prediction", FINE, None)]
    assert plan[1].weights.active() == {"hidden_mse": 1.0, "att_kl": 1.0}
    assert plan[3].weights.active() == {"hidden_mse": 1.0, "att_kl": 1.0, "cos": 1.0}  # cos: the last layer's
    assert plan[-1].weights.active() == {"kd": 2.0} and plan[-1].early_stop
    with pytest.raises(ValueError, match="no per-layer parameter groups"):
        phases("pkt", w, 1)  # a BiLSTM's groups
    with pytest.raises(ValueError, match="set hidden_mse, att_mse, att_kl or value_kl"):
        phases("pkt", LossWeights(kd=1.0, cos=1.0), 1, FINE)


def test_other_schedules_fold_the_layer_groups_into_encoder():
    plan = phases("progressive", LossWeights(ce=1.0, mse=1.0, repr=1.0), 1, FINE)
    assert plan[0].trainable == FINE[:-1]
    assert plan[2].name == "2b logits: encoder+head+classifier" and plan[2].trainable == FINE[1:]
    (joint,) = phases("joint", LossWeights(hidden_mse=1.0), 1, FINE)
    assert joint.trainable == FINE


def test_pkt_freezes_every_layer_but_its_own(tiny_scored_dir):
    s = setup(_cfg(model={"n_layer": 2}, preset="mobilebert", optim={"lr": 1e-2, "weight_decay": 0.1}), tiny_scored_dir)
    groups = s.family.param_groups(s.model)
    plan = phases(s.cfg.phases, LossWeights.of(s.cfg), 1, groups.keys())
    assert [p.name for p in plan] == ["1 pkt layer 1", "1 pkt layer 2", "2 prediction"]
    batch = next(iter(train_batches(s, tiny_scored_dir, 0)))
    for phase in plan[:2]:
        before = {n: p.detach().clone() for n, p in s.model.named_parameters()}
        ((_, parts),) = fit(s, phase, [dict(batch)])
        assert set(parts) == {"hidden_mse", "att_kl"}
        moved = {g for g, ps in groups.items() for p in ps
                 if not torch.equal(before[next(n for n, q in s.model.named_parameters() if q is p)], p.detach())}
        assert moved == set(phase.trainable), phase.name


# --------------------------------------------------------------------------- presets


def test_presets_set_their_recipe_under_the_given_settings():
    cfg = typed.load(StudentConfig, {"preset": "tinybert", "losses": {"kd": 2.0}}, "test")
    assert (cfg.student, cfg.phases) == ("transformer", "two-step")
    assert LossWeights.of(cfg).active() == {"kd": 2.0, "hidden_mse": 1.0, "att_mse": 1.0, "emb_mse": 1.0}
    assert typed.load(StudentConfig, {"preset": "minilm"}, "test").layer_map == "last-1"
    assert typed.load(StudentConfig, {"model": {"shape": "tang"}}, "test").student == "bilstm"  # a BiLSTM's shape
    assert set(STUDENT_PRESETS) == {"tinybert", "mobilebert", "minilm", "distilbert", "pkd"}


@pytest.mark.parametrize("preset, shape", [(p, {"n_layer": 2}) for p in sorted(STUDENT_PRESETS)]
                         + [("tinybert", NARROW)], ids=[*sorted(STUDENT_PRESETS), "tinybert-narrow"])
def test_each_preset_runs_end_to_end_on_the_tiny_teacher(preset, shape, tmp_path, tiny_scored_dir, sst2_dev200):
    import yaml

    from transferset.app.cli import main

    cfg = tmp_path / "cfg.yaml"
    layered = STUDENT_PRESETS[preset]["phases"] in ("two-step", "pkt")
    cfg.write_text(yaml.safe_dump({"preset": preset, "threads": 1, "report": {"latency_examples": 8}, "epochs": 1,
                                   "batch_size": 32, "optim": {"lr": 1e-3}, "model": shape,
                                   **({"layer_epochs": 2} if layered else {})}))
    out = tmp_path / "run"
    assert main(["train", "--transfer", tiny_scored_dir, "--dev", sst2_dev200, "--output", str(out),
                 "--config", str(cfg), "--no-progress"]) == 0
    m = json.loads((out / schema.METRICS_FILE).read_text())
    expected = set(STUDENT_PRESETS[preset]["losses"])
    seen = {k for h in m["history"] for k in h["losses"]}
    assert seen == expected
    assert all(math.isfinite(v) for h in m["history"] for v in h["losses"].values())
    assert m["config"]["preset"] == preset and m["model_config"]["n_layer"] == 2
    # layer_epochs lengthens the layer-loss phases (not early-stopped), the prediction phase keeps `epochs`
    assert [p["epochs_run"] for p in m["phases"]] == ([2] * (len(m["phases"]) - 1) + [1] if layered else [1])
    # The saved student is a plain 2-layer model of its own width: no W_h, no teacher.
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(out / schema.STUDENT_MODEL_DIR)
    assert model.config.num_hidden_layers == 2 and m["parameters"] == sum(p.numel() for p in model.parameters())
    assert model.config.hidden_size == shape.get("hidden_size", 32)


# --------------------------------------------------------------------------- integration: the packaged MiniLM


@pytest.mark.integration
@pytest.mark.parametrize("losses", [{"losses": {"emb_mse": 1.0, "hidden_mse": 1.0, "att_mse": 1.0}},
                                    {"losses": {"att_kl": 1.0, "value_kl": 1.0}, "layer_map": "last-1"}],
                         ids=["tinybert", "minilm"])
def test_a_narrow_student_of_minilm_learns_the_layer_losses(small_scored_dir, losses):
    """MiniLM (6 × 384, 12 heads) teaching a random 3 × 192 student: the layer losses fall on a repeated batch."""
    s = setup(_cfg(model={"n_layer": 3, "hidden_size": 192, "num_attention_heads": 12, "intermediate_size": 384},
                   optim={"lr": 1e-3}, **losses), small_scored_dir)
    assert s.online.pairs == ([(1, 2), (2, 4), (3, 6)] if "hidden_mse" in losses["losses"] else [(3, 6)])
    (phase,) = phases("joint", LossWeights.of(s.cfg), 1, s.family.param_groups(s.model).keys())
    batch = next(iter(train_batches(s, small_scored_dir, 0)))
    steps = fit(s, phase, [dict(batch) for _ in range(5)])
    first, last = steps[0][1], steps[-1][1]
    assert set(last) == set(losses["losses"])
    assert all(last[k] < first[k] for k in last), (first, last)


def test_layer_texts_feed_the_layer_phases_and_the_prediction_phase_keeps_the_scored_set(tmp_path, tiny_scored_dir,
                                                                                       sst2_dir, sst2_dev200):
    """layer_texts: an unscored transfer set (no teacher column) of other rows; two-step's intermediate step
    trains on its rows with the teacher online, the prediction step on the scored set's."""
    import yaml

    from transferset import testing
    from transferset.app.cli import main

    lines = (sst2_dir / "train.tsv").read_text(encoding="utf-8").splitlines()[1000:1097]  # not the scored rows
    texts = [line.split("\t")[0] for line in lines]
    extra = testing.write_transfer_set(str(tmp_path / "texts"), [testing.transfer_rows(texts[:50]),
                                                                  testing.transfer_rows(texts[50:])], ["0", "1"])
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"preset": "tinybert", "threads": 1, "report": {"latency_examples": 8}, "epochs": 1,
                                   "layer_epochs": 2, "batch_size": 16, "optim": {"lr": 1e-3}, "model": {"n_layer": 2},
                                   "layer_texts": extra}))
    out = tmp_path / "run"
    assert main(["train", "--transfer", tiny_scored_dir, "--dev", sst2_dev200, "--output", str(out),
                 "--config", str(cfg), "--no-progress"]) == 0
    m = json.loads((out / schema.METRICS_FILE).read_text())
    inter = [h for h in m["history"] if h["phase"].startswith("1 ")]
    pred = [h for h in m["history"] if h["phase"].startswith("2 ")]
    assert [h["rows"] for h in inter] == [97, 97] and all(h["rows_from"] == extra for h in inter)
    assert [h["rows"] for h in pred] == [128] and "rows_from" not in pred[0]
    assert set(inter[0]["losses"]) == {"emb_mse", "hidden_mse", "att_mse"} and set(pred[0]["losses"]) == {"kd"}
    assert all(math.isfinite(v) for h in m["history"] for v in h["losses"].values())


@pytest.mark.parametrize("values, texts, message", [
    ({"student": "transformer", "losses": {"kd": 1.0}, "model": {"n_layer": 2}}, "missing",
     "only the phases that train on layer losses alone read it"),
    ({"preset": "tinybert", "model": {"n_layer": 2}}, "missing", "no such file or directory"),
    ({"preset": "tinybert", "model": {"n_layer": 2}}, "rest", "layer_texts rest: a run config's setting"),
])
def test_layer_texts_where_nothing_reads_them_or_that_are_not_there_are_refused(tmp_path, tiny_scored_dir, sst2_dev200,
                                                                               values, texts, message, capsys):
    import yaml

    from transferset.app.cli import main

    cfg = tmp_path / "cfg.yaml"
    texts = texts if texts == "rest" else str(tmp_path / texts)
    cfg.write_text(yaml.safe_dump({**values, "epochs": 1, "threads": 1, "layer_texts": texts}))
    assert main(["train", "--transfer", tiny_scored_dir, "--dev", sst2_dev200, "--output", str(tmp_path / "out"),
                 "--config", str(cfg), "--no-progress"]) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out" / schema.STUDENT_MODEL_DIR).exists()


def test_an_online_teacher_other_than_the_one_that_scored_the_set_is_refused(tiny_scored_dir, tiny_teacher4, tmp_path,
                                                                            capsys):
    """The set records its teacher's weights hash; a teacher with noise added to its weights trained silently."""
    import shutil

    from safetensors.torch import load_file, save_file

    from transferset.app.cli import main
    from transferset.models.loading import weights_sha256

    other = tmp_path / "teacher"
    shutil.copytree(tiny_teacher4, other)
    weights = other / "model.safetensors"
    state = load_file(weights)
    torch.manual_seed(0)
    save_file({k: v + 1e-3 * torch.randn_like(v) if v.is_floating_point() else v for k, v in state.items()}, weights,
              metadata={"format": "pt"})
    ours, theirs = weights_sha256(str(other)), weights_sha256(tiny_teacher4)
    with pytest.raises(UserError) as err:
        setup(_cfg(model={"n_layer": 2}, losses={"hidden_mse": 1.0}, teacher=str(other)), tiny_scored_dir)
    assert ours in str(err.value) and theirs in str(err.value) and "score the set again" in str(err.value)
    # Through the command line: one line, exit 2, no output folder.
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"student: transformer\nmodel: {{n_layer: 2}}\nlosses: {{hidden_mse: 1.0}}\nteacher: {other}\nthreads: 1\n")
    out = tmp_path / "out"
    assert main(["train", "--transfer", tiny_scored_dir, "--dev", tiny_scored_dir, "--output", str(out),
                 "--config", str(cfg), "--epochs", "1", "--no-progress"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and ours in lines[0] and theirs in lines[0] and not out.exists()
    # The set's own teacher, named explicitly, passes the check.
    assert setup(_cfg(model={"n_layer": 2}, losses={"hidden_mse": 1.0}, teacher=tiny_teacher4), tiny_scored_dir).online is not None
