"""The rates behind the plan's minutes (transferset/app/estimate.py), measured here on the run's own first train
rows in a few seconds per kind, and only for the kinds of stage that will run: a few optimizer steps of the
teacher at its batch size and max_length, a few scoring batches of it, the augment ops' contexts and variants
in this process, a few steps of each BiLSTM or static student. A transformer student is not calibrated (its
stage says so)."""
from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

from transferset.app.estimate import Rates, Rows
from transferset.augment.compose import split_words, variant_rows
from transferset.augment.context import RowContext, contexts_for
from transferset.config import DEFAULT_MAX_LENGTH, RunConfig
from transferset.models import loading

STEPS = 3  # timed optimizer steps per model, after one untimed step
SCORE_ROWS = 256  # rows timed through the teacher's scoring forward pass


def _timed(step: Callable[[int], None], n: int = STEPS) -> float:
    """Seconds per call of step(i), the first call (warm-up) untimed."""
    step(0)
    t0 = time.perf_counter()
    for i in range(1, n + 1):
        step(i)
    return (time.perf_counter() - t0) / n


def _batches(texts: Sequence[str], size: int) -> list[list[str]]:
    """Batches of texts of similar lengths, as the trainers group them, from the short end to the long."""
    ordered = sorted(texts, key=len)
    picks = [ordered[i:i + size] for i in range(0, max(1, len(ordered) - size + 1), max(1, len(ordered) // 4))]
    return [b for b in picks if b][:STEPS + 1] or [list(texts)]


def teacher_step(model, tokenizer, texts: Sequence[str], batch_size: int, max_length: int) -> float:
    """Seconds per optimizer step of the teacher's fine-tuning (AdamW, fused, as teacher/train.py)."""
    import torch

    batches = _batches(texts, batch_size)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, fused=True)
    model.train()

    def step(i: int) -> None:
        enc = tokenizer(batches[i % len(batches)], truncation=True, max_length=max_length, padding=True,
                        return_tensors="pt")
        out = model(**enc, labels=torch.zeros(enc["input_ids"].shape[0], dtype=torch.long))
        out.loss.backward()
        opt.step()
        opt.zero_grad()

    seconds = _timed(step)
    model.eval()
    return seconds


def score_rate(model, tokenizer, cfg: RunConfig, texts: Sequence[str]) -> float:
    """Rows per second through transferset.teacher.scoring.Teacher, the score stage's forward pass."""
    from transferset.teacher.scoring import Teacher

    s = cfg.score
    teacher = Teacher(model, tokenizer, pooling=s.hidden, layers=s.layers, forward=s.forward,
                      max_length=s.max_length or cfg.teacher.max_length, forward_rows=s.forward_rows,
                      forward_tokens=s.forward_tokens)
    rows = (list(texts) * (SCORE_ROWS // max(1, len(texts)) + 1))[:SCORE_ROWS]
    teacher.predict(rows[:16])
    t0 = time.perf_counter()
    teacher.predict(rows)
    return len(rows) / (time.perf_counter() - t0)


def augment_rate(cfg: RunConfig, texts: Sequence[str]) -> Optional[float]:
    """Transfer rows (originals and variants) made per second by the augment ops and their contexts, in this
    process; the contexts' models load before the clock starts."""
    a = cfg.augment
    words = [split_words(t) for t in texts]
    contexts = contexts_for(a.ops) if a.makes_variants else []
    models = {c.name: c.load(a) for c in contexts if isinstance(c, RowContext)}
    t0 = time.perf_counter()
    row_ctx: list[dict] = [{} for _ in words]
    corpus = {}
    for c in contexts:
        if isinstance(c, RowContext):
            for d, v in zip(row_ctx, c.compute(models[c.name], words, a)):
                d[c.name] = v
        else:
            acc = c.create()
            for w, d in zip(words, row_ctx):
                acc = c.add(acc, w, d)
            corpus[c.name] = c.build(acc)
    made = 0
    for i, text in enumerate(texts):
        made += 1 + sum(1 for _ in variant_rows(str(i), text, None, cfg=a, context={**row_ctx[i], **corpus}))
    return made / max(time.perf_counter() - t0, 1e-6)


def student_step(s_cfg, tokenizer, texts: Sequence[str], hidden_width: int, max_length: int) -> Optional[float]:
    """Seconds per optimizer step of a BiLSTM or static student at its batch size, built as its family builds it
    on the teacher's vocabulary (its embeddings fixed or learning as training holds them); None for other families."""
    import torch

    from students.families import bilstm, model_values, static

    fixed = {"vocab_size": len(tokenizer), "num_classes": 2, "pad_id": tokenizer.pad_token_id or 0}
    if s_cfg.student == "bilstm":
        defaults = {"head_dim": hidden_width, **(bilstm.PRESETS.get(s_cfg.preset or "", {}))}
        model = bilstm.BiLSTM(bilstm.BiLSTMConfig(**model_values(defaults, s_cfg, bilstm.config_fields(), "BiLSTM",
                                                                 fixed)))
    elif s_cfg.student == "static":
        model = static.Static(static.StaticConfig(**model_values({}, s_cfg, static.config_fields(), "static", fixed)))
    else:
        return None
    if s_cfg.frozen_embeddings():
        model.embed.weight.requires_grad_(False)
    batches = _batches(texts, s_cfg.batch_size)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)

    def step(i: int) -> None:
        enc = tokenizer(batches[i % len(batches)], truncation=True, max_length=max_length, padding=True,
                        return_tensors="pt")
        out = model(enc["input_ids"], enc["attention_mask"])
        out["logits"].pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    return _timed(step)


def _teacher_model(cfg: RunConfig):
    """The model the teacher stages train (or the given teacher), with its tokenizer."""
    path = cfg.teacher_path or (cfg.teacher_paths[0] if cfg.teacher_paths else loading.resolve_model(cfg.teacher.model))
    tokenizer = loading.load_tokenizer(path, trust_remote_code=cfg.teacher.trust_remote_code)
    with loading.quiet_transformers():
        model = loading.load_classifier(path, allow_pickle=cfg.teacher.allow_pickle,
                                        trust_remote_code=cfg.teacher.trust_remote_code,
                                        **({} if cfg.teacher_path or cfg.teacher_paths
                                           else {"label_names": cfg.teacher.labels or ("0", "1")}))
    return model, tokenizer


def measure_rates(cfg: RunConfig, rows: Rows, will_run: set[str]) -> Rates:
    """The rates of the kinds of stage in `will_run` (stage names), each from a few seconds of work."""
    texts, said, t0 = list(rows.sample), [], time.perf_counter()
    teacher_runs = any(n == "teacher" or n.startswith("teacher.") for n in will_run)
    students = [n.split(".", 1)[1] for n in will_run if n.startswith("students.")]
    needs_model = teacher_runs or bool({"score", "dev.score"} & will_run) or students
    if not texts or not needs_model and "augment" not in will_run:
        return Rates(measured="nothing to measure")
    step = score = augment = None
    per_student: dict[str, float] = {}
    if needs_model:
        model, tokenizer = _teacher_model(cfg)
        if teacher_runs:
            tc = cfg.teacher
            step = teacher_step(model, tokenizer, texts, tc.batch_size, tc.max_length)
            said.append(f"teacher {step:.2f} s/step of {tc.batch_size} rows at max_length {tc.max_length}")
        score = score_rate(model, tokenizer, cfg, texts)
        said.append(f"scoring {score:,.0f} rows/s")
        width = int(model.config.hidden_size)
        for name in sorted(students):
            s_cfg = cfg.students[name]
            got = student_step(s_cfg, tokenizer, texts, width, s_cfg.max_length or cfg.score.max_length
                               or cfg.teacher.max_length or DEFAULT_MAX_LENGTH)
            if got is not None:
                per_student[name] = got
                said.append(f"{name} {got * 1000:.0f} ms/step of {s_cfg.batch_size}")
    if "augment" in will_run or "layer_texts" in will_run:
        augment = augment_rate(cfg, texts)
        said.append(f"augment {augment:,.0f} rows/s in process")
    said.append(f"measured in {time.perf_counter() - t0:.0f} s on {len(texts)} train rows")
    return Rates(step, score, augment, per_student, "; ".join(said))
