"""The BiLSTM student's forward pass and presets."""
import pytest
import torch

from students.families import bilstm
from tolerances import reordered


@pytest.mark.parametrize("pool", ["max", "last"])
def test_bilstm_prediction_does_not_depend_on_padding_or_batch(pool):
    torch.manual_seed(0)
    model = bilstm.BiLSTM(bilstm.BiLSTMConfig(vocab_size=40, embed_dim=8, hidden=6, head_dim=5, pool=pool)).eval()
    ids = torch.tensor([[5, 6, 7, 0, 0, 0], [9, 10, 11, 12, 13, 14]])
    mask = ids != 0
    with torch.no_grad():
        both = model(ids, mask)["logits"]
        alone = model(ids[:1, :3], mask[:1, :3])["logits"]
    # batch of 2 against 1: each of the 3 steps is one reduction of embed + hidden = 14 terms, then the head's
    # two dense layers, summed in another order (tests/tolerances.py)
    torch.testing.assert_close(both[:1], alone, atol=reordered(alone.numpy(), terms=8 + 6, reductions=3 + 2), rtol=0)
    assert not torch.allclose(both[0], both[1])


def test_bilstm_shapes_tang_and_xtremedistil():
    tang = bilstm.BiLSTM(bilstm.BiLSTMConfig(vocab_size=100, **bilstm.SHAPES["tang"]))
    assert tang.embed.embedding_dim == 300 and tang.lstm.hidden_size == 150 and tang.lstm.num_layers == 1
    assert tang.head.out_features == 200 and tang.config.head_act == "relu" and tang.config.pool == "last"
    xd = bilstm.BiLSTM(bilstm.BiLSTMConfig(vocab_size=100, **bilstm.SHAPES["xtremedistil"]))
    assert xd.config.pool == "max" and xd.config.head_act == "gelu" and xd.head.out_features == 384


@pytest.mark.parametrize("layers", [1, 2])
def test_padded_directions_equal_the_packed_bidirectional_lstm(layers):
    """The two directions run over padded rows give exactly what nn.LSTM gives on a packed sequence."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    torch.manual_seed(0)
    model = bilstm.BiLSTM(bilstm.BiLSTMConfig(vocab_size=40, embed_dim=8, hidden=6, layers=layers)).eval()
    lengths = torch.tensor([3, 7, 1, 5])
    x = torch.randn(4, 7, 8)
    x[torch.arange(7).unsqueeze(0) >= lengths.unsqueeze(1)] = 5.0  # padding that must not leak anywhere
    with torch.no_grad():
        out, last = model.encode(x, lengths)
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        ref, (h, _) = model.lstm(packed)
        ref, _ = pad_packed_sequence(ref, batch_first=True, total_length=7)
    valid = (torch.arange(7).unsqueeze(0) < lengths.unsqueeze(1)).unsqueeze(-1)
    # our loop against PyTorch's packed LSTM: 7 chained steps of 8 + hidden terms (tests/tolerances.py)
    tol = reordered(ref.numpy(), terms=8 + model.lstm.hidden_size, reductions=7)
    torch.testing.assert_close(out * valid, ref * valid, atol=tol, rtol=0)
    torch.testing.assert_close(last, torch.cat([h[-2], h[-1]], dim=-1), atol=tol, rtol=0)


def test_gradients_reach_both_directions_of_every_layer():
    torch.manual_seed(0)
    model = bilstm.BiLSTM(bilstm.BiLSTMConfig(vocab_size=40, embed_dim=8, hidden=6, head_dim=5, layers=2))
    ids = torch.tensor([[5, 6, 7, 0], [9, 10, 11, 12]])
    model(ids, ids != 0)["logits"].sum().backward()
    for name, p in model.lstm.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_the_state_dict_is_that_of_a_bidirectional_nn_lstm():
    """Saved students keep loading: the one-way LSTMs the forward pass borrows add no weights or keys."""
    model = bilstm.BiLSTM(bilstm.BiLSTMConfig(vocab_size=40, embed_dim=8, hidden=6, layers=2))
    reference = torch.nn.LSTM(8, 6, num_layers=2, bidirectional=True)
    assert set(model.state_dict()) == ({"embed.weight", "head.weight", "head.bias", "classifier.weight",
                                        "classifier.bias"} | {f"lstm.{k}" for k in reference.state_dict()})
    assert sum(p.numel() for p in model.parameters()) == sum(t.numel() for t in model.state_dict().values())


@pytest.mark.parametrize("layers", [1, 2])
def test_rows_without_padding_take_nn_lstm_own_call_with_the_same_values(layers):
    """Eval on unpadded rows (batch 1 always) runs self.lstm directly: the padded path's values exactly."""
    torch.manual_seed(0)
    # no dropout: the training-mode check below compares values, not dropout draws
    model = bilstm.BiLSTM(bilstm.BiLSTMConfig(vocab_size=40, embed_dim=8, hidden=6, layers=layers, dropout=0.0)).eval()
    x = torch.randn(3, 5, 8)
    full = torch.tensor([5, 5, 5])
    padded = torch.cat([x, torch.full((3, 2, 8), 7.0)], dim=1)  # two padding steps: the general path
    with torch.no_grad():
        out, last = model.encode(x, full)
        ref_out, ref_last = model.encode(padded, full)
    # the fast path against the general one: 5 steps a layer, each of at most 2·6 + 6 terms (tests/tolerances.py)
    tol = reordered(ref_out.numpy(), terms=2 * 6 + 6, reductions=5 * layers)
    torch.testing.assert_close(out, ref_out[:, :5], atol=tol, rtol=0)
    torch.testing.assert_close(last, ref_last, atol=tol, rtol=0)
    # Training keeps the general path (its dropout draws between layers): the same values here.
    model.train()
    with torch.no_grad():
        torch.testing.assert_close(model.encode(x, full)[1], ref_last, atol=tol, rtol=0)
