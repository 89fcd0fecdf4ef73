"""BiLSTM student training step: packed sequence (the reference) vs the two padded directions.

Real SST-2 train sentences, tokenized with the teacher's WordPiece tokenizer (the packaged MiniLM),
batched as the trainer batches them (rows of similar length together), one training step each
(forward, MSE to random logits, backward, AdamW). Both variants share the same weights and batches
and run in alternating rounds; the best round of each is kept.

    .venv/bin/python benchmarks/bilstm.py                  # default and tang shapes, 2,048 rows
    .venv/bin/python benchmarks/bilstm.py --threads 2 --rows 4096
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from students.families import bilstm  # noqa: E402
from transferset.models.loading import resolve_model  # noqa: E402
from transferset.runtime.threads import set_torch_threads  # noqa: E402


def packed_forward(model: bilstm.BiLSTM, ids, mask):
    """The previous forward pass: nn.LSTM over a packed sequence."""
    lengths = mask.sum(1).clamp(min=1)
    x = model.drop(model.embed(ids))
    out, (h, _) = model.lstm(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
    if model.config.pool == "max":
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=ids.shape[1])
        pooled = out.masked_fill(~mask.unsqueeze(-1), float("-inf")).max(1).values
    else:
        pooled = torch.cat([h[-2], h[-1]], -1)
    z = model.head(model.drop(pooled))
    rep = F.gelu(z) if model.config.head_act == "gelu" else F.relu(z)
    return {"logits": model.classifier(model.drop(rep))}


VOCAB = 10_000


def batches(rows: int, batch_size: int):
    from transformers import AutoTokenizer

    path = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "sst2", "train.tsv")
    with open(path, encoding="utf-8") as fh:
        texts = [line.split("\t")[0] for line in fh.read().splitlines()[1:rows + 1]]
    tok = AutoTokenizer.from_pretrained(resolve_model("sentence-transformers/all-MiniLM-L6-v2"))
    texts.sort(key=len)  # rows of similar length share a batch, as in the trainer
    out = []
    for i in range(0, len(texts), batch_size):
        enc = tok(texts[i:i + batch_size], padding=True, truncation=True, max_length=64, return_tensors="pt")
        # The trainer embeds only the WordPiece ids the transfer set uses (trim_vocab): ~10k here.
        out.append((enc["input_ids"] % VOCAB, enc["attention_mask"].bool()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    set_torch_threads(args.threads)
    data = batches(args.rows, args.batch_size)
    tokens = sum(int(m.sum()) for _, m in data)
    print(f"{args.rows} SST-2 rows, {tokens} real tokens, batch {args.batch_size}, {args.threads} thread(s), "
          f"load average {os.getloadavg()[0]:.1f}")
    for shape in ("xtremedistil", "tang"):
        torch.manual_seed(0)
        model = bilstm.BiLSTM(bilstm.BiLSTMConfig(vocab_size=VOCAB, **bilstm.SHAPES[shape])).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        variants = {"packed (reference)": lambda ids, m: packed_forward(model, ids, m),
                    "padded directions": lambda ids, m: model(ids, m)}
        best = {name: float("inf") for name in variants}
        for _ in range(args.rounds):
            for name, fwd in variants.items():
                t0 = time.perf_counter()
                for ids, m in data:
                    loss = F.mse_loss(fwd(ids, m)["logits"], torch.zeros(len(ids), 2))
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                best[name] = min(best[name], time.perf_counter() - t0)
        ref = best["packed (reference)"]
        for name, sec in best.items():
            print(f"  {shape:<13} {name:<20} {args.rows / sec:7.0f} rows/s  {ref / sec:4.2f}x")


if __name__ == "__main__":
    main()
