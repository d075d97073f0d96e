import os
from pathlib import Path

import pytest
import torch

from tests.tiny import write_corpus

# No test may reach the network or a wandb server.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The tiny corpus (``tests.tiny.write_corpus``), written once for each test module."""
    return write_corpus(tmp_path_factory.mktemp("corpus"))
