"""The rates behind the plan's minutes (transferset/app/planning/estimate.py), measured here on the run's own first train
rows in a few seconds per kind, and only for the kinds of stage that will run: a few optimizer steps of the
teacher at its batch size and max_length, a few scoring batches of it, the augment ops' contexts and variants
in this process, a few steps of each BiLSTM or static student (a search's candidates too), and a transformer
student's from the teacher's own step."""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional, Sequence

from transferset.app.planning.estimate import quiet
from transferset.app.stages.costs import Rates, Rows
from transferset.app.stages.context import teacher_source
from transferset.app.stages.base import KINDS
from transferset.augment.compose import split_words, variant_rows
from transferset.augment.context import RowContext, contexts_for
from transferset.config import DEFAULT_MAX_LENGTH, RunConfig
from transferset.models import loading
from transferset.runtime.threads import torch_threads
from transferset.runtime.timing import ROUNDS
from transferset.training.engine import resolved_precision

STEPS = 3  # timed optimizer steps per model (a short, a middle and a long batch), after one untimed step
SCORE_ROWS = 256  # rows timed through the teacher's scoring forward pass
TIMED_BATCH = 64  # rows of the teacher timed on one thread, as the report times it (most of its rows at batch 64)
LATENCY_ROWS = 16  # rows a student predicts one at a time, for the latency its metrics time


def _chunks(tokenizer, texts: Sequence[str], batch_size: int, max_length: int) -> list[list[str]]:
    """The texts sorted by tokens, cut into batches: the trainers put rows of similar lengths in one batch (the
    teacher's length_grouped, the students' buffer), so a step costs its batch's longest row."""
    lengths = [len(ids) for ids in tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]]
    ordered = [t for _, t in sorted(zip(lengths, texts), key=lambda p: p[0])]
    ordered = (ordered * (batch_size // max(1, len(ordered)) + 1))[:max(batch_size, len(ordered))]
    return [ordered[i:i + batch_size] for i in range(0, len(ordered) - batch_size + 1, batch_size)]


def per_step(run: Callable[[list[str]], None], chunks: list[list[str]], tokens: Callable[[list[str]], int]) -> float:
    """Seconds of an average step over `chunks` (every batch of the sample): a middle batch untimed, then a short,
    a middle and a long one timed, and seconds = a + b × padded tokens fitted to them (their mean ratio when the
    fit says a cost falls with length: noise on a busy machine)."""
    picks = [chunks[len(chunks) // 2], chunks[0], chunks[len(chunks) // 2], chunks[-1]]
    run(picks[0])
    xs, ys = [], []
    for batch in picks[1:]:
        t0 = time.perf_counter()
        run(batch)
        ys.append(time.perf_counter() - t0)
        xs.append(tokens(batch))
    mean_tokens = sum(tokens(c) for c in chunks) / len(chunks)
    n, sx, sy = len(xs), sum(xs), sum(ys)
    spread = sum((x - sx / n) ** 2 for x in xs)
    b = sum((x - sx / n) * (y - sy / n) for x, y in zip(xs, ys)) / spread if spread else -1.0
    a = sy / n - b * sx / n
    return a + b * mean_tokens if a >= 0 and b >= 0 else sy / sx * mean_tokens


def _padded(tokenizer, max_length: int) -> Callable[[list[str]], int]:
    def tokens(batch: list[str]) -> int:
        return len(batch) * max(len(ids) for ids in tokenizer(batch, truncation=True, max_length=max_length)["input_ids"])
    return tokens


def teacher_step(model, tokenizer, texts: Sequence[str], batch_size: int, max_length: int,
                 precision: str = "fp32") -> tuple[float, float]:
    """Seconds per optimizer step of the teacher's fine-tuning (AdamW, fused, as teacher/train.py; under bf16
    autocast at `precision` bf16, as the engine runs it), and of writing its checkpoint (weights and optimizer state:
    once per epoch)."""
    import tempfile

    import torch

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, fused=True)
    model.train()

    def step(batch: list[str]) -> None:
        enc = tokenizer(batch, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = model(**enc, labels=torch.zeros(enc["input_ids"].shape[0], dtype=torch.long))
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()

    seconds = per_step(step, _chunks(tokenizer, texts, batch_size, max_length), _padded(tokenizer, max_length))
    model.eval()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, f"{tmp}/state.pt")
        return seconds, time.perf_counter() - t0


def score_rate(model, tokenizer, cfg: RunConfig, texts: Sequence[str],
               precision: Optional[str] = None) -> tuple[float, float, Any]:
    """Rows per second through transferset.teacher.scoring.Teacher, the score stage's forward pass on the threads
    the stage gives each worker (oversubscribed threads are several times slower on a busy machine), the seconds
    the Teacher takes to make (its padding-free path built and checked), as each score stage does, and the Teacher.
    At `precision` (None: the score stage's, `auto` resolved here); bf16 on a copy of `model` (the Teacher casts the
    weights it gets; the students' timing uses fp32's)."""
    import copy

    from pipelines.runtime import pipeline_options
    from pipelines.score import default_threads
    from transferset.teacher.scoring import Teacher, resolved_precision

    s = cfg.score
    threads = s.torch_threads or default_threads(pipeline_options(cfg.beam))
    precision = resolved_precision(precision or s.precision, "cpu")
    t0 = time.perf_counter()
    teacher = Teacher(model if precision == "fp32" else copy.deepcopy(model), tokenizer, pooling=s.hidden,
                      layers=s.layers, forward=s.forward, max_length=s.max_length or cfg.teacher.max_length,
                      forward_rows=s.forward_rows, forward_tokens=s.forward_tokens, precision=precision)
    made = time.perf_counter() - t0
    rows = _repeated(texts, SCORE_ROWS)
    with torch_threads(threads):
        teacher.predict(rows[:16])
        t0 = time.perf_counter()
        teacher.predict(rows)
        return len(rows) / (time.perf_counter() - t0), made, teacher


def row_seconds(teacher, texts: Sequence[str]) -> float:
    """Seconds a row of the fp32 `teacher` takes on one thread in a batch of TIMED_BATCH, as the report times every
    model (transferset/app/report/latency.py)."""
    rows = _repeated(texts, TIMED_BATCH)
    with torch_threads(1):
        teacher.predict(rows[:8])
        t0 = time.perf_counter()
        teacher.predict(rows)
        return (time.perf_counter() - t0) / len(rows)


def _repeated(texts: Sequence[str], n: int) -> list[str]:
    """n rows of the sample, repeated as often as it takes."""
    return (list(texts) * (n // max(1, len(texts)) + 1))[:n]


def augment_rate(cfg: RunConfig, texts: Sequence[str]) -> tuple[float, float]:
    """Transfer rows (originals and variants) made per second by the augment ops and their contexts, in this
    process, and the seconds their contexts' models (a POS tagger, an MLM) take to load, apart."""
    a = cfg.augment
    words = [split_words(t) for t in texts]
    contexts = contexts_for(a.ops) if a.makes_variants else []
    t0 = time.perf_counter()
    models = {c.name: c.load(a) for c in contexts if isinstance(c, RowContext)}
    load_s = time.perf_counter() - t0
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
    return made / max(time.perf_counter() - t0, 1e-6), load_s


def training_step(s_cfg, tokenizer, hidden_width: int, max_length: int) -> Optional[tuple[Any, Callable]]:
    """(the model, texts → one optimizer step of it) for a student whose family has a `shaped` model (the BiLSTM,
    the static student): built as its family builds it on the teacher's vocabulary, its embeddings fixed or
    learning as training holds them, stepped with the optimizer training makes and clipped as training clips
    (a sparse table's gradient too). None for other families."""
    from students import families
    from students.trainer import optimizer_for
    from transferset.training.optimizers import clip_grad_norm

    family = families.get(s_cfg.student)
    if family.shaped is None:
        return None
    fixed = {"vocab_size": len(tokenizer), "num_classes": 2, "pad_id": tokenizer.pad_token_id or 0}
    model = family.shaped(s_cfg, fixed, hidden_width)
    if families.frozen_embeddings(s_cfg):
        model.embed.weight.requires_grad_(False)
    learn = [p for p in model.parameters() if p.requires_grad]
    opt = optimizer_for(model, family, s_cfg, learn)

    def step(batch: Sequence[str]) -> None:
        enc = tokenizer(list(batch), truncation=True, max_length=max_length, padding=True, return_tensors="pt")
        out = model(enc["input_ids"], enc["attention_mask"])
        out["logits"].pow(2).mean().backward()
        clip_grad_norm(learn, 1.0)
        opt.step()
        opt.zero_grad()

    return model, step


def student_step(s_cfg, tokenizer, texts: Sequence[str], hidden_width: int, max_length: int
                 ) -> Optional[tuple[float, float]]:
    """Seconds per optimizer step of a student `training_step` can step, at its batch size, and its stage's own
    seconds besides the epochs: building it, and the latency its metrics time (latency_examples rows at batch 1,
    timing.ROUNDS rounds). None for other families."""
    import torch

    t0 = time.perf_counter()
    made = training_step(s_cfg, tokenizer, hidden_width, max_length)
    if made is None:
        return None
    model, step = made
    built_s = time.perf_counter() - t0
    seconds = per_step(step, _chunks(tokenizer, texts, s_cfg.batch_size, max_length), _padded(tokenizer, max_length))
    with torch.inference_mode():
        t0 = time.perf_counter()
        for text in texts[:LATENCY_ROWS]:
            enc = tokenizer([text], truncation=True, max_length=max_length, return_tensors="pt")
            model(enc["input_ids"], enc["attention_mask"])
        one = (time.perf_counter() - t0) / min(LATENCY_ROWS, len(texts))
    return seconds, built_s + one * s_cfg.report.latency_examples * ROUNDS


def tokenize_rate(tokenizer, texts: Sequence[str], max_length: int) -> float:
    """Rows per second the teacher's tokenizer reads (a student whose vocabulary comes from the transfer set
    reads every row once before training)."""
    t0 = time.perf_counter()
    tokenizer(list(texts), truncation=True, max_length=max_length)
    return len(texts) / max(time.perf_counter() - t0, 1e-6)


def _teacher_model(cfg: RunConfig):
    """The model the teacher stages train (or the given teacher), with its tokenizer, and the seconds it took to
    load."""
    t0 = time.perf_counter()
    path = teacher_source(cfg)
    tokenizer = loading.load_tokenizer(path, trust_remote_code=cfg.teacher.trust_remote_code)
    with loading.quiet_transformers():
        model = loading.load_classifier(path, allow_pickle=cfg.teacher.allow_pickle,
                                        trust_remote_code=cfg.teacher.trust_remote_code,
                                        **({} if cfg.teacher_path or cfg.teacher_paths
                                           else {"label_names": cfg.teacher.labels or ("0", "1")}))
    return model, tokenizer, time.perf_counter() - t0


def transformer_step(model, tokenizer, texts: Sequence[str], s_cfg, max_length: int,
                     teacher_steps: dict[int, float]) -> tuple[float, float]:
    """Seconds per optimizer step of a transformer student, from the teacher's own step at the student's batch size
    (`teacher_steps`, by batch size, measured once each): × the student's layers over the teacher's, the layers
    being most of a step, plus a teacher forward pass (a third of its step) when layer losses run the teacher
    alongside. A narrower student than its teacher is counted at the teacher's width: at most. No fixed seconds."""
    from students.families.transformer import TransformerConfig
    from students.losses import LossWeights

    if s_cfg.batch_size not in teacher_steps:
        teacher_steps[s_cfg.batch_size] = teacher_step(model, tokenizer, texts, s_cfg.batch_size, max_length)[0]
    full = teacher_steps[s_cfg.batch_size]
    layers = int(s_cfg.model.get("n_layer", TransformerConfig.n_layer)) / int(model.config.num_hidden_layers)
    return full * min(1.0, layers) + (full / 3 if LossWeights.of(s_cfg).layer_active() else 0.0), 0.0


def _model_rates(cfg: RunConfig, texts: list[str], teacher_runs: bool, students: dict) -> tuple[dict, list]:
    """Rates' fields measured on the teacher's model (loaded once): its steps, its scoring, the steps of the
    students (`students`: {rates key: its settings}, a run's students and a search's candidates)."""
    import torch

    model, tokenizer, load_s = _teacher_model(cfg)
    got: dict = {"student_step_s": {}, "student_fixed_s": {}, "teacher_parameters": model.num_parameters()}
    said = []
    if teacher_runs:
        tc = cfg.teacher
        got["teacher_step_s"], checkpoint_s = teacher_step(model, tokenizer, texts, tc.batch_size, tc.max_length,
                                                           resolved_precision(tc.engine.precision, torch.device("cpu")))
        got["teacher_epoch_s"], got["teacher_fixed_s"] = checkpoint_s, load_s + checkpoint_s
        said.append(f"teacher {got['teacher_step_s']:.2f} s/step of {tc.batch_size} rows at max_length "
                    f"{tc.max_length}, loaded in {load_s:.0f} s, its checkpoint written in {checkpoint_s:.0f} s")
    got["score_rows_s"], made_s, scorer = score_rate(model, tokenizer, cfg, texts)
    got["score_fixed_s"] = load_s + made_s
    said.append(f"scoring {got['score_rows_s']:,.0f} rows/s")
    if scorer.precision != "fp32":  # the test stage and the report run the teacher at fp32
        got["fp32_rows_s"], _, scorer = score_rate(model, tokenizer, cfg, texts, precision="fp32")
        said.append(f"{got['fp32_rows_s']:,.0f} at fp32")
    got["teacher_row_s"] = row_seconds(scorer, texts)
    width, teacher_steps = int(model.config.hidden_size), {}
    for name in sorted(students):
        s_cfg = students[name]
        length = s_cfg.data.max_length or cfg.score.max_length or cfg.teacher.max_length or DEFAULT_MAX_LENGTH
        timed = (transformer_step(model, tokenizer, texts, s_cfg, length, teacher_steps)
                 if s_cfg.student == "transformer" else student_step(s_cfg, tokenizer, texts, width, length))
        if timed is not None:
            got["student_step_s"][name], got["student_fixed_s"][name] = timed
            said.append(f"{name} {timed[0] * 1000:.0f} ms/step of {s_cfg.batch_size}")
    if students:
        got["tokenize_rows_s"] = tokenize_rate(tokenizer, texts, cfg.teacher.max_length)
    return got, said


def machine_load() -> tuple[Optional[float], int]:
    """(the 1-minute load average, None where the system has none; the cores this process may use). Rates measured
    under a load above the cores are not the run's: threads that wait for a core can make a few timed steps
    10-30× slower than the stages will run once the other work ends."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        return os.getloadavg()[0], cores
    except OSError:
        return None, cores


def wanted(cfg: RunConfig, will_run: set[str]) -> dict[str, Any]:
    """What the stage kinds ask the calibration to time for their stages among `will_run` (StageKind.measures):
    "teacher", "score", "augment" (True), "students" ({rates key: its settings}, the kinds' together)."""
    needs: dict[str, Any] = {}
    for kind in KINDS.values():
        for what, value in (kind.measures(cfg, will_run) if kind.measures is not None else {}).items():
            if isinstance(value, dict):  # the students' steps: every kind's students together
                needs[what] = {**needs.get(what, {}), **value}
            else:
                needs[what] = needs.get(what) or value
    return needs


def measure_rates(cfg: RunConfig, rows: Rows, will_run: set[str]) -> Rates:
    """The rates of the kinds of stage in `will_run` (stage names), each from a few seconds of work, and the
    machine's load when they were measured."""
    texts, t0 = list(rows.sample), time.perf_counter()
    load, cores = machine_load()
    needs = wanted(cfg, will_run)
    teacher_runs, students = bool(needs.get("teacher")), needs.get("students", {})
    needs_model = teacher_runs or bool(needs.get("score")) or bool(students)
    if not texts or not needs_model and not needs.get("augment"):
        return Rates(measured="nothing to measure", load=load, cores=cores)
    with quiet():
        got, said = _model_rates(cfg, texts, teacher_runs, students) if needs_model else ({}, [])
    if needs.get("augment"):
        got["augment_rows_s"], got["augment_fixed_s"] = augment_rate(cfg, texts)
        said.append(f"augment {got['augment_rows_s']:,.0f} rows/s in process")
    said.append(f"measured in {time.perf_counter() - t0:.0f} s on {len(texts)} train rows")
    return Rates(**got, measured="; ".join(said), load=load, cores=cores, seconds=time.perf_counter() - t0)
