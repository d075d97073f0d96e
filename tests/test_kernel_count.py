"""How many kernels one bf16 training step of transformer-base launches in eager mode.

A GPU step is host-bound when the host takes longer to issue its kernels (and autograd's
bookkeeping) than the GPU takes to run them: at transformer-base sizes, about a thousand small
kernels take as long to issue as the step's matrix products take to run. These tests count them
on CPU, where no GPU is needed, by the convention below, and pin a bound.

Counting convention:

- One training step: the model's teacher-forced forward, the label-smoothed loss as training
  computes it (``TranslationModule._loss``) and backward, for transformer-base's graph (6+6
  layers, dropout 0.1). The count does not depend on the width, so the model is 64 wide.
- What is counted: every ATen operator that reaches a backend kernel, seen by a
  ``TorchDispatchMode`` (below autograd and autocast: autocast's casts and autograd's backward
  operators are counted). Operators that only make a view or an empty tensor (``view``, ``t``,
  ``expand``, ``empty_like``, ...) launch nothing and are not counted. A multi-tensor operator
  (``_foreach_*``) counts one: on CUDA it is one launch per 110 tensors or 320 chunks of 64k
  elements (3 for transformer-base's linear weights).
- CUDA's code paths: where the project branches on the device, the CUDA branch runs
  (:func:`cuda_code_paths`): ``F.linear`` rather than the oneDNN CPU kernel, ``F.dropout`` (one
  ``native_dropout``, as ATen runs it on CUDA) rather than the 16-bit CPU mask, and PyTorch's
  SDPA rather than the bf16 CPU attention by hand. SDPA's CPU kernel stands for CUDA's flash or
  memory-efficient kernel: one operator forward, one backward, after the same mask handling.
- Autocast: ``torch.autocast("cpu", bfloat16)``. For the operators of this step CPU and CUDA
  autocast agree (linear layers and SDPA in bf16) except ``layer_norm``, which CUDA runs in
  float32 (casting a bf16 input) and CPU in its input's dtype; so the test also checks that every
  layer norm gets a float32 input, where neither autocast casts.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import transformer.attention
import transformer.dropout
import transformer.linear
from tests.tiny import padded_batch, tiny_model_config
from transformer.lit_module import TranslationModule

BOUND = 700  # kernels a step; today's count and the one before: BENCHMARKS.md
BASE = dict(d_model=64, num_heads=8, num_encoder_layers=6, num_decoder_layers=6, d_ff=128)

# Operators that return a view, an alias or an uninitialised tensor: no kernel runs.
NO_KERNEL = {
    "view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose", "permute", "expand",
    "unsqueeze", "squeeze", "slice", "select", "split", "split_with_sizes", "unbind", "as_strided",
    "alias", "detach", "lift_fresh", "empty", "empty_like", "empty_strided", "new_empty",
}  # fmt: skip


class KernelCount(TorchDispatchMode):
    """Counts the operators that run a kernel, by name, and the dtypes layer norms get."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.layer_norm_inputs: set[torch.dtype] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in NO_KERNEL:
            self.ops[name] += 1
        if name == "native_layer_norm":
            self.layer_norm_inputs.add(args[0].dtype)
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def _cuda_dropout(x, p=0.5, training=True, inplace=False):
    """``F.dropout`` as ATen runs it on CUDA: one fused ``native_dropout`` kernel."""
    return torch.native_dropout(x, p, training)[0] if training and 0 < p < 1 else x


@contextmanager
def cuda_code_paths(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The project's CUDA branches where it branches on the device (the module docstring)."""
    with monkeypatch.context() as m:
        m.setattr(transformer.linear, "_takes_onednn", lambda x, weight: False)
        m.setattr(
            transformer.dropout, "dropout", lambda x, p, training=True: F.dropout(x, p, training)
        )
        m.setattr(F, "dropout", _cuda_dropout)
        m.setattr(transformer.attention, "sdpa", F.scaled_dot_product_attention)
        yield


def count_step(module: TranslationModule) -> KernelCount:
    batch = padded_batch([(9, 7), (5, 11), (7, 8)], vocab=100)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _, n = module._loss(batch)
        (loss / n).backward()
        module.zero_grad(set_to_none=True)

    step()  # first-call work (autocast's weight cache, lazy inits) out of the way
    counter = KernelCount()
    with counter:
        step()
    return counter


@pytest.fixture
def base_step(monkeypatch) -> KernelCount:
    module = TranslationModule(tiny_model_config(100, **BASE, dropout=0.1)).train()
    with cuda_code_paths(monkeypatch):
        return count_step(module)


def test_a_bf16_training_step_of_transformer_base_launches_at_most_700_kernels(base_step):
    # CUDA's autocast runs layer_norm in float32: a bf16 input would cost a cast there that the
    # CPU count does not see. Every layer norm gets float32, so there is none.
    assert base_step.layer_norm_inputs == {torch.float32}
    assert base_step.total <= BOUND, base_step.ops.most_common()


def test_no_layer_rebuilds_a_mask_and_no_linear_layer_casts_its_weights(base_step):
    """Masks: built once a batch in the kernels' form, so SDPA converts none (a boolean mask
    costs ``where`` and two ``scalar_tensor`` a call). Casts: the 66 linear layers' weights and
    biases in one copy each way; what is left are the layer norms' outputs (36, and their
    gradients) and the residual branches' gradients (30), a handful in the loss."""
    ops = base_step.ops
    assert ops["where"] == ops["scalar_tensor"] == ops["bitwise_not"] == 0, ops
    assert ops["_foreach_copy_"] == 2  # the linear weights, then their gradients
    assert ops["_to_copy"] <= 36 * 2 + 30 + 8, ops["_to_copy"]
