"""Where and in what type a model decodes: ``device=`` (auto, cpu, cuda) and ``dtype=`` (auto,
float32, bfloat16, float16) as ``evaluate.py`` and ``Translator.from_checkpoint`` take them."""

from __future__ import annotations

import torch

from transformer.errors import ConfigError
from transformer.precision import cuda_has_bf16

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def decoding_device(name: str) -> torch.device:
    """The device to decode on (``device=``): auto (a GPU where there is one), cpu or cuda."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device={name} is not a device; use auto, cpu or cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name}, but no GPU is available; use device=cpu or device=auto")
    return device


def decoding_dtype(name: str, device: torch.device) -> torch.dtype:
    """The weights' type while decoding (``dtype=``; auto: bf16 on a GPU that computes it
    natively, fp16 on one that does not (:func:`transformer.precision.cuda_has_bf16`), float32
    on the CPU); log-probabilities and beam scores are float32 whatever it is
    (:class:`transformer.decoding.step.Stepper`)."""
    if name == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if cuda_has_bf16() else torch.float16
    if name not in DTYPES:
        raise ConfigError(f"dtype={name} is not one of auto | {' | '.join(DTYPES)}")
    if name == "float16" and device.type == "cpu":
        raise ConfigError("dtype=float16 is for GPUs (CPU float16 matmuls are slow); on CPU use "
                          "dtype=bfloat16")  # fmt: skip
    if name == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("dtype=bfloat16: this GPU does not support it; use dtype=float16")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """As ``dtype=`` spells it: float32, bfloat16, float16."""
    return str(dtype).removeprefix("torch.")
