"""The attention kernel chosen knowingly: the ``sdpa_backends`` option is checked, each attention
type runs the backends it names, and the log says which kernel each type runs."""

from __future__ import annotations

import collections

import pytest
import torch
from torch.nn.attention import SDPBackend
from torch.utils._python_dispatch import TorchDispatchMode

from tests.tiny import compose_cfg, tiny_model
from transformer import sdpa_backends
from transformer.errors import ConfigError
from transformer.training.config_checks import validate_config

DEFAULT = {
    kind: ["flash", "efficient", "math"] for kind in ("encoder_self", "decoder_self", "cross")
}
FUSED_CPU = "_scaled_dot_product_flash_attention_for_cpu"  # CPU's fused kernel ("flash")


class OpCount(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def fused_calls(model, choice) -> int:
    """Attention calls of one float32 forward (2+2 layers: 6) that ran the CPU's fused kernel."""
    src, tgt = torch.randint(4, 50, (2, 5)), torch.randint(4, 50, (2, 6))
    src[1, 3:] = 0  # padding: encoder and cross-attention take a mask
    count = OpCount()
    with sdpa_backends.selected(model, choice), count, torch.no_grad():
        model(src, tgt)
    return count.ops[FUSED_CPU]


@pytest.mark.parametrize(
    "override, message",
    [
        ("sdpa_backends.cross=[flsh]", r"sdpa_backends\.cross=\['flsh'\]: give a non-empty list"),
        ("sdpa_backends.encoder_self=[]", r"sdpa_backends\.encoder_self=\[\]"),
        ("+sdpa_backends.decoder=[math]", r"for each of encoder_self, decoder_self, cross"),
    ],
)
def test_a_bad_backend_is_named_before_any_data_work(override, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(compose_cfg([override]))


def test_the_default_leaves_cudnn_out_and_is_one_list_for_the_process():
    choice = sdpa_backends.parse(compose_cfg([]).sdpa_backends)
    assert choice == {kind: [sdpa_backends.BACKENDS[n] for n in DEFAULT[kind]] for kind in DEFAULT}
    model = tiny_model(50)
    with sdpa_backends.selected(model, choice):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled()
        assert all(m.sdpa_backends is None for m in model.attention_modules("cross"))
    assert torch.backends.cuda.cudnn_sdp_enabled()  # restored


def test_each_attention_type_runs_the_backends_it_names():
    """Encoder self-attention on math alone, the others as by default: the encoder's two calls
    leave the fused kernel, the decoder's four keep it; the modules' lists are cleared after."""
    model = tiny_model(50)
    assert fused_calls(model, sdpa_backends.parse(DEFAULT)) == 6
    only_math = sdpa_backends.parse({**DEFAULT, "encoder_self": ["math"]})
    assert fused_calls(model, only_math) == 4
    assert all(m.sdpa_backends is None for m in model.attention_modules("encoder_self"))


def test_the_log_names_the_kernel_each_attention_type_runs():
    model = tiny_model(50)
    choice = sdpa_backends.parse({**DEFAULT, "encoder_self": ["math"]})
    line = sdpa_backends.describe(model, choice, torch.device("cpu"), torch.float32)
    assert line == (
        "encoder_self: math (of math), decoder_self: flash (of flash > efficient > math), "
        "cross: flash (of flash > efficient > math)"
    )
    bf16 = sdpa_backends.describe(model, None, torch.device("cpu"), torch.bfloat16)
    assert bf16.startswith("encoder_self: by hand (bf16/fp16 on CPU") and "PyTorch's order" in bf16
    assert SDPBackend.CUDNN_ATTENTION in sdpa_backends.NAMES
