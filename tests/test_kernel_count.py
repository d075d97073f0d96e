"""How many kernels one bf16 training step of transformer-base launches in eager mode, against
the bound. The convention (``bench/count_kernels.py``, in full): forward, the fused loss and
backward of the 6+6-layer graph at width 64 (the count does not depend on it); every ATen operator
that runs a kernel, seen below autograd and autocast (views and empty tensors launch nothing); the
project's CUDA branches for dropout, linear layers and attention; CPU autocast in bf16, which
agrees with CUDA's on this step's operators as long as every layer norm gets float32 (CUDA's
autocast would cast a bf16 one), which the test checks."""

from __future__ import annotations

import pytest
import torch

from bench.count_kernels import KernelCount, count_base_step

BOUND = 700  # kernels a step; the counts before and after: docs/benchmarks.md


@pytest.fixture(scope="module")
def base_step() -> KernelCount:
    return count_base_step()


def test_a_bf16_training_step_of_transformer_base_launches_at_most_700_kernels(base_step):
    # CUDA's autocast runs layer_norm in float32: a bf16 input would cost a cast there that the
    # CPU count does not see. Every layer norm gets float32, so there is none.
    assert base_step.layer_norm_inputs == {torch.float32}
    assert base_step.total <= BOUND, base_step.ops.most_common()


def test_no_layer_rebuilds_a_mask_and_no_linear_layer_casts_its_weights(base_step):
    """Masks: built once a batch in the kernels' form, so SDPA converts none (a boolean mask
    costs ``where`` and two ``scalar_tensor`` a call). Casts: the linear layers' 133 weights and
    biases in one copy each way; what is left are the layer norms' outputs that feed linear
    layers (30, the encoder's output once; each with its gradient) and the residual branches'
    gradients (30), a handful in the loss. Cross-attention's keys and values: one product for
    the six layers."""
    ops = base_step.ops
    assert ops["where"] == ops["scalar_tensor"] == ops["bitwise_not"] == 0, ops
    assert ops["_foreach_copy_"] == 2  # the linear weights, then their gradients
    assert ops["_to_copy"] <= 31 * 2 + 30 + 8, ops["_to_copy"]
    assert ops["addmm"] == 61  # 66 linear layers, the six K/V projections as one
