"""FastBERT's adaptive exits (Liu et al. 2020): a small classifier ("branch") after every encoder layer
of a frozen BERT-like classifier, and the per-example early exit that uses them.

    branches = Branches(layers=L - 1, hidden=H, classes=C, width=128)
    logits, layers = adaptive_forward(model, branches, ids, mask, type_ids, speed=0.3)

At inference a row leaves at the first layer k < L whose branch is certain enough, its normalised
entropy H(p_k) / log C below `speed`, with that branch's logits; the rows still in flight go on (the
batch shrinks, and so does its padding), and those that reach the top get the model's own head.
speed 0 never exits (no entropy is below 0), runs no branch, and is the model without exits.

The branch pools the layer's tokens (masked mean, or the [CLS] state) and classifies that (Linear
H→width, tanh, Linear width→C): FastBERT's pool-and-dense without its 128-d self-attention layer, so it
costs O(T·H + H·width) per row instead of an attention pass, and it runs after every layer on every row
still in flight, so its cost eats into what an exit saves. The mean, not [CLS]: on the MiniLM SST-2
teacher a [CLS] branch after layers 1-3 agreed with the teacher on 57-78% of held-out rows, a mean branch
on 87-93% (benchmarks/README.md). Its input is small enough to compute once per row and reuse across
epochs (students/compress/exits_train.py).

The last layer has no branch: the model's own classifier is the exit there. Saved beside the model
(`save_branches`): exits.safetensors and exits.json (schema.EXITS_FILE), so the folder stays a plain Hugging
Face / transferset model that loads without them; exits.json may also record the speed the folder answers at when
a call gives none (`write_speed`). BERT-like models only (the per-layer loop calls the
encoder's own layers and the BERT head: pooler → dropout → classifier).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from typing import Iterator, Optional

import torch
import torch.nn as nn

from students.data.files import StudentFileError, json_kind, read_json_object
from transferset import __version__
from transferset.contract import schema
from transferset.runtime.errors import UserError

POOLS = ("mean", "cls")  # what a branch reads of its layer: the masked mean of its tokens, or its [CLS] state
REMEDY = "train the exits again (`transferset exits`)"


@dataclass
class BranchesConfig:
    layers: int      # branches: one after each encoder layer but the last (L - 1)
    hidden: int      # H: the encoder's width
    classes: int     # C
    width: int = 128  # the branch's inner width (FastBERT reduces to 128 too)
    pool: str = "mean"  # one of POOLS


class Branches(nn.Module):
    """One head per encoder layer below the top, on that layer's pooled states: (B, H) → (B, C)."""

    def __init__(self, config: BranchesConfig):
        super().__init__()
        self.config = config
        self.heads = nn.ModuleList(
            nn.Sequential(nn.Linear(config.hidden, config.width), nn.Tanh(), nn.Linear(config.width, config.classes))
            for _ in range(config.layers))

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        """(B, L-1, H) pooled states of the layers below the top → (B, L-1, C) branch logits."""
        return torch.stack([head(pooled[:, k]) for k, head in enumerate(self.heads)], dim=1)

    def __len__(self) -> int:
        return len(self.heads)


def first_exit_branches(model: nn.Module, classes: int) -> Branches:
    """Branches for `model` that send every row out at the first (each certain of class 0): timed at any speed,
    the lower bound of what its trained exits can cost (the embeddings, one layer and one branch)."""
    n = len(model.base_model.encoder.layer)
    branches = Branches(BranchesConfig(layers=n - 1, hidden=int(model.config.hidden_size), classes=classes))
    with torch.no_grad():
        for h in branches.heads:
            h[-1].weight.zero_()
            h[-1].bias.zero_()
            h[-1].bias[0] = 30.0  # normalised entropy ~1e-12: below every speed above 0
    return branches.eval()


def normalized_entropy(logits: torch.Tensor) -> torch.Tensor:
    """(..., C) logits → (...) entropy of their softmax / log C, in [0, 1]: FastBERT's uncertainty."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1) / math.log(logits.shape[-1])


def leaves(uncertainty: torch.Tensor, speed: float) -> torch.Tensor:
    """Whether a row leaves at a branch: its uncertainty there strictly below `speed` (so speed 0 keeps every
    row to the top). The exit rule, in one place: exit_layers applies it to every branch at once,
    adaptive_forward branch by branch as the rows go up."""
    return uncertainty < speed


def exit_layers(uncertainty: torch.Tensor, speed: float) -> torch.Tensor:
    """(B, L-1) uncertainty of each branch → (B,) the 1-based layer each row leaves at: the first k where
    it `leaves`, else L (the model's own head)."""
    n = uncertainty.shape[1] + 1
    below = leaves(uncertainty, speed)
    first = below.float().argmax(1) + 1  # argmax: the first of equal maxima
    return torch.where(below.any(1), first, torch.full_like(first, n))


def check_speed(speed: Optional[float]) -> float:
    """None → 0 (every layer); else a number in [0, 1], the normalised entropy below which a row exits."""
    if speed is None:
        return 0.0
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.0 <= float(speed) <= 1.0:
        raise ValueError(f"speed {speed!r}: give a number from 0 (every layer: the model without exits) to 1 "
                         "(the earliest exits); it is the normalised entropy below which a row leaves")
    return float(speed)


# --------------------------------------------------------------------------- the per-layer forward


def check_bert_like(model: nn.Module, where: str) -> None:
    """The loop below calls BERT's embeddings, layers and head one by one: refuse any other model clearly."""
    base = getattr(model, "base_model", None)
    ok = (getattr(getattr(model, "config", None), "model_type", None) == "bert" and base is not None
          and hasattr(base, "embeddings") and hasattr(getattr(base, "encoder", None), "layer")
          and getattr(base, "pooler", None) is not None and isinstance(getattr(model, "classifier", None), nn.Linear))
    if not ok:
        kind = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise UserError(f"{where}: a {kind} model; early exits take BERT sequence classifiers (embeddings, "
                        "encoder.layer, pooler and a linear classifier), e.g. the MiniLM teacher or a transformer "
                        "student copied from it")
    if len(base.encoder.layer) < 2:
        raise UserError(f"{where}: one encoder layer; an exit below the top needs at least two")


def _mask(model: nn.Module, hidden: torch.Tensor, mask: torch.Tensor):
    from transformers.masking_utils import create_bidirectional_mask  # with the model: torch-only callers skip it

    return create_bidirectional_mask(config=model.config, inputs_embeds=hidden, attention_mask=mask)


def pool(hidden: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """(B, T, H) states and their (B, T) mask → (B, H): the masked mean of the tokens, or [CLS]."""
    if how == "cls":
        return hidden[:, 0]
    m = mask.to(hidden.dtype)[..., None]                                  # (B, T, 1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)


def _layers(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor,
            type_ids: Optional[torch.Tensor]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The hidden states (B, T, H) after each encoder layer and their mask, one layer at a time: the caller
    may shrink the batch between layers by sending the rows to keep (a (B,) bool tensor) back in."""
    base = model.base_model
    hidden = base.embeddings(input_ids=ids, token_type_ids=type_ids)   # (B, T, H)
    attention = _mask(model, hidden, mask)  # made again only when the batch changes, not for every layer
    for block in base.encoder.layer:
        hidden = block(hidden, attention)
        keep = yield hidden, mask
        if keep is not None:
            hidden, mask = hidden[keep], mask[keep]
            if mask.shape[0]:
                # The longest row still in flight sets the padding: the shorter rows' left with them.
                length = int(mask.any(0).nonzero().max()) + 1
                hidden, mask = hidden[:, :length], mask[:, :length]
                attention = _mask(model, hidden, mask)


def head(model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The model's own classifier on the top layer's states (B, T, H) → (B, C): BERT's pooler, dropout, linear."""
    return model.classifier(model.dropout(model.base_model.pooler(hidden)))


@torch.inference_mode()
def layer_states(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                 type_ids: Optional[torch.Tensor] = None, how: str = "mean") -> tuple[torch.Tensor, torch.Tensor]:
    """Every row through every layer → (the pooled states of layers 1..L-1 (B, L-1, H), the model's logits
    (B, C)): what the branches learn from, and from what."""
    pooled = []
    n = len(model.base_model.encoder.layer)
    for k, (hidden, m) in enumerate(_layers(model, ids, mask, type_ids), start=1):
        if k < n:
            pooled.append(pool(hidden, m, how))
        else:
            return torch.stack(pooled, dim=1), head(model, hidden)
    raise AssertionError("unreachable: the loop returns at the top layer")


@torch.inference_mode()
def adaptive_forward(model: nn.Module, branches: Branches, ids: torch.Tensor, mask: torch.Tensor,
                     type_ids: Optional[torch.Tensor], speed: float) -> tuple[torch.Tensor, torch.Tensor]:
    """→ (logits (B, C), the 1-based layer each row left at (B,)). See the module docstring."""
    b = ids.shape[0]
    n = len(model.base_model.encoder.layer)
    out = torch.empty(b, branches.config.classes, device=ids.device)
    used = torch.full((b,), n, dtype=torch.long, device=ids.device)
    rows = torch.arange(b, device=ids.device)  # which input rows are still in flight
    steps = _layers(model, ids, mask, type_ids)
    hidden, m = next(steps)
    for k in range(1, n + 1):
        if k == n:
            out[rows] = head(model, hidden).float()
            break
        if speed > 0:
            logits = branches.heads[k - 1](pool(hidden, m, branches.config.pool))   # (b', C)
            done = leaves(normalized_entropy(logits), speed)
            if bool(done.any()):
                out[rows[done]] = logits[done].float()
                used[rows[done]] = k
                keep = ~done
                rows = rows[keep]
                if rows.numel() == 0:
                    break
                hidden, m = steps.send(keep)
                continue
        hidden, m = next(steps)
    steps.close()
    return out, used


# --------------------------------------------------------------------------- saving and loading


def has_exits(model_dir: str) -> bool:
    return os.path.isfile(os.path.join(model_dir, schema.EXITS_FILE))


def save_branches(model_dir: str, branches: Branches, info: dict) -> None:
    """exits.safetensors + exits.json (the branches' shape, and `info`: how they were trained) in `model_dir`."""
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous() for k, v in branches.state_dict().items()},
              os.path.join(model_dir, schema.EXITS_WEIGHTS_FILE))
    with open(os.path.join(model_dir, schema.EXITS_FILE), "w", encoding="utf-8") as fh:
        json.dump({"branches": asdict(branches.config), **info, "library_version": __version__}, fh, indent=2)


def _exits_info(model_dir: str) -> tuple[str, dict]:
    """exits.json's path and its object (refused, saying what to do, when it is not one)."""
    path = os.path.join(model_dir, schema.EXITS_FILE)
    return path, read_json_object(path, holds="exits.json holds the branches' shape", remedy=REMEDY)


def write_speed(model_dir: str, speed: float) -> None:
    """Record in exits.json the speed the folder answers at when a call gives none (a search ships its chosen
    student with exits so: `predict`, `evaluate` and the report then run it as it was chosen)."""
    path, info = _exits_info(model_dir)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({**info, "speed": check_speed(speed)}, fh, indent=2)


def saved_speed(model_dir: str) -> Optional[float]:
    """The speed exits.json records for calls that give none (None: 0, every layer)."""
    path, info = _exits_info(model_dir)
    speed = info.get("speed")
    try:
        return None if speed is None else check_speed(speed)
    except ValueError as exc:
        raise StudentFileError(f"{path}: {exc}; {REMEDY}") from None


def load_branches(model_dir: str, model: nn.Module) -> Branches:
    """The branches saved beside `model`, checked against it (layers, width, classes)."""
    from safetensors.torch import load_file

    from transferset.models.loading import check_safetensors

    path, info = _exits_info(model_dir)
    spec = info.get("branches")
    if not isinstance(spec, dict):
        raise StudentFileError(f"{path}: branches is {json_kind(spec)}, not an object; {REMEDY}")
    try:
        config = BranchesConfig(**spec)
    except TypeError as exc:
        raise StudentFileError(f"{path}: branches {schema.cut(spec, 100)} ({exc}); {REMEDY}") from None
    if config.pool not in POOLS:
        raise StudentFileError(f"{path}: branch pool {config.pool!r}; this version knows {', '.join(POOLS)}; upgrade "
                               f"transferset or {REMEDY}")
    check_bert_like(model, model_dir)
    layers = len(model.base_model.encoder.layer)
    want = (layers - 1, int(model.config.hidden_size), int(model.config.num_labels))
    if (config.layers, config.hidden, config.classes) != want:
        raise StudentFileError(f"{path}: branches for {config.layers + 1} layers of width {config.hidden} and "
                               f"{config.classes} classes, beside a model of {layers} layers, width {want[1]}, "
                               f"{want[2]} classes: they belong to another model; {REMEDY}")
    weights = os.path.join(model_dir, schema.EXITS_WEIGHTS_FILE)
    if not os.path.isfile(weights):
        raise StudentFileError(f"{model_dir}: {schema.EXITS_FILE} without {schema.EXITS_WEIGHTS_FILE}; {REMEDY}")
    check_safetensors(weights)
    branches = Branches(config)
    try:
        branches.load_state_dict(load_file(weights))
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise StudentFileError(f"{weights}: does not hold the branches {path} describes ({first}); {REMEDY}") from None
    for name, tensor in branches.state_dict().items():
        if not bool(torch.isfinite(tensor).all()):
            raise StudentFileError(f"{weights}: {name} holds NaN or infinite values; {REMEDY}")
    return branches.eval()
