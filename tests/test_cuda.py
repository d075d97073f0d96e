"""What only a GPU can show: attention kernels, decoding, torch.compile and the
training step on CUDA, in bf16, for each position encoding; target prefixes and constraints on
the GPU's decoding path. Skipped without a GPU; run them alone with ``pytest -m cuda``."""

from __future__ import annotations

import copy
from contextlib import nullcontext

import pytest
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from tests.decoding.test_decoding import BOS, EOS, PAD, random_model, sources, teacher_forced_score
from tests.tiny import lengths_to_pad_mask, padded_batch, tiny_model, tiny_model_config
from transformer import KVCache, MultiheadAttention
from transformer.decoding import DecodeOptions, beam_search, greedy_decode, sample
from transformer.decoding.sampling import streams, uniforms
from transformer.decoding.step import Stepper
from transformer.training import TranslationModule
from transformer.training.optim import build_optimizer
from transformer.training.step import hidden_states

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CUDA = torch.device("cuda")
FUSED = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
POSITIONS = ["sinusoidal", "learned", "rope", "relative"]


def assert_relatively_close(got: Tensor, want: Tensor, tol: float) -> None:
    """Within ``tol`` of ``want``'s norm: bf16 rounding that differs element by element."""
    error = (got.float() - want.float()).norm()
    assert error <= tol * want.float().norm() + 1e-6, f"relative error {error / want.norm():.3g}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])  # training; float32 decoding
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("padded", [False, True])
def test_every_attention_call_runs_a_fused_kernel(dtype, num_kv_heads: int, padded: bool):
    """Each role, MHA and grouped-query, runs flash, memory-efficient or cuDNN attention: with
    the math fallback excluded, a call that would need it raises "No available kernel"."""
    H, B, T, S = 4, 3, 13, 11  # head_dim 64; lengths that are not multiples of 8
    self_attn = MultiheadAttention(64 * H, H, num_kv_heads).to(CUDA, dtype)
    cross = MultiheadAttention(64 * H, H, num_kv_heads, cross=True).to(CUDA, dtype)
    src = torch.randn(B, S, 64 * H, device=CUDA, dtype=dtype, requires_grad=True)
    x = torch.randn(B, T, 64 * H, device=CUDA, dtype=dtype, requires_grad=True)
    src_pad = lengths_to_pad_mask([S, 7, 3], S).to(CUDA) if padded else None
    tgt_pad = lengths_to_pad_mask([T, 9, 4], T).to(CUDA) if padded else None
    with sdpa_kernel(FUSED):
        # Training: encoder self-attention, causal decoder self-attention (targets are
        # right-padded: no mask), cross-attention; forward and backward.
        outputs = [
            self_attn(src, key_padding_mask=src_pad)[0],
            self_attn(x, causal=True)[0],
            cross(x, src, key_padding_mask=src_pad)[0],
        ]
        sum(out.float().sum() for out in outputs).backward()
        # Decoding: cached steps of self- and cross-attention, then two beams a sentence.
        with torch.no_grad():
            self_cache, cross_cache = KVCache(), KVCache()
            self_attn(x[:, :-1], causal=True, cache=self_cache)
            self_attn(x[:, -1:], causal=True, cache=self_cache, key_padding_mask=tgt_pad)
            cross(x[:, -1:], src, key_padding_mask=src_pad, cache=cross_cache)
            beams = x[:, -1:].repeat_interleave(2, dim=0)  # (2B, 1, D): K/V stay (B, Hkv, S, Dh)
            cross(beams, key_padding_mask=src_pad, cache=cross_cache)
    torch.cuda.synchronize()


def test_bf16_decoding_on_cuda_scores_like_float32_on_cpu():
    """bf16 weights on the GPU (evaluate.py's dtype=bfloat16): each beam hypothesis scores what
    the float32 model on CPU gives it, and each greedy token is, for the float32 model, within
    bf16 rounding of the best one."""
    model, src = random_model(), sources()
    half = copy.deepcopy(model).to(CUDA, torch.bfloat16)
    options = DecodeOptions(beam_size=3, nbest=3, max_len_b=6, len_penalty=0.0)
    beams = beam_search(half, src.to(CUDA), options, bos_id=BOS, eos_id=EOS)
    for row, hyps in zip(src, beams, strict=True):
        assert hyps
        for h in hyps:
            exact = teacher_forced_score(model, row[row.ne(PAD)], h.tokens)
            assert h.score == pytest.approx(exact, abs=0.05 * (len(h.tokens) + 1))
    greedy = greedy_decode(half, src.to(CUDA), DecodeOptions(max_len_b=6), bos_id=BOS, eos_id=EOS)
    for row, (best,) in zip(src, greedy, strict=True):
        tokens = best.tokens
        with torch.no_grad():
            tgt = torch.tensor([[BOS, *tokens]])
            lprobs = model(row[row.ne(PAD)][None], tgt)[0, : len(tokens)].log_softmax(-1)
        lprobs[:, [PAD, BOS]] = float("-inf")
        lprobs[0, EOS] = float("-inf")  # min_len=1
        chosen = lprobs.gather(1, torch.tensor([tokens]).T).squeeze(1)  # (t,)
        assert (chosen >= lprobs.max(-1).values - 0.05).all()


def test_sampling_draws_the_numbers_of_the_cpu():
    """The hash behind sampling's draws is integer arithmetic: the GPU's numbers are the CPU's,
    bit for bit; a float32 model's samples then match wherever no draw falls on a boundary
    within the devices' rounding (all of them, for this model)."""
    sentences, samples = torch.arange(1000) * 7919, torch.arange(1000) % 3
    for t in (0, 5):
        cpu = uniforms(streams(11, sentences, samples), t)
        gpu = uniforms(streams(11, sentences.to(CUDA), samples.to(CUDA)), t)
        assert torch.equal(gpu.cpu(), cpu)
    model, src = random_model(), sources()
    options = DecodeOptions(strategy="sample", nbest=2, max_len_b=6, top_p=0.9, seed=2)
    cpu = sample(model, src, options, bos_id=BOS, eos_id=EOS)
    gpu = sample(copy.deepcopy(model).to(CUDA), src.to(CUDA), options, bos_id=BOS, eos_id=EOS)
    assert [[h.tokens for h in s] for s in gpu] == [[h.tokens for h in s] for s in cpu]


def test_compiled_forward_and_backward_equal_eager_on_unaligned_padded_batches():
    """torch.compile (inductor, dynamic shapes, as ``compile_model``) of the teacher-forced
    forward, bf16 autocast: the eager states and gradients, for padded lengths that are not
    multiples of 8 (the masks' rows are not 16-byte aligned), grouped-query attention included."""
    sizes = dict(d_model=128, num_heads=2, num_kv_heads=1, d_ff=256, dropout=0.0)
    layers = dict(num_encoder_layers=1, num_decoder_layers=1)  # compile time is per layer
    model = tiny_model(20, **sizes, **layers).to(CUDA)
    torch._dynamo.reset()
    compiled = torch.compile(hidden_states, dynamic=True, backend="inductor")
    shapes = [(12, 10), (5, 3), (9, 6)], [(6, 13), (2, 4)]  # (B, S, T): (3, 13, 11), (2, 7, 14)
    for lengths in shapes:
        batch = move_data_to_device(padded_batch(lengths), CUDA)
        results = []
        for forward in (compiled, hidden_states):
            model.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                hidden = forward(model, batch.src, batch.tgt_in, batch.src_pad_mask)  # (B, T, D)
            hidden.float().square().mean().backward()
            results.append([hidden, *(p.grad for p in model.parameters())])
        for got, want in zip(*results, strict=True):
            assert_relatively_close(got, want, 2e-2)


def test_training_step_never_waits_for_the_gpu():
    """Loss (fused, bf16 autocast), backward, gradient clipping and a fused AdamW step run with
    CUDA's sync debug mode set to error: any host synchronisation would raise."""
    cfg = tiny_model_config(20, d_model=128, num_heads=2, num_kv_heads=1, d_ff=256, dropout=0.1)
    module = TranslationModule(cfg).to(CUDA).train()
    optimizer = build_optimizer(module.model, torch.optim.AdamW, 0.0)
    assert optimizer.defaults["fused"]
    batch = move_data_to_device(padded_batch([(5, 2), (3, 9), (8, 4), (2, 6)]), CUDA)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _, n = module._loss(batch)
        (loss / n).backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up: the optimizer's state and the libraries' handles are made lazily
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_replays_give_the_eager_steps_logits(dtype, positions):
    """A cached step replayed from its CUDA graph (decode.graphs, on by default on a GPU) gives
    the log-probabilities of the same step run eagerly, at each batch size of a beam search:
    one row per sentence, the beams after their expansion, reordered in place, then a sentence
    leaving (a new size, a new graph); the step's position (rotary angles, the relative bias's
    row) moves on in the replayed graph as in the eager step."""
    model = random_model(positions=positions).to(CUDA, dtype)
    src = sources().to(CUDA)
    steppers = [Stepper(model, src, src.eq(PAD), steps=8, graphs=g) for g in (True, False)]
    graphed = steppers[0].graphs[0]
    tokens = torch.randint(4, 40, (4 * 2, 8), device=CUDA)
    tokens[:, 0] = BOS

    tol = 1e-5 if dtype == torch.float32 else 2e-2  # (the same kernels; cuBLAS may differ)

    def step(t: int, rows: torch.Tensor) -> None:
        got, want = (s.log_probs(tokens[rows, : t + 1]) for s in steppers)
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)

    with torch.no_grad():
        step(0, torch.arange(0, 8, 2, device=CUDA))  # one row per sentence: eager
        for s in steppers:
            s.expand_beams(2)
        rows = torch.arange(8, device=CUDA)
        for t in range(1, 4):  # the first step of a size runs eagerly, the next captures
            step(t, rows)
            assert (graphed.graph is not None) == (t > 1)
            order = torch.tensor([1, 0, 2, 2, 5, 4, 7, 6], device=CUDA)  # within sentences
            for s in steppers:
                s.reorder(order)
            tokens[rows] = tokens[rows][order]
        keep = torch.tensor([0, 1, 4, 5], device=CUDA)  # sentences 0 and 2 stay
        for s in steppers:
            s.reorder(keep, sentences=torch.tensor([0, 2], device=CUDA))
        assert graphed.graph is None
        for t in range(4, 7):
            step(t, keep)
        assert graphed.graph is not None


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_searches_decode_the_same_with_graphs_and_without(strategy, positions):
    """Greedy, beam search and sampling on a GPU with CUDA graphs (the default) and without:
    the same translations and scores, whatever the position encoding."""
    model = random_model(positions=positions).to(CUDA)
    src = sources().to(CUDA)
    options = {
        "greedy": dict(strategy="greedy", max_len_b=8),
        "beam": dict(beam_size=3, nbest=3, max_len_b=8),
        "sample": dict(strategy="sample", nbest=2, max_len_b=8, seed=5, top_k=10),
    }[strategy]
    search = {"greedy": greedy_decode, "beam": beam_search, "sample": sample}[strategy]
    ids = dict(bos_id=BOS, eos_id=EOS)
    graphed = search(model, src, DecodeOptions(**options, sync_every=2), **ids)
    eager = search(model, src, DecodeOptions(**options, sync_every=2, graphs=False), **ids)
    assert [[h.tokens for h in s] for s in graphed] == [[h.tokens for h in s] for s in eager]
    for a, b in zip(graphed, eager, strict=True):
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float32, 1e-4), (torch.bfloat16, 0.25)], ids=["float32", "bf16"]
)
def test_training_on_fused_kernels_gives_the_float32_cpu_gradients(dtype, tol, positions):
    """The teacher-forced forward and backward on the GPU with only fused attention kernels
    allowed (a relative bias is an additive mask: the memory-efficient kernel computes its
    gradient) give the states and every gradient of float32 on the CPU, the relative bias's and
    the learned table's included: in float32 to within the kernels' summation order, in bf16
    autocast to within its rounding (up to 12% of a gradient's norm on the CPU's bf16 path; a
    lost gradient is off by all of it, one of the wrong sign by twice)."""
    torch.manual_seed(0)
    sizes = dict(d_model=128, num_heads=2, num_kv_heads=1, d_ff=256, dropout=0.0)
    cpu = tiny_model(20, **sizes, positions=positions)
    gpu = copy.deepcopy(cpu).to(CUDA)
    batch = padded_batch([(12, 10), (5, 3), (9, 6)])
    weights = torch.randn(3, 11, 128)  # the loss: the states' projection on fixed weights
    results = []
    for model, device in ((cpu, "cpu"), (gpu, "cuda")):
        b = move_data_to_device(batch, device)
        on_gpu = device == "cuda"
        autocast = torch.autocast("cuda", dtype=dtype, enabled=on_gpu and dtype != torch.float32)
        with autocast, sdpa_kernel(FUSED) if on_gpu else nullcontext():
            hidden = hidden_states(model, b.src, b.tgt_in, b.src_pad_mask)  # (B, T, D)
            (hidden.float() * weights.to(hidden.device)).sum().backward()
        results.append([hidden, *(p.grad for p in model.parameters())])
    names = ["states", *(name for name, _ in cpu.named_parameters())]
    errors = {
        name: ((got.float().cpu() - want).norm() / (want.norm() + 1e-6)).item()
        for name, got, want in zip(names, *results[::-1], strict=True)
    }
    worst = max(errors, key=errors.get)
    assert errors[worst] <= tol, f"{worst}: relative error {errors[worst]:.3g}"


@pytest.mark.parametrize("positions", ["sinusoidal", "rope", "relative"])
def test_prefixes_and_constraints_decode_on_the_gpu_as_on_the_cpu(positions):
    """Target prefixes (greedy and beam search) and lexical constraints (beam search) on the
    GPU's path (a static cache, CUDA graphs, the host reading every few steps), float32: the
    CPU's translations and scores."""
    model, src = random_model(positions=positions), sources()
    gpu = copy.deepcopy(model).to(CUDA)
    prefixes = torch.tensor([[7, 8, PAD], [PAD, PAD, PAD], [9, PAD, PAD], [10, 11, 12]])
    phrases = [[[13, 14]], [], [[15]], [[16], [17, 18]]]
    ids = dict(bos_id=BOS, eos_id=EOS)
    runs = [
        (greedy_decode, dict(max_len_b=8), dict(target_prefix=prefixes)),
        (beam_search, dict(beam_size=3, nbest=3, max_len_b=8), dict(target_prefix=prefixes)),
        (beam_search, dict(beam_size=3, nbest=2, max_len_b=9), dict(constraints=phrases)),
    ]
    for search, options, extra in runs:
        on_cpu = search(model, src, DecodeOptions(**options), **ids, **extra)
        if "target_prefix" in extra:
            extra = dict(target_prefix=prefixes.to(CUDA))
        on_gpu = search(gpu, src.to(CUDA), DecodeOptions(**options, sync_every=3), **ids, **extra)
        assert [[h.tokens for h in s] for s in on_gpu] == [[h.tokens for h in s] for s in on_cpu]
        for a, b in zip(on_gpu, on_cpu, strict=True):
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-3)
