"""The engine most tests of transferset/training/ train on: one CPU process, no log, no progress bar."""
import pytest

from linear_task import CPU
from transferset.training import Engine


@pytest.fixture(scope="module")
def engine():
    return Engine.create(CPU, log=lambda msg: None, progress_bar=False)
