"""The tiny task the tests of transferset/training/ train on: a linear model of 3 inputs and 2 classes, 4
batches of 8 random rows an epoch (seeded by the epoch), cross-entropy."""
import pytest
import torch

from transferset.config import EngineConfig

CPU = EngineConfig(device="cpu")


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, batch):
        return self.fc(batch["x"])


def _batches(epoch):
    g = torch.Generator().manual_seed(epoch)
    for _ in range(4):
        yield {"x": torch.randn(8, 3, generator=g), "labels": torch.randint(0, 2, (8,), generator=g)}


def _loss(net, batch):
    loss = torch.nn.functional.cross_entropy(net(batch), batch["labels"])
    return loss, {"ce": float(loss.detach())}


def _run(recipe, spec, module, evaluate, loss=_loss, index=0):
    return recipe.run(index, spec, module, loss, _batches, evaluate,
                      lambda: torch.optim.SGD(module.parameters(), lr=0.1))


@pytest.fixture(scope="module")
def engine():
    """The engine most tests of transferset/training/ train on: one CPU process, no log, no progress bar.
    (A fixture imported by the test modules, not a conftest.py: `from conftest import ...` in other tests
    takes whichever conftest module was imported last, and a third one broke it.)"""
    from transferset.training import Engine

    return Engine.create(CPU, log=lambda msg: None, progress_bar=False)
