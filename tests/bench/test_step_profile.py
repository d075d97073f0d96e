"""The time of a CPU step by category: each operator's own time goes to its category, and only
the time outside every operator is a host gap."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from bench.step_profile import CATEGORIES, STEP_MARK, categories, profiler

CPU = torch.device("cpu")


def split_of_two_steps(step: Callable[[], object]) -> dict[str, float]:
    """:func:`categories` of two CPU steps, after one outside the profile (its first call's
    setup, or compilation)."""
    step()
    with profiler(CPU) as prof:
        for _ in range(2):
            with torch.profiler.record_function(STEP_MARK):
                step()
    return categories(prof, CPU)


def test_a_cpu_step_of_matrix_products_is_counted_as_matrix_products() -> None:
    """aten::mm calls aten::resolve_conj and does its work itself: its time is matrix products,
    not a host gap (nor lost with the operators that call others)."""
    torch.manual_seed(0)
    w = torch.randn(512, 512, requires_grad=True)
    x = torch.randn(1024, 512)
    split = split_of_two_steps(lambda: (x @ w).relu().sum().backward())
    total = sum(split[c] for c in CATEGORIES)
    assert split["steps"] == 2
    assert split["matrix products"] > 0.5 * total, split  # two 1024x512x512 products
    # Alone the products take 8-12x the gaps; beside another process on a loaded core, 4x.
    assert split["matrix products"] > 2 * split["host gaps"], split
    assert min(split[c] for c in CATEGORIES) >= 0


@pytest.mark.slow
def test_a_compiled_graphs_fused_kernels_are_work_not_host_gaps() -> None:
    """Inductor's fused kernels are no operators to the profiler: the graph's own time is
    counted as elementwise work, the matrix product it calls as a matrix product."""
    step = torch.compile(lambda x, w: ((x @ w).relu() * x.sin() + x.cos().exp()).tanh().mean())
    x, w = torch.randn(4096, 1024), torch.randn(1024, 1024)
    split = split_of_two_steps(lambda: step(x, w))
    assert split["matrix products"] > 0 and split["norms and elementwise"] > 0, split
    assert split["host gaps"] < 0.5 * split["norms and elementwise"], split
