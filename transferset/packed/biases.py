"""Relative-position score biases, per length of row: MPNet's (one for every layer) and DeBERTa-v2/v3's
disentangled attention (per layer, from its queries and keys)."""
from __future__ import annotations


class _MPNetBias:
    """MPNet's relative position bias: the same (1, heads, L, L) for every row of length L and every
    layer, computed once per length by the encoder's own bucketing."""

    def __init__(self, encoder):
        self.encoder, self.cache = encoder, {}

    def __call__(self, q, k, length: int):
        bias = self.cache.get(length)
        if bias is None:
            probe = q.new_zeros(1, length, 1)
            bias = self.cache[length] = self.encoder.compute_position_bias(probe).to(q.dtype)  # (1, heads, L, L)
        return bias


class _DisentangledBias:
    """DeBERTa-v2/v3's content-to-position and position-to-content scores of one layer, on rows of
    equal length. The position projections of the relative embeddings depend on the weights only,
    so they are computed once here instead of in every forward pass (the model's own forward
    re-projects 2 × 256 relative embeddings per layer per call)."""

    def __init__(self, sa, rel_embeddings, position_buckets: int, max_relative_positions: int, scale: float):
        span = sa.pos_ebd_size
        rel = rel_embeddings[:span * 2]  # (2S, H)
        heads, d = sa.num_attention_heads, sa.attention_head_size

        def per_head(linear):  # (2S, H) -> (heads, 2S, d)
            return linear(rel).view(2 * span, heads, d).transpose(0, 1).contiguous()

        kinds = sa.pos_att_type
        self.pos_key = per_head(sa.key_proj if sa.share_att_key else sa.pos_key_proj) if "c2p" in kinds else None
        self.pos_query = per_head(sa.query_proj if sa.share_att_key else sa.pos_query_proj) \
            if "p2c" in kinds else None
        self.span, self.buckets, self.max_positions, self.scale = span, position_buckets, max_relative_positions, scale
        self.cache: dict = {}

    def _index(self, length: int, device):
        """For rows of `length`: (c2p, p2c), each (first, width, (L, L) index): the model's own relative
        position indices into the 2S embeddings, less `first`, the lowest of them. Only the `width` embeddings
        from `first` on (at most 2L - 1 of the 2S) can score, so only they are multiplied."""
        import torch
        from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

        index = self.cache.get(length)
        if index is None:
            probe = torch.zeros(1, length, 1, device=device)
            rel = build_relative_position(probe, probe, bucket_size=self.buckets, max_position=self.max_positions)[0]
            last = 2 * self.span - 1
            index = self.cache[length] = tuple(self._window(i) for i in (torch.clamp(rel + self.span, 0, last),
                                                                         torch.clamp(-rel + self.span, 0, last)))
        return index

    @staticmethod
    def _window(index) -> tuple:
        """(first, width, index - first) of an (L, L) index: computed once per length, not per call."""
        first = int(index.min())
        return first, int(index.max()) - first + 1, (index - first).contiguous()

    @staticmethod
    def _scores(x, table, window: tuple):
        """out[r, h, a, b] = x[r, h, a] · table[h, first + index[a, b]]: one matmul against the embeddings
        in reach, then a gather (the model's own forward does the same against all 2S of them)."""
        import torch

        first, width, index = window
        scores = torch.matmul(x, table[:, first:first + width].transpose(-1, -2))  # (rows, heads, L, width)
        return torch.gather(scores, -1, index.expand(x.shape[0], x.shape[1], -1, -1))

    def __call__(self, q, k, length: int):
        c2p, p2c = self._index(length, q.device)
        bias = None
        if self.pos_key is not None:  # q_i · K_pos[c2p(i, j)]
            bias = self._scores(q, self.pos_key, c2p)
        if self.pos_query is not None:  # k_j · Q_pos[p2c(j, i)], laid out as (i, j)
            term = self._scores(k, self.pos_query, p2c).transpose(-1, -2)
            bias = term if bias is None else bias.add_(term)
        return None if bias is None else bias.mul_(self.scale)
