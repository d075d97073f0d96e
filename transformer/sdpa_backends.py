"""Which attention kernel runs: PyTorch's SDPA backends, chosen per attention type.

``F.scaled_dot_product_attention`` runs the first of its enabled kernels, in priority order,
that takes the call: flash (fp16/bf16, no mask: causal decoder self-attention), memory-efficient
(masks: padded encoder self-attention and cross-attention), cuDNN, or math (anything, slowly).
PyTorch 2.11+ with CUDA 13 puts cuDNN's first on Hopper, and cuDNN builds a plan for every new
shape, about 0.4 s forward and 0.5 s backward (issue 48): token-budget batches bring new shapes
all through the first epoch, and decoding brings one every step. So the run says which kernels
each attention type may use, in order (the ``sdpa_backends`` option; cuDNN only where asked for),
and logs which one each will run (:func:`describe`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from transformer.config import ATTENTION_TYPES
from transformer.errors import ConfigError
from transformer.model import Transformer

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
NAMES = {backend: name for name, backend in BACKENDS.items()}

Choice = dict[str, list[SDPBackend]]  # attention type -> its backends, first preferred


def parse(option: Mapping[str, Sequence[str]] | None) -> Choice | None:
    """The ``sdpa_backends`` option checked: for each attention type (``ATTENTION_TYPES``) a list
    of backend names (:data:`BACKENDS`), first preferred; None leaves the choice to PyTorch."""
    if option is None:
        return None
    if not isinstance(option, Mapping) or set(option) != set(ATTENTION_TYPES):
        raise ConfigError(
            f"sdpa_backends needs a list of backends for each of {', '.join(ATTENTION_TYPES)} "
            f"(or null: PyTorch's choice), got {option!r}"
        )
    choice = {}
    for kind in ATTENTION_TYPES:
        names = option[kind]
        if isinstance(names, str) or not names or any(n not in BACKENDS for n in names):
            raise ConfigError(
                f"sdpa_backends.{kind}={names!r}: give a non-empty list of {', '.join(BACKENDS)}, "
                "first preferred, e.g. [flash, efficient, math]"
            )
        choice[kind] = [BACKENDS[n] for n in names]
    return choice


@contextmanager
def selected(model: Transformer, choice: Choice | None) -> Iterator[None]:
    """Within, each attention type of ``model`` runs the first of its backends that takes its
    call. One list for every type is set once, for the whole process (nothing a call); lists
    that differ are entered around each call (``MultiheadAttention.sdpa_backends``)."""
    if choice is None:
        yield
        return
    lists = list(choice.values())
    common = lists[0] if all(backends == lists[0] for backends in lists) else None
    for kind, backends in choice.items():
        for module in model.attention_modules(kind):
            module.sdpa_backends = None if common else backends
    try:
        with sdpa_kernel(common, set_priority=True) if common else nullcontext():
            yield
    finally:
        for kind in choice:
            for module in model.attention_modules(kind):
                module.sdpa_backends = None


def describe(model: Transformer, choice: Choice | None, device: torch.device, dtype) -> str:
    """For the log: the backend each attention type's training call runs on ``device`` with
    ``dtype`` inputs (what PyTorch picks for a call of that type's head size, mask and causality
    among the allowed ones), and the allowed ones."""
    cfg = model.cfg
    q = torch.zeros(2, cfg.num_heads, 8, cfg.head_dim, device=device, dtype=dtype)
    mask = torch.zeros(2, 1, 1, 8, device=device, dtype=dtype)  # padding_bias's form
    calls = {"encoder_self": (mask, False), "decoder_self": (None, True), "cross": (mask, False)}
    parts = []
    for kind, (attn_mask, causal) in calls.items():
        backends = choice[kind] if choice else None
        if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
            runs = "by hand (bf16/fp16 on CPU: transformer.attend.sdpa)"
        else:
            with sdpa_kernel(backends, set_priority=True) if backends else nullcontext():
                picked = SDPBackend(torch._fused_sdp_choice(q, q, q, attn_mask, 0.0, causal))
            runs = NAMES.get(picked, picked.name.lower())
        allowed = " > ".join(NAMES[b] for b in backends) if backends else "PyTorch's order"
        parts.append(f"{kind}: {runs} (of {allowed})")
    return ", ".join(parts)
