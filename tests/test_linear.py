import pytest
import torch
import torch.nn.functional as F

from transformer.linear import ONEDNN, Linear


def kernels(fn) -> set[str]:
    """The operators ``fn`` runs (names from torch's profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key for e in prof.key_averages()}


@pytest.mark.skipif(not ONEDNN, reason="this PyTorch build has no oneDNN linear operator")
@pytest.mark.parametrize("bias", [True, False])
def test_inference_runs_onednn_and_computes_what_f_linear_computes(bias: bool) -> None:
    layer = Linear(48, 300, bias=bias)
    x = torch.randn(3, 7, 48)  # (B, T, D), as the decoder's layers see it
    with torch.no_grad():
        want = F.linear(x, layer.weight, layer.bias)
        assert "mkldnn::_linear_pointwise" in kernels(lambda: layer(x))
        torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-5)
        for other in (x.double(), x[:, :0]):  # float64, and no rows: F.linear's results
            layer64 = Linear(48, 300, bias=bias).to(other.dtype)
            assert torch.equal(layer64(other), F.linear(other, layer64.weight, layer64.bias))


def test_training_keeps_f_linear_and_its_gradients() -> None:
    layer = Linear(16, 8)
    x = torch.randn(5, 16, requires_grad=True)
    assert "mkldnn::_linear_pointwise" not in kernels(lambda: layer(x))
    layer(x).square().sum().backward()
    ref = torch.nn.Linear(16, 8)
    ref.load_state_dict(layer.state_dict())  # the same parameters and state dict keys
    x_ref = x.detach().clone().requires_grad_()
    ref(x_ref).square().sum().backward()
    assert torch.equal(x.grad, x_ref.grad) and torch.equal(layer.weight.grad, ref.weight.grad)
