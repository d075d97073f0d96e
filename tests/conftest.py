import os
from collections import Counter
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


# Set by the process that runs ``pytest -n --dist loadfile`` (the whole suite's command) for the
# workers it starts: xdist tells a worker nothing of how its files are handed out.
HEAVY_FIRST = "TESTS_HEAVY_FILES_FIRST"


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "dist", None) == "loadfile":
        config.option.loadscopereorder = False  # the order is ours (below), not pytest-xdist's
        os.environ[HEAVY_FIRST] = "1"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The order ``pytest -n --dist loadfile`` hands the files out in: those marked ``heavy``
    first, then the rest by their number of tests, most first (pytest-xdist's own order). A
    worker takes its next file as it starts the last tests of its current one, so a long file
    handed out last would run while the other worker idles; handed out first, the short files
    fill the end and both workers finish together. A file's tests keep their order. Other runs
    (the fast lane's test by test, plain ``pytest``) keep the collection's order."""
    if os.environ.get(HEAVY_FIRST) != "1":
        return
    tests = Counter(item.path for item in items)
    heavy = {item.path for item in items if item.get_closest_marker("heavy")}
    items.sort(key=lambda item: (item.path not in heavy, -tests[item.path]))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The tiny corpus (``tests.tiny.write_corpus``), written once for each test module."""
    return write_corpus(tmp_path_factory.mktemp("corpus"))
