"""Which kernels run where: one switch between this package's CPU kernels and its GPU paths.

On CPU, linear layers run oneDNN's kernel (:mod:`transformer.linear`), a decoding step's attention
two batched products (:func:`transformer.attend.step_attention`), and decoding reads and
writes its cache at positions the host knows (no CUDA graphs, so no shapes to keep). Elsewhere:
``F.linear``, ``F.scaled_dot_product_attention`` and static decoding shapes. Tests count the
kernels a GPU would launch by sending CPU tensors down the GPU paths:
``monkeypatch.setattr(transformer.kernels, "cpu_kernels", lambda x: False)`` (callers read it
through the module, ``kernels.cpu_kernels(x)``, so that the patch reaches them).
"""

from __future__ import annotations

from torch import Tensor


def cpu_kernels(x: Tensor) -> bool:
    """Whether ``x`` takes the CPU kernels (it lives on the CPU)."""
    return x.device.type == "cpu"
