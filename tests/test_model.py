"""The encoder-decoder: causality, padding invariance, incremental decoding, attention capture."""

import pytest
import torch

import transformer.attend as attend
from tests.tiny import tiny_model
from transformer import AttentionMaps, DecoderCache, Transformer, TransformerConfig, kernels

PAD, V = 0, 50


def tokens(*shape: int) -> torch.Tensor:
    return torch.randint(4, V, shape)


VARIANTS = {
    "pre-norm": {},
    "post-norm": {"norm_first": False},
    "gqa": {"num_kv_heads": 2},
    "mqa-gelu": {"num_kv_heads": 1, "activation": "gelu"},
    "untied": {"tie_output_embeddings": False},
    "shared": {"share_all_embeddings": True},
    "opus-mt": {"norm_first": False, "activation": "silu", "output_bias": True},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_decoder_output_never_depends_on_future_targets(variant: str) -> None:
    model = tiny_model(V, **VARIANTS[variant])
    src, tgt = tokens(2, 7), tokens(2, 6)
    logits = model(src, tgt)
    for t in range(5):
        changed = tgt.clone()
        changed[:, t + 1 :] = tokens(2, 5 - t)
        torch.testing.assert_close(model(src, changed)[:, : t + 1], logits[:, : t + 1])


@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_never_changes_a_result(variant: str) -> None:
    model = tiny_model(V, **VARIANTS[variant])
    src, tgt = tokens(1, 5), tokens(1, 4)
    alone = model(src, tgt)
    # The same pair inside a batch whose other pair is longer on both sides: right padding.
    batch_src = torch.cat([torch.cat([src, torch.full((1, 4), PAD)], 1), tokens(1, 9)])
    batch_tgt = torch.cat([torch.cat([tgt, torch.full((1, 3), PAD)], 1), tokens(1, 7)])
    batched = model(batch_src, batch_tgt)
    torch.testing.assert_close(batched[:1, :4], alone, atol=1e-5, rtol=1e-5)
    # An explicit mask says the same as the default `src == pad_id`.
    torch.testing.assert_close(model(batch_src, batch_tgt, batch_src.eq(PAD)), batched)


def greedy_steps(model: Transformer, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """Feed `tgt` one token at a time through the cache; return every step's logits (B, T, V)."""
    memory = model.encode(src)
    cache = model.init_cache(memory, src.eq(PAD))
    return torch.cat([model.decode(tgt[:, t : t + 1], cache=cache) for t in range(tgt.size(1))], 1)


@pytest.mark.parametrize("variant", VARIANTS)
def test_incremental_decoding_equals_full_forward(variant: str) -> None:
    model = tiny_model(V, **VARIANTS[variant])
    src = torch.cat([tokens(3, 6), torch.full((3, 2), PAD)], 1)  # padded sources
    src[0, 6:] = tokens(2)
    tgt = tokens(3, 7)
    torch.testing.assert_close(greedy_steps(model, src, tgt), model(src, tgt), atol=1e-5, rtol=1e-5)


def test_reordered_cache_equals_recomputed_cache() -> None:
    model = tiny_model(V, num_kv_heads=2)
    src = torch.cat([tokens(3, 5), torch.full((3, 3), PAD)], 1)
    src[1, 5:] = tokens(3)
    tgt = tokens(3, 6)
    memory = model.encode(src)
    cache = model.init_cache(memory, src.eq(PAD))
    for t in range(3):
        model.decode(tgt[:, t : t + 1], cache=cache)
    order = torch.tensor([2, 0, 0, 1])  # beam search: survivors, one duplicated, one dropped
    cache.reorder(order)
    steps = [model.decode(tgt[order, t : t + 1], cache=cache) for t in range(3, 6)]
    recomputed = model(src[order], tgt[order])
    torch.testing.assert_close(torch.cat(steps, 1), recomputed[:, 3:], atol=1e-5, rtol=1e-5)
    assert cache.offset == 6


def test_beams_share_one_copy_of_the_cross_attention_cache() -> None:
    model = tiny_model(V, num_kv_heads=2)
    src = torch.cat([tokens(2, 5), torch.full((2, 3), PAD)], 1)
    src[1, 5:] = tokens(3)
    tgt = tokens(6, 5)  # 3 beams for each of the 2 sentences
    cache = model.init_cache(model.encode(src), src.eq(PAD))
    cache.expand_beams(3)
    for t in range(2):
        model.decode(tgt[:, t : t + 1], cache=cache)
    order = torch.tensor([2, 2, 0, 3, 5, 4])  # survivors stay within their sentence
    cache.reorder(order)
    maps = AttentionMaps()
    steps = [model.decode(tgt[order, t : t + 1], cache=cache, attention=maps) for t in range(2, 5)]
    recomputed = model(src.repeat_interleave(3, 0)[order], tgt[order])
    torch.testing.assert_close(torch.cat(steps, 1), recomputed[:, 2:], atol=1e-5, rtol=1e-5)
    assert cache.cross_attn[0].k.size(0) == 2  # one copy per sentence, never per beam
    assert maps.cross[0].shape == (6, 4, 1, 8)
    assert torch.all(maps.cross[0][:3, :, :, 5:] == 0)  # the first sentence's padding
    with pytest.raises(ValueError, match="expand_beams comes once"):
        cache.expand_beams(2)


def test_beams_after_a_first_step_and_a_sentence_leaving_the_batch() -> None:
    # Beam search's path: one row per sentence for the first step, then 2 beams each; later the
    # middle sentence is done and leaves, its rows and its cross-attention keys/values with it.
    model = tiny_model(V, num_kv_heads=2)
    src = torch.cat([tokens(3, 5), torch.full((3, 3), PAD)], 1)
    src[1, 5:] = tokens(3)
    tgt = tokens(6, 5)  # 2 beams for each of the 3 sentences, the same first token
    tgt[1::2, 0] = tgt[::2, 0]
    cache = model.init_cache(model.encode(src), src.eq(PAD))
    model.decode(tgt[::2, :1], cache=cache)
    cache.expand_beams(2)
    model.decode(tgt[:, 1:2], cache=cache)
    rows, sentences = torch.tensor([1, 1, 4, 5]), torch.tensor([0, 2])
    cache.reorder(rows, sentences)
    steps = [model.decode(tgt[rows, t : t + 1], cache=cache) for t in range(2, 5)]
    recomputed = model(src[[0, 0, 2, 2]], tgt[rows])
    torch.testing.assert_close(torch.cat(steps, 1), recomputed[:, 2:], atol=1e-5, rtol=1e-5)
    assert cache.cross_attn[0].k.size(0) == 2 and cache.cross_attn[0].bias.size(0) == 2


def beam_path(model: Transformer, src: torch.Tensor, tgt: torch.Tensor, cache: DecoderCache):
    """Beam search's path through a cache, as the test above: one row per sentence, then 2 beams
    each, reordered, the middle sentence leaving. Every step's logits, flattened; a static
    cache's position set before each step and the step counted after."""
    logits = []

    def step(tokens: torch.Tensor) -> torch.Tensor:
        if cache.static:
            cache.position.fill_(cache.offset)
        out = model.decode(tokens, cache=cache)
        if cache.static:
            cache.advance()
        return out

    logits.append(step(tgt[::2, :1]))
    cache.expand_beams(2)
    logits.append(step(tgt[:, 1:2]))
    cache.reorder(torch.tensor([1, 0, 3, 3, 4, 5]))  # beams within their sentences
    logits.append(step(tgt[[1, 0, 3, 3, 4, 5], 2:3]))
    cache.reorder(torch.tensor([1, 1, 4, 5]), torch.tensor([0, 2]))  # the middle one leaves
    logits += [step(tgt[[1, 1, 4, 5], t : t + 1]) for t in range(3, 5)]
    return torch.cat([x.flatten() for x in logits])


@pytest.mark.parametrize("gpu_paths", [False, True])
@pytest.mark.parametrize("pinned", [False, True])
def test_a_static_cache_steps_as_the_growing_cache(monkeypatch, gpu_paths, pinned) -> None:
    """A static cache (allocated once at its capacity, read whole behind a length mask, written
    at a device position; ``pinned``: reordered in place, as under CUDA graphs) gives every step
    the logits of the growing cache, through beams and a sentence leaving; on the CPU's kernels
    and on the GPU's (SDPA with additive masks), float64 to 1e-12."""
    if gpu_paths:
        monkeypatch.setattr(kernels, "cpu_kernels", lambda x: False)
    model = tiny_model(V, num_kv_heads=2).double()
    src = torch.cat([tokens(3, 5), torch.full((3, 3), PAD)], 1)
    src[1, 5:] = tokens(3)
    tgt = tokens(6, 5)
    with torch.no_grad():
        memory = model.encode(src)
        growing = beam_path(model, src, tgt, model.init_cache(memory, src.eq(PAD)))
        static = model.init_cache(memory, src.eq(PAD), capacity=8, static=True)
        static.pinned = pinned
        got = beam_path(model, src, tgt, static)
    torch.testing.assert_close(got, growing, rtol=1e-12, atol=1e-12)
    assert static.self_attn[0].k.shape == (4, 2, 8, 8)  # the whole capacity, every step
    assert static.offset == 5


@pytest.mark.parametrize("gpu_paths", [False, True])
def test_cached_steps_keep_the_models_precision(monkeypatch, gpu_paths: bool) -> None:
    """A float64 model decodes in float64, cached or not: its steps are the full forward's to
    1e-12 (attention computed in float32 would be 1e-7 off)."""
    if gpu_paths:
        monkeypatch.setattr(kernels, "cpu_kernels", lambda x: False)
    model = tiny_model(V, num_kv_heads=2).double()
    src = torch.cat([tokens(3, 6), torch.full((3, 2), PAD)], 1)
    tgt = tokens(3, 7)
    with torch.no_grad():
        torch.testing.assert_close(
            greedy_steps(model, src, tgt), model(src, tgt), rtol=1e-12, atol=1e-12
        )


def test_attention_maps_capture_every_layer_and_head() -> None:
    model = tiny_model(V)
    src = torch.cat([tokens(2, 5), torch.full((2, 2), PAD)], 1)
    tgt = tokens(2, 4)
    maps = AttentionMaps()
    logits = model(src, tgt, attention=maps)
    torch.testing.assert_close(logits, model(src, tgt), atol=1e-5, rtol=1e-5)
    assert [w.shape for w in maps.encoder_self] == [(2, 4, 7, 7)] * 2
    assert [w.shape for w in maps.decoder_self] == [(2, 4, 4, 4)] * 2
    assert [w.shape for w in maps.cross] == [(2, 4, 4, 7)] * 2
    for w in maps.encoder_self + maps.cross:
        assert torch.all(w[..., 5:] == 0)  # source padding gets no weight
    for w in maps.decoder_self:
        assert torch.equal(w, w.tril())
    for w in maps.encoder_self[:1] + maps.decoder_self + maps.cross:
        torch.testing.assert_close(w[:, :, :4].sum(-1), torch.ones(2, 4, 4))


def test_capture_off_never_takes_the_explicit_path(monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise AssertionError("explicit attention ran without weights being asked for")

    monkeypatch.setattr(attend, "explicit_attention", fail)
    model = tiny_model(V)
    src, tgt = tokens(2, 5), tokens(2, 4)
    model(src, tgt)
    greedy_steps(model, src, tgt)


def test_embedding_options() -> None:
    tied = tiny_model(V)
    assert tied.output.weight is tied.tgt_embed.tokens.weight
    assert tied.src_embed.tokens is not tied.tgt_embed.tokens
    untied = tiny_model(V, tie_output_embeddings=False)
    assert untied.output.weight is not untied.tgt_embed.tokens.weight
    shared = tiny_model(V, share_all_embeddings=True)
    assert shared.src_embed.tokens is shared.tgt_embed.tokens
    assert shared.output.weight is shared.src_embed.tokens.weight
    assert shared.num_parameters() < tied.num_parameters() < untied.num_parameters()
    with pytest.raises(ValueError, match="share_all_embeddings needs one joint vocabulary"):
        TransformerConfig(40, 50, share_all_embeddings=True)


def test_initialisation_scales_and_pad_row() -> None:
    model = tiny_model(V, d_model=256, num_heads=8, d_ff=1024)
    emb = model.src_embed.tokens.weight
    assert torch.all(emb[PAD] == 0)
    assert emb[1:].std().item() == pytest.approx(256**-0.5, rel=0.05)
    # Each of Q, K, V is Xavier-uniform as a (D, D) matrix: bound sqrt(6 / (2D)).
    qkv = model.encoder.layers[0].self_attn.qkv_proj.weight
    assert qkv.abs().max().item() <= (6 / 512) ** 0.5
    assert qkv.std().item() == pytest.approx((2 / 512) ** 0.5, rel=0.05)
    # The pad row gets no gradient through the lookup (tied, it would through the output layer).
    untied = tiny_model(V, tie_output_embeddings=False).train()
    untied(tokens(1, 5), torch.tensor([[5, 6, PAD]])).sum().backward()
    assert torch.all(untied.tgt_embed.tokens.weight.grad[PAD] == 0)


def test_positions_continue_from_the_cache_offset() -> None:
    model = tiny_model(V, max_positions=8)
    src, tgt = tokens(1, 3), tokens(1, 8)
    model(src, tgt)
    with pytest.raises(ValueError, match="beyond max_positions=8"):
        model(src, tokens(1, 9))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"d_model": 30}, "num_heads=4 does not divide d_model=30"),
        ({"num_kv_heads": 3}, "num_kv_heads=3 does not divide num_heads=4"),
        ({"dropout": 1.0}, "dropout must be in"),
        ({"num_decoder_layers": 0}, "num_decoder_layers must be >= 1"),
        ({"activation": "swish"}, "activation must be"),
        ({"pad_id": 50}, "pad_id=50 is outside src_vocab_size=50"),
    ],
)
def test_config_rejects_invalid_values(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tiny_model(V, **overrides)
