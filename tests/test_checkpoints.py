"""The checkpoint's random states."""

from __future__ import annotations

import torch
from torch import Tensor

from transformer import checkpoints


def test_gpu_random_state_resumes_on_a_machine_with_fewer_gpus(monkeypatch):
    """A checkpoint holds the random state of its process's own GPU; one written before that
    holds every visible GPU's, and resuming it where fewer GPUs exist restores this process's
    GPU only (``torch.cuda.set_rng_state_all`` would index a GPU that is not there)."""
    restored: list[tuple[int, Tensor]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: torch.full((4,), 7, dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s: restored.append((0, s)))

    def set_all(states):  # what torch does: device i for the i-th state
        for i, s in enumerate(states):
            if i >= torch.cuda.device_count():
                raise RuntimeError(f"invalid device ordinal {i}")
            restored.append((i, s))

    monkeypatch.setattr(torch.cuda, "set_rng_state_all", set_all)
    states = checkpoints.get_rng_states()
    assert torch.equal(states["cuda"], torch.full((4,), 7, dtype=torch.uint8))  # one GPU's
    checkpoints.set_rng_states(states)
    assert [(i, s.tolist()) for i, s in restored] == [(0, [7] * 4)]

    restored.clear()  # saved on two GPUs, resumed on one
    old = {
        **states,
        "cuda": [torch.full((4,), 1, dtype=torch.uint8), torch.full((4,), 2, dtype=torch.uint8)],
    }
    checkpoints.set_rng_states(old)
    assert [(i, s.tolist()) for i, s in restored] == [(0, [1] * 4)]
