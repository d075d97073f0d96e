"""Dropout's 16-bit CPU mask: the drop rate, the scaling, the gradient, the seeding."""

from __future__ import annotations

import pytest
import torch

from transformer.dropout import Dropout, dropout


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_drop_rate_is_p_for_every_element_position(p):
    """Each 64-bit draw serves 4 elements: every one of the 4 positions must drop at rate p."""
    torch.manual_seed(0)
    x = torch.ones(4 * 250_000 + 3)  # not a multiple of 4
    out = dropout(x, p)
    dropped = out.eq(0)
    sigma = (p * (1 - p) / 250_000) ** 0.5
    for lane in range(4):
        assert abs(dropped[lane::4].float().mean().item() - p) < 5 * sigma, lane
    scale = 65536 / (65536 - round(p * 65536))  # 1 / (1 - p) for p rounded to 16 bits
    torch.testing.assert_close(out[~dropped], torch.full_like(out[~dropped], scale))


@pytest.mark.slow
def test_expected_output_is_the_input_and_dtype_and_shape_are_kept():
    torch.manual_seed(1)
    x = torch.randn(64, 33, 16).bfloat16()
    outs = torch.stack([dropout(x, 0.3).float() for _ in range(400)])
    assert outs.dtype == torch.float32 and dropout(x, 0.3).dtype == torch.bfloat16
    assert dropout(x, 0.3).shape == x.shape
    torch.testing.assert_close(outs.mean(0).mean(), x.float().mean(), atol=2e-3, rtol=0)
    kept = outs != 0
    want = (x.float() / 0.7).expand_as(outs)
    torch.testing.assert_close(outs[kept], want[kept], rtol=1e-2, atol=0)


def test_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(2)
    x = torch.rand(1000, 7).add_(0.5).requires_grad_()
    out = dropout(x, 0.2)
    out.sum().backward()
    torch.testing.assert_close(x.grad, (out / x).detach())
    scale = torch.tensor(65536 / (65536 - round(0.2 * 65536)))  # as a float32
    assert set(x.grad.unique().tolist()) == {0.0, scale.item()}


def test_seeded_masks_repeat_and_successive_masks_differ():
    x = torch.ones(10_000)
    torch.manual_seed(3)
    a, b = dropout(x, 0.1), dropout(x, 0.1)
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.1), a) and not torch.equal(a, b)


def test_identity_in_eval_and_at_zero_all_dropped_at_one():
    x = torch.randn(5, 6)
    assert dropout(x, 0.0) is x and dropout(x, 0.5, training=False) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    layer = Dropout(0.5).eval()
    assert layer(x) is x and "p=0.5" in repr(layer)
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\], got 1.5"):
        Dropout(1.5)
