"""Multi-head attention against torch.nn.MultiheadAttention, and the invariants of its masks."""

import pytest
import torch
from torch import nn

import transformer.attend as attend
from tests.tiny import lengths_to_pad_mask
from transformer import KVCache, MultiheadAttention
from transformer.masks import attention_allowed, causal_allowed

B, T, S, D, H = 3, 6, 5, 32, 4


def torch_mha(ours: MultiheadAttention, kdim: int | None = None) -> nn.MultiheadAttention:
    """torch's module with our weights copied in."""
    mha = nn.MultiheadAttention(D, H, batch_first=True, kdim=kdim, vdim=kdim).eval()
    with torch.no_grad():
        if not ours.cross:
            mha.in_proj_weight.copy_(ours.qkv_proj.weight)
            mha.in_proj_bias.copy_(ours.qkv_proj.bias)
        elif kdim is None:
            mha.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.kv_proj.weight]))
            mha.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.kv_proj.bias]))
        else:
            k_w, v_w = ours.kv_proj.weight.chunk(2)
            mha.q_proj_weight.copy_(ours.q_proj.weight)
            mha.k_proj_weight.copy_(k_w)
            mha.v_proj_weight.copy_(v_w)
            mha.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.kv_proj.bias]))
        mha.out_proj.weight.copy_(ours.out_proj.weight)
        mha.out_proj.bias.copy_(ours.out_proj.bias)
    return mha


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("need_weights", [False, True])
def test_self_attention_matches_torch(causal: bool, padded: bool, need_weights: bool) -> None:
    ours = MultiheadAttention(D, H).eval()
    mha = torch_mha(ours)
    x = torch.randn(B, T, D)
    pad = lengths_to_pad_mask([T, 4, 2], T) if padded else None
    out, weights = ours(x, key_padding_mask=pad, causal=causal, need_weights=need_weights)
    attn_mask = ~causal_allowed(T, T) if causal else None  # torch: True = masked
    ref, ref_w = mha(x, x, x, key_padding_mask=pad, attn_mask=attn_mask, average_attn_weights=False)
    real = ~pad if padded else torch.ones(B, T, dtype=torch.bool)  # torch gives NaN-free rows only
    torch.testing.assert_close(out[real], ref[real], atol=1e-5, rtol=1e-5)
    if need_weights:
        torch.testing.assert_close(weights, ref_w, atol=1e-5, rtol=1e-5)
    else:
        assert weights is None


@pytest.mark.parametrize("kdim", [None, 48])
def test_cross_attention_matches_torch(kdim: int | None) -> None:
    ours = MultiheadAttention(D, H, cross=True, kv_dim=kdim).eval()
    mha = torch_mha(ours, kdim)
    x, memory = torch.randn(B, T, D), torch.randn(B, S, kdim or D)
    pad = lengths_to_pad_mask([S, 3, 1], S)
    out, weights = ours(x, memory, key_padding_mask=pad, need_weights=True)
    ref, ref_w = mha(x, memory, memory, key_padding_mask=pad, average_attn_weights=False)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, ref_w, atol=1e-5, rtol=1e-5)


def test_input_widths_other_than_d_model() -> None:
    # One seed projects 1024-wide inputs into a 512-wide model.
    attn = MultiheadAttention(512, 8, cross=True, q_dim=1024, kv_dim=768)
    out, _ = attn(torch.randn(2, 3, 1024), torch.randn(2, 4, 768))
    assert out.shape == (2, 3, 512)


@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_sdpa_path_equals_explicit_path(cross: bool, causal: bool, num_kv_heads: int) -> None:
    attn = MultiheadAttention(D, H, num_kv_heads, cross=cross).eval()
    x, memory = torch.randn(B, T, D), torch.randn(B, S, D) if cross else None
    tk = S if cross else T
    pad = lengths_to_pad_mask([tk, 3, 1], tk)
    fast, _ = attn(x, memory, key_padding_mask=pad, causal=causal)
    explicit, _ = attn(x, memory, key_padding_mask=pad, causal=causal, need_weights=True)
    torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=1e-5)


def test_float64_weights_path_keeps_float64_precision() -> None:
    """The weights-returning path takes its softmax in the input's precision when that is float32
    or wider (float32 only for bf16/fp16): a float64 model agrees with its sdpa path to float64
    rounding, and its weights rows sum to one in float64."""
    attn = MultiheadAttention(D, H).double().eval()
    x, pad = torch.randn(B, T, D, dtype=torch.float64), lengths_to_pad_mask([T, 3, 1], T)
    fast, _ = attn(x, key_padding_mask=pad, causal=True)
    explicit, weights = attn(x, key_padding_mask=pad, causal=True, need_weights=True)
    assert weights.dtype == torch.float64
    torch.testing.assert_close(explicit, fast, rtol=1e-12, atol=1e-12)
    ones = torch.ones(B, H, T, dtype=torch.float64)
    torch.testing.assert_close(weights.sum(-1), ones, rtol=0, atol=1e-13)


@pytest.mark.parametrize("autocast", [False, True])
def test_half_precision_decoding_step_on_cpu_runs_in_float32(autocast: bool) -> None:
    """bf16 inference on CPU (decoding, with bf16 weights or under bf16 autocast, which would
    cast float32 inputs back): float32 attention of those inputs, rounded once."""
    q = torch.randn(B, H, 1, D // H).bfloat16()
    k, v = (torch.randn(B, H, T, D // H).bfloat16() for _ in range(2))
    allowed = ~lengths_to_pad_mask([T, 3, 1], T)[:, None, None, :]  # (B, 1, 1, Tk)
    f32 = [t.float() for t in (q, k, v)]
    expected = nn.functional.scaled_dot_product_attention(*f32, attn_mask=allowed).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = attend.sdpa(q, k, v, attn_mask=allowed)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expected)


@pytest.mark.parametrize("causal", [False, True])
def test_half_precision_training_attention_on_cpu_matches_float32(causal: bool) -> None:
    """bf16 training on CPU (queries that need gradients) runs by hand in bf16 with a float32
    softmax: float32 attention of the same inputs within bf16 rounding, masks respected."""
    q, k, v = (torch.randn(B, H, T, D // H).bfloat16().requires_grad_() for _ in range(3))
    pad = lengths_to_pad_mask([T, 3, 1], T)[:, None, None, :]  # (B, 1, 1, Tk), True = padding
    allowed = ~pad & causal_allowed(T, T) if causal else ~pad
    f32 = [t.detach().float() for t in (q, k, v)]
    expected = nn.functional.scaled_dot_product_attention(*f32, attn_mask=allowed)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attend.sdpa(q, k, v, attn_mask=allowed)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.detach().float(), expected, atol=2e-2, rtol=2e-2)
    out.float().sum().backward()  # gradients flow to every input
    assert all(t.grad is not None and t.grad.isfinite().all() for t in (q, k, v))
    if causal:  # is_causal alone builds the same causal mask
        plain = attend.sdpa(q, k, v, is_causal=True)
        causal_only = nn.functional.scaled_dot_product_attention(*f32, is_causal=True)
        torch.testing.assert_close(plain.detach().float(), causal_only, atol=2e-2, rtol=2e-2)


def test_weights_rows_sum_to_one_masked_keys_zero_causal_lower_triangular() -> None:
    attn = MultiheadAttention(D, H).eval()
    pad = lengths_to_pad_mask([T, 4, 2], T)
    _, w = attn(torch.randn(B, T, D), key_padding_mask=pad, causal=True, need_weights=True)
    allowed = attention_allowed(pad, True, T, T).expand(B, H, T, T)
    assert torch.all(w[~allowed] == 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T))
    assert torch.equal(w, w.tril())


@pytest.mark.parametrize("need_weights", [False, True])
def test_query_with_every_key_masked_is_finite(need_weights: bool) -> None:
    attn = MultiheadAttention(D, H, cross=True)
    pad = lengths_to_pad_mask([S, 0, 2], S)  # the second memory is all padding
    x = torch.randn(B, T, D, requires_grad=True)
    out, _ = attn(x, torch.randn(B, S, D), key_padding_mask=pad, need_weights=need_weights)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("num_kv_heads", [2, 1])
def test_grouped_query_attention_equals_mha_with_shared_kv_heads(num_kv_heads: int) -> None:
    gqa = MultiheadAttention(D, H, num_kv_heads).eval()
    full = MultiheadAttention(D, H).eval()
    dh, group = D // H, H // num_kv_heads
    q_w, k_w, v_w = gqa.qkv_proj.weight.split([D, num_kv_heads * dh, num_kv_heads * dh])
    q_b, k_b, v_b = gqa.qkv_proj.bias.split([D, num_kv_heads * dh, num_kv_heads * dh])

    def per_query_head(t: torch.Tensor) -> torch.Tensor:  # each kv head serves `group` heads
        return t.reshape(num_kv_heads, dh, *t.shape[1:]).repeat_interleave(group, 0).flatten(0, 1)

    with torch.no_grad():
        full.qkv_proj.weight.copy_(torch.cat([q_w, per_query_head(k_w), per_query_head(v_w)]))
        full.qkv_proj.bias.copy_(torch.cat([q_b, per_query_head(k_b), per_query_head(v_b)]))
        full.out_proj.load_state_dict(gqa.out_proj.state_dict())
    x = torch.randn(B, T, D)
    for need_weights in (False, True):
        out, _ = gqa(x, causal=True, need_weights=need_weights)
        ref, _ = full(x, causal=True)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert gqa.qkv_proj.weight.shape[0] == D + 2 * num_kv_heads * dh


@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_self_attention_cache_equals_full_causal_forward(num_kv_heads: int) -> None:
    attn = MultiheadAttention(D, H, num_kv_heads).eval()
    x = torch.randn(B, T, D)
    full, _ = attn(x, causal=True)
    cache = KVCache()
    for t in range(T):
        step, _ = attn(x[:, t : t + 1], causal=True, cache=cache)
        torch.testing.assert_close(step[:, 0], full[:, t], atol=1e-5, rtol=1e-5)
    assert cache.length == T
    # Several new steps at once after a cached prefix see the prefix and, causally, each other.
    cache = KVCache()
    attn(x[:, :2], causal=True, cache=cache)
    for need_weights in (False, True):
        rest, _ = attn(
            x[:, 2:], causal=True, cache=KVCache(cache.k, cache.v), need_weights=need_weights
        )
        torch.testing.assert_close(rest, full[:, 2:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_a_cached_step_on_cpu_is_torch_attention_of_the_cache(monkeypatch, num_kv_heads) -> None:
    """A decoding step on CPU (one query per row, keys and values read where the cache holds
    them) computes torch's attention of the same tensors made contiguous: grouped heads, masked
    keys, the queries of several beams at once, bf16 in float32; and the module runs it."""
    k, v = (torch.randn(B, num_kv_heads, T, D // H) for _ in range(2))
    cache = KVCache(k, v)
    assert not cache.k.is_contiguous()  # the time-major buffer's strided view
    allowed = ~lengths_to_pad_mask([T, 3, 1], T)[:, None, None, :]  # (B, 1, 1, Tk)
    gqa = num_kv_heads != H
    for queries in (1, 5):  # one decoder row per sentence, or five beams' rows attending together
        q = torch.randn(B, H, queries, D // H)
        want = nn.functional.scaled_dot_product_attention(q, k, v, allowed, enable_gqa=gqa)
        got = attend.step_attention(q, cache.k, cache.v, allowed)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    half = attend.step_attention(q.bfloat16(), cache.k.bfloat16(), cache.v.bfloat16(), None)
    f32 = [t.bfloat16().float() for t in (q, k, v)]
    want = nn.functional.scaled_dot_product_attention(*f32, enable_gqa=gqa)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), want, atol=1e-2, rtol=1e-2)

    calls = []
    real = attend.step_attention
    monkeypatch.setattr(attend, "step_attention", lambda *a: calls.append(1) or real(*a))
    attn = MultiheadAttention(D, H, num_kv_heads).eval()
    step_cache = KVCache()
    attn(torch.randn(B, 2, D), causal=True, cache=step_cache)  # a prefix: SDPA
    assert not calls
    attn(torch.randn(B, 1, D), causal=True, cache=step_cache)  # a step
    assert calls == [1]


def test_cross_attention_cache_projects_memory_once() -> None:
    attn = MultiheadAttention(D, H, cross=True).eval()
    memory, x = torch.randn(B, S, D), torch.randn(B, T, D)
    calls = []
    attn.kv_proj.register_forward_hook(lambda *_: calls.append(1))
    full, _ = attn(x, memory)
    cache = KVCache()
    steps = [attn(x[:, t : t + 1], memory if t == 0 else None, cache=cache)[0] for t in range(T)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    assert len(calls) == 2  # once for the full forward, once for all cached steps


def test_cache_reorder_selects_batch_rows() -> None:
    k, v = torch.randn(3, 2, 4, 8), torch.randn(3, 2, 4, 8)
    cache = KVCache(k, v)
    cache.reorder(torch.tensor([2, 2, 0]))
    assert torch.equal(cache.k, k[[2, 2, 0]]) and torch.equal(cache.v, v[[2, 2, 0]])


def test_sdpa_is_the_default_and_explicit_path_only_runs_for_weights(monkeypatch) -> None:
    attn = MultiheadAttention(D, H)
    calls = []
    real = attend.explicit_attention
    monkeypatch.setattr(
        attend, "explicit_attention", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    attn(torch.randn(B, T, D), causal=True)
    assert not calls
    attn(torch.randn(B, T, D), causal=True, need_weights=True)
    assert calls


@pytest.mark.parametrize(
    ("d_model", "heads", "kv_heads", "message"),
    [
        (30, 4, None, "num_heads=4 does not divide d_model=30"),
        (32, 4, 3, "num_kv_heads=3 does not divide num_heads=4"),
    ],
)
def test_invalid_head_counts_raise(d_model: int, heads: int, kv_heads, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MultiheadAttention(d_model, heads, kv_heads)


@pytest.mark.parametrize(
    ("device", "dtype", "head_dim", "masked", "fused"),
    [
        ("cpu", torch.float32, 64, True, True),  # CPU's fused kernel takes grouped heads and masks
        ("cpu", torch.bfloat16, 512, False, True),
        ("cuda", torch.bfloat16, 64, False, True),  # flash: no mask, half precision
        ("cuda", torch.float16, 256, False, True),
        ("cuda", torch.bfloat16, 64, True, False),  # a mask: memory-efficient, equal heads
        ("cuda", torch.float32, 64, False, False),  # float32: memory-efficient
        ("cuda", torch.bfloat16, 512, False, False),  # head_dim > 256: memory-efficient
    ],
)
def test_grouped_heads_go_to_sdpa_only_where_a_fused_kernel_takes_them(
    device: str, dtype: torch.dtype, head_dim: int, masked: bool, fused: bool
) -> None:
    assert attend.fused_gqa(device, dtype, head_dim, masked) is fused


def test_repeat_heads_is_repeat_interleave() -> None:
    k = torch.randn(B, 2, T, D // H)
    assert torch.equal(attend.repeat_heads(k, H), k.repeat_interleave(H // 2, dim=1))
    assert attend.repeat_heads(k, 2) is k


@pytest.mark.parametrize("num_kv_heads", [2, 1])
def test_repeated_kv_heads_give_what_grouped_heads_give(monkeypatch, num_kv_heads: int) -> None:
    """The path CUDA takes for masked or float32 grouped-query attention (K/V repeated to the
    query heads, no enable_gqa), run on CPU: the same outputs in every role."""
    self_attn = MultiheadAttention(D, H, num_kv_heads).eval()
    cross = MultiheadAttention(D, H, num_kv_heads, cross=True).eval()
    x, memory = torch.randn(B, T, D), torch.randn(B, S, D)
    pad = lengths_to_pad_mask([S, 3, 1], S)

    def outputs() -> list[torch.Tensor]:
        cache = KVCache()
        self_attn(x[:, :-1], causal=True, cache=cache)
        return [
            self_attn(x, key_padding_mask=lengths_to_pad_mask([T, 4, 2], T))[0],  # encoder
            self_attn(x, causal=True)[0],  # decoder in training
            cross(x, memory, key_padding_mask=pad)[0],
            self_attn(x[:, -1:], causal=True, cache=cache)[0],  # a cached step
        ]

    grouped = outputs()
    calls = []
    real = attend.repeat_heads
    monkeypatch.setattr(attend, "fused_gqa", lambda *args: False)
    monkeypatch.setattr(attend, "repeat_heads", lambda *a: calls.append(1) or real(*a))
    repeated = outputs()
    assert (
        len(calls) == 2 * 4
    )  # k and v of each SDPA call (on CPU a cached step runs step_attention)
    for got, want in zip(repeated, grouped, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
