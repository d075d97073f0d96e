import os
from pathlib import Path

import pytest
import torch

from tests.tiny import write_corpus

# No test may reach the network or a wandb server.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# `pytest -n N` (pytest-xdist): each worker gets its share of the cores, for its own torch and for
# the train.py/evaluate.py processes its tests start (OMP_NUM_THREADS, which they inherit);
# OpenMP threads that outnumber the cores stall each other.
if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
    threads = max(1, (os.cpu_count() or 1) // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The tiny corpus (``tests.tiny.write_corpus``), written once for each test module."""
    return write_corpus(tmp_path_factory.mktemp("corpus"))
