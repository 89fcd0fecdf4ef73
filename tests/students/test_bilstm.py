"""The BiLSTM student's forward pass and presets."""
import pytest
import torch

from students import bilstm


@pytest.mark.parametrize("pool", ["max", "last"])
def test_bilstm_prediction_does_not_depend_on_padding_or_batch(pool):
    torch.manual_seed(0)
    model = bilstm.BiLSTM(bilstm.BiLSTMConfig(vocab_size=40, embed_dim=8, hidden=6, head_dim=5, pool=pool)).eval()
    ids = torch.tensor([[5, 6, 7, 0, 0, 0], [9, 10, 11, 12, 13, 14]])
    mask = ids != 0
    with torch.no_grad():
        both = model(ids, mask)["logits"]
        alone = model(ids[:1, :3], mask[:1, :3])["logits"]
    torch.testing.assert_close(both[:1], alone, atol=1e-6, rtol=0)
    assert not torch.allclose(both[0], both[1])


def test_bilstm_presets_tang_and_xtremedistil():
    tang = bilstm.BiLSTM(bilstm.BiLSTMConfig(vocab_size=100, **bilstm.PRESETS["tang"]))
    assert tang.embed.embedding_dim == 300 and tang.lstm.hidden_size == 150 and tang.lstm.num_layers == 1
    assert tang.head.out_features == 200 and tang.config.head_act == "relu" and tang.config.pool == "last"
    xd = bilstm.BiLSTM(bilstm.BiLSTMConfig(vocab_size=100, **bilstm.PRESETS["xtremedistil"]))
    assert xd.config.pool == "max" and xd.config.head_act == "gelu" and xd.head.out_features == 384
