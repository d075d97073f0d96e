import pytest
import torch
import torch.nn.functional as F

from transformer.linear import ONEDNN, Linear, linear


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


@pytest.mark.skipif(not ONEDNN, reason="this PyTorch build has no oneDNN linear operator")
@pytest.mark.parametrize("bias", [True, False])
def test_training_runs_onednn_with_the_gradients_of_f_linear(bias: bool) -> None:
    torch.manual_seed(0)
    layer = Linear(48, 300, bias=bias)
    ref = torch.nn.Linear(48, 300, bias=bias)
    ref.load_state_dict(layer.state_dict())  # the same parameters and state dict keys
    x = torch.randn(3, 7, 48, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    assert "mkldnn::_linear_pointwise" in kernels(lambda: layer(x).square().sum().backward())
    x.grad = None
    for p in layer.parameters():
        p.grad = None
    out = layer(x)
    out.square().sum().backward()
    out_ref = ref(x_ref)
    out_ref.square().sum().backward()
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-4)
    for p, p_ref in zip(layer.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(not ONEDNN, reason="this PyTorch build has no oneDNN linear operator")
def test_frozen_weights_or_inputs_get_only_the_gradients_asked_for() -> None:
    layer = Linear(16, 8)
    layer.requires_grad_(False)
    x = torch.randn(5, 16, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is None
    layer.requires_grad_(True)
    layer(torch.randn(5, 16)).sum().backward()  # the input needs no gradient
    assert layer.weight.grad is not None and layer.bias.grad is not None


def test_autocast_keeps_f_linear_and_its_dtype() -> None:
    layer = Linear(16, 8)
    x = torch.randn(5, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert "mkldnn::_linear_pointwise" not in kernels(lambda: layer(x))
        assert layer(x).dtype == torch.bfloat16


@pytest.mark.skipif(not ONEDNN, reason="this PyTorch build has no oneDNN linear operator")
def test_linear_function_takes_transposed_weights_as_the_loss_passes_them() -> None:
    x, w = torch.randn(9, 300), torch.randn(300, 48)  # x @ w, as linear(x, w.t())
    assert "mkldnn::_linear_pointwise" in kernels(lambda: linear(x, w.t()))
    torch.testing.assert_close(linear(x, w.t()), x @ w, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(linear(x.double(), w.double().t()), x.double() @ w.double())
