"""The kernels one bf16 training step of transformer-base launches in eager mode, counted on CPU.

A GPU step is host-bound when the host takes longer to issue its kernels (and autograd's
bookkeeping) than the GPU takes to run them. This counts them without a GPU, by this convention
(``tests/test_kernel_count.py`` pins the bound; the counts are in docs/benchmarks.md):

- One training step: the teacher-forced forward, the label-smoothed loss as training computes it
  (``TranslationModule._loss``) and backward, of transformer-base's graph (6+6 layers, dropout
  0.1). The count does not depend on the width, so the model is 64 wide.
- Counted: every ATen operator that reaches a backend kernel, seen by a ``TorchDispatchMode``
  (below autograd and autocast: autocast's casts and the backward's operators count). Operators
  that only make a view or an uninitialised tensor (:data:`NO_KERNEL`) launch nothing. A
  multi-tensor operator (``_foreach_*``) counts one; on CUDA it is one launch per 110 tensors or
  320 chunks of 64k elements (3 for transformer-base's linear weights).
- CUDA's code paths where the project branches on the device (:func:`cuda_code_paths`):
  ``F.linear`` rather than the oneDNN CPU kernel, ``F.dropout`` as ATen runs it on CUDA (one
  ``native_dropout``) rather than the 16-bit CPU mask, PyTorch's SDPA rather than the bf16 CPU
  attention by hand. SDPA's CPU kernel stands for CUDA's flash or memory-efficient one: one
  operator forward, one backward, after the same mask handling.
- Autocast: ``torch.autocast("cpu", bfloat16)``. For this step's operators CPU and CUDA autocast
  agree (linear layers and SDPA in bf16) except ``layer_norm``, which CUDA runs in float32,
  casting a bf16 input, and CPU in its input's dtype: every layer norm must get float32, where
  neither casts (:attr:`KernelCount.layer_norm_inputs`).

    python bench/count_kernels.py    # the total and the count of each operator
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import transformer.attend
import transformer.dropout
import transformer.linear
from transformer.data.collate import Collator
from transformer.training import TranslationModule

BASE = dict(  # transformer-base's graph, 64 wide
    src_vocab_size=100, tgt_vocab_size=100, d_model=64, num_heads=8, num_encoder_layers=6,
    num_decoder_layers=6, d_ff=128, dropout=0.1,
)  # fmt: skip

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


def _dropout_off_cpu(x, p, training=True):
    """``transformer.dropout.dropout`` off CPU: ``F.dropout``."""
    return F.dropout(x, p, training)


@contextmanager
def cuda_code_paths() -> Iterator[None]:
    """The project's CUDA branches where it branches on the device (the module docstring)."""
    patches = [
        mock.patch.object(transformer.linear, "_takes_onednn", lambda x, weight: False),
        mock.patch.object(transformer.dropout, "dropout", _dropout_off_cpu),
        mock.patch.object(F, "dropout", _cuda_dropout),
        mock.patch.object(transformer.attend, "sdpa", F.scaled_dot_product_attention),
    ]  # fmt: skip
    with ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        yield


def count_step(module: TranslationModule) -> KernelCount:
    """The kernels of one bf16 training step of ``module`` on a batch of three pairs, after a
    first step (autocast's caches and lazy initialisations)."""
    rng = np.random.default_rng(0)
    pairs = [(9, 7), (5, 11), (7, 8)]  # (source, target) lengths
    batch = Collator()(
        [(i, rng.integers(4, 100, s), rng.integers(4, 100, t)) for i, (s, t) in enumerate(pairs)]
    )

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _, n = module._loss(batch)
        (loss / n).backward()
        module.zero_grad(set_to_none=True)

    step()
    counter = KernelCount()
    with counter:
        step()
    return counter


def count_base_step() -> KernelCount:
    """:func:`count_step` of transformer-base's graph, along CUDA's code paths."""
    torch.manual_seed(0)
    module = TranslationModule(BASE).train()
    with cuda_code_paths():
        return count_step(module)


def main() -> None:
    counter = count_base_step()
    dtypes = ", ".join(sorted(map(str, counter.layer_norm_inputs)))
    print(f"kernels a step: {counter.total} (layer norm inputs: {dtypes})")
    for name, n in counter.ops.most_common():
        print(f"{n:6d}  {name}")


if __name__ == "__main__":
    main()
