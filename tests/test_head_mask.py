"""Head masks: per attention module, in both kernels, with the KV cache, never saved."""

import pytest
import torch

from tests.tiny import tiny_model
from transformer import AttentionMaps
from transformer.attention import MultiheadAttention
from transformer.model import ATTENTION_TYPES

PAD, V = 0, 50


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.cat([torch.randint(4, V, (2, 5)), torch.full((2, 2), PAD)], 1)
    return src, torch.randint(4, V, (2, 4))


@pytest.mark.parametrize("kind", ATTENTION_TYPES)
@pytest.mark.parametrize("explicit", [False, True], ids=["sdpa", "explicit"])
def test_masking_no_head_changes_nothing(kind: str, explicit: bool) -> None:
    model, (src, tgt) = tiny_model(V, num_kv_heads=2), batch()
    attention = AttentionMaps() if explicit else None
    reference = model(src, tgt, attention=attention)
    for layer in range(2):
        model.set_head_mask(kind, layer, torch.ones(4))
    attention = AttentionMaps() if explicit else None
    assert torch.equal(model(src, tgt, attention=attention), reference)


@pytest.mark.parametrize("kind", ATTENTION_TYPES)
def test_all_heads_but_one_masked_changes_the_output_in_both_kernels(kind: str) -> None:
    model, (src, tgt) = tiny_model(V), batch()
    reference = model(src, tgt)
    model.set_head_mask(kind, 1, torch.tensor([0.0, 0.0, 1.0, 0.0]))
    masked = model(src, tgt)
    assert (masked - reference).abs().max() > 1e-3
    torch.testing.assert_close(model(src, tgt, attention=AttentionMaps()), masked)
    model.clear_head_masks()
    assert torch.equal(model(src, tgt), reference)


def test_a_fully_masked_module_outputs_its_bias() -> None:
    attn = MultiheadAttention(16, 4, cross=True)
    torch.nn.init.normal_(attn.out_proj.bias)
    attn.head_mask = torch.zeros(4)
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    out, _ = attn(x, memory)
    torch.testing.assert_close(out, attn.out_proj.bias.expand(2, 3, 16))


def test_masks_hold_during_incremental_decoding() -> None:
    model, (src, tgt) = tiny_model(V), batch()
    model.set_head_mask("decoder_self", 0, torch.tensor([1.0, 0.0, 1.0, 0.0]))
    model.set_head_mask("cross", 1, torch.tensor([0.0, 1.0, 1.0, 1.0]))
    full = model(src, tgt)
    memory = model.encode(src)
    cache = model.init_cache(memory, src.eq(PAD))
    steps = [model.decode(tgt[:, t : t + 1], cache=cache) for t in range(tgt.size(1))]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_masks_are_checked_and_never_saved() -> None:
    model = tiny_model(V)
    with pytest.raises(ValueError, match=r"head mask of shape \(3,\), need \(4,\)"):
        model.set_head_mask("cross", 0, torch.ones(3))
    with pytest.raises(ValueError, match="unknown attention type 'decoder'"):
        model.set_head_mask("decoder", 0, torch.ones(4))
    model.set_head_mask("encoder_self", 0, torch.zeros(4))
    assert not any("head_mask" in key for key in model.state_dict())
