"""Decoding: beam hypotheses from a scripted decoder; greedy, beam, sampling, cached, uncached,
one model and ensembles agree with brute force and with each other."""

import copy
import math
from collections import Counter

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from tests.test_learning import reversal_batch, reversing_model
from tests.tiny import tiny_model
from transformer import Transformer, TransformerConfig, kernels
from transformer.decoding import (
    DecodeOptions,
    beam_search,
    greedy_decode,
    max_output_lengths,
    sample,
)
from transformer.decoding.runtime import batch_size
from transformer.decoding.sampling import mix64, streams, uniforms

PAD, BOS, EOS, A, B, C = 0, 2, 3, 4, 5, 6
V = 7


class ScriptedCache:
    """Tracks each row's generated tokens; reordered like the real cache."""

    static = False

    def __init__(self, rows: int) -> None:
        self.prefixes: list[tuple[int, ...]] = [()] * rows
        self.offset = 0

    def expand_beams(self, k: int) -> None:
        self.prefixes = [p for p in self.prefixes for _ in range(k)]

    def reorder(self, index: torch.Tensor, sentences: torch.Tensor | None = None) -> None:
        self.prefixes = [self.prefixes[i] for i in index.tolist()]


class ScriptedModel(nn.Module):
    """A decoder whose next-token distribution is written by hand for each prefix.

    Prefixes missing from the script end at once (eos with probability 1).
    """

    def __init__(self, script: dict[tuple[int, ...], dict[int, float]]) -> None:
        super().__init__()
        self.script = script
        self.cfg = TransformerConfig(V, V, d_model=8, num_heads=1, pad_id=PAD)

    def encode(self, src, src_pad_mask=None):
        return torch.zeros(src.size(0), 1)

    def init_cache(self, memory, memory_pad_mask, capacity=None, static=False):
        return ScriptedCache(memory.size(0))

    def decode(self, tokens, cache):
        if cache.offset:
            cache.prefixes = [
                p + (t,) for p, t in zip(cache.prefixes, tokens[:, 0].tolist(), strict=True)
            ]
        cache.offset += 1
        probs = torch.full((tokens.size(0), V), 1e-12)
        for row, prefix in enumerate(cache.prefixes):
            for token, p in self.script.get(prefix, {EOS: 1.0}).items():
                probs[row, token] = p
        return probs.log().unsqueeze(1)  # (N, 1, V)


def search(script, **kwargs):
    src = torch.tensor([[A, B, C]])
    options = DecodeOptions(**kwargs)
    return beam_search(ScriptedModel(script), src, options, bos_id=BOS, eos_id=EOS)[0]


def test_beam_finds_the_likelier_translation_that_greedy_misses() -> None:
    script = {(): {A: 0.6, B: 0.4}, (A,): {EOS: 0.4, A: 0.3, B: 0.3}, (B,): {EOS: 0.9, A: 0.1}}
    greedy = search(script, beam_size=1)
    assert [h.tokens for h in greedy] == [[A]]
    beam = search(script, beam_size=2, nbest=2, len_penalty=0.0)
    assert [h.tokens for h in beam] == [[B], [A]]
    assert [h.score for h in beam] == pytest.approx([math.log(0.36), math.log(0.24)], abs=1e-6)


@pytest.mark.parametrize(("len_penalty", "expected"), [(0.0, [[A], [B, C]]), (1.0, [[B, C], [A]])])
def test_length_penalty_orders_finished_hypotheses(len_penalty: float, expected) -> None:
    # "A" has probability 0.55 over 2 tokens (with eos); "B C" 0.45 over 3.
    script = {(): {A: 0.55, B: 0.45}, (A,): {EOS: 1.0}, (B,): {C: 1.0}, (B, C): {EOS: 1.0}}
    hyps = search(script, beam_size=2, nbest=2, len_penalty=len_penalty)
    assert [h.tokens for h in hyps] == expected
    scores = {(A,): math.log(0.55) / 2**len_penalty, (B, C): math.log(0.45) / 3**len_penalty}
    assert [h.score for h in hyps] == pytest.approx([scores[tuple(t)] for t in expected], abs=1e-6)


def test_min_and_max_length() -> None:
    # Raw probabilities: "A" 0.33, "A A" 0.027, "A A A" 0.243, "B" 0.2, "B B" 0.2.
    script = {
        (): {A: 0.6, B: 0.4},
        (A,): {EOS: 0.55, A: 0.45},
        (B,): {EOS: 0.5, B: 0.5},
        (A, A): {EOS: 0.1, A: 0.9},
    }
    options = dict(beam_size=2, nbest=2, len_penalty=0.0)
    assert [h.tokens for h in search(script, **options)] == [[A], [B, B]]
    assert [h.tokens for h in search(script, min_len=2, **options)] == [[A, A, A], [B, B]]
    # At most 1 token: every beam's eos is forced, at its own log-probability.
    forced = search(script, max_len_a=0.0, max_len_b=1, **options)
    assert [h.tokens for h in forced] == [[A], [B]]
    assert [h.score for h in forced] == pytest.approx([math.log(0.33), math.log(0.2)], abs=1e-6)
    endless = {(A,) * n: {A: 0.9, EOS: 0.1} for n in range(20)}
    longest = search(endless, beam_size=1, max_len_a=2.0, max_len_b=1)  # 2 * 3 source + 1
    assert [len(h.tokens) for h in longest] == [7]


def test_no_repeat_ngram() -> None:
    script = {
        (): {A: 0.9, B: 0.1},
        (A,): {B: 0.9, A: 0.1},
        (A, B): {A: 0.9, EOS: 0.1},
        (A, B, A): {B: 0.9, EOS: 0.1},
    }
    assert [h.tokens for h in search(script, beam_size=1)] == [[A, B, A, B]]
    assert [h.tokens for h in search(script, beam_size=1, no_repeat_ngram_size=1)] == [[A, B]]
    assert [h.tokens for h in search(script, beam_size=1, no_repeat_ngram_size=2)] == [[A, B, A]]


def test_invalid_options_raise() -> None:
    with pytest.raises(ValueError, match="nbest=3 must be between 1 and beam_size=2"):
        search({}, beam_size=2, nbest=3)
    cases = [
        (dict(top_k=5), r"decode\.top_k=5 is a sampling option; set decode\.strategy=sample"),
        (dict(strategy="greedy", seed=1), r"decode\.seed=1 is a sampling option"),
        (dict(strategy="sample", temperature=0), r"decode\.temperature must be > 0"),
        (dict(strategy="sample", top_p=0.0), r"decode\.top_p must be in \(0, 1\]"),
        (dict(strategy="sample", top_k=-1), r"decode\.top_k must be >= 0"),
        (dict(strategy="greedy", nbest=2), r"set decode\.strategy=beam \(or sample"),
        (dict(alignment="yes"), r"decode\.alignment must be true or false"),
        (dict(alignment_head=-1), r"decode\.alignment_head must be a head index >= 0 or null"),
        (dict(strategy="top"), r"decode\.strategy='top'; choose one of 'greedy' or 'beam' or"),
        (dict(graphs="yes"), r"decode\.graphs must be true, false or null"),
        (dict(sync_every=-1), r"decode\.sync_every must be >= 0"),
    ]
    for options, message in cases:
        with pytest.raises(ValueError, match=message):
            DecodeOptions(**options)
    assert DecodeOptions(strategy="sample", nbest=8, beam_size=2).nbest == 8  # samples, not beams


# A real (untrained) model: agreement between decoding paths.


def random_model(**overrides) -> Transformer:
    return tiny_model(40, num_kv_heads=2, share_all_embeddings=True, **overrides)


def sources() -> torch.Tensor:
    src = torch.randint(4, 40, (4, 7))
    src[1, 5:] = PAD
    src[3, 2:] = PAD
    return src


def brute_force_greedy(
    model: Transformer | list[Transformer], src: torch.Tensor, max_len: int, min_len: int
) -> list[list[int]]:
    """Re-run the full model on the whole prefix at every step, one sentence at a time; for a
    list of models, the log of the mean of their probabilities."""
    models = model if isinstance(model, list) else [model]
    out = []
    for row in src:
        row = row[row.ne(PAD)].unsqueeze(0)
        prefix = [BOS]
        while True:
            probs = [m(row, torch.tensor([prefix]))[0, -1].softmax(-1) for m in models]
            logits = (sum(probs) / len(probs)).log()
            logits[[PAD, BOS]] = float("-inf")
            if len(prefix) - 1 < min_len:
                logits[EOS] = float("-inf")
            if len(prefix) - 1 == max_len or int(logits.argmax()) == EOS:
                break
            prefix.append(int(logits.argmax()))
        out.append(prefix[1:])
    return out


@pytest.mark.parametrize("min_len", [0, 3])
def test_greedy_equals_brute_force_and_beam_size_one(min_len: int) -> None:
    model, src = random_model().train(), sources()
    limits = dict(max_len_a=0.5, max_len_b=4, min_len=min_len)
    out = greedy_decode(model, src, DecodeOptions(**limits), bos_id=BOS, eos_id=EOS)
    assert model.training  # decoding ran in eval mode and restored the mode
    model.eval()
    greedy = [h[0].tokens for h in out]
    lengths = max_output_lengths(src.ne(PAD).sum(1), 0.5, 4, min_len, cap=1000).tolist()
    assert greedy == [
        brute_force_greedy(model, src[i : i + 1], lengths[i], min_len)[0] for i in range(len(src))
    ]
    beam = beam_search(model, src, DecodeOptions(beam_size=1, **limits), bos_id=BOS, eos_id=EOS)
    assert [h[0].tokens for h in beam] == greedy


def test_max_output_lengths() -> None:
    lengths = max_output_lengths(torch.tensor([0, 5, 100]), 1.2, 10, min_len=1, cap=50)
    assert lengths.tolist() == [10, 16, 50]
    assert max_output_lengths(torch.tensor([0]), 0.0, 0, min_len=3, cap=50).tolist() == [3]


def test_cached_equals_uncached_and_batched_equals_alone() -> None:
    model, src = random_model(), sources()
    options, ids = DecodeOptions(beam_size=4, nbest=4, max_len_b=8), dict(bos_id=BOS, eos_id=EOS)
    cached = beam_search(model, src, options, **ids)
    uncached = beam_search(model, src, options, **ids, use_cache=False)
    for a, b in zip(cached, uncached, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)
    for i, row in enumerate(src):
        alone = beam_search(model, row[row.ne(PAD)].unsqueeze(0), options, **ids)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in cached[i]]


def test_per_sentence_max_lengths_equal_each_sentence_decoded_alone() -> None:
    model, src = random_model(), sources()
    lengths = torch.tensor([2, 6, 0, 4])
    ids = dict(bos_id=BOS, eos_id=EOS)
    beam = beam_search(
        model, src, DecodeOptions(beam_size=3, min_len=0), **ids, max_lengths=lengths
    )
    greedy = greedy_decode(model, src, DecodeOptions(min_len=0), **ids, max_lengths=lengths)
    for i, row in enumerate(src):
        alone = dict(min_len=0, max_len_a=0.0, max_len_b=int(lengths[i]))
        row = row[row.ne(PAD)].unsqueeze(0)
        expected = beam_search(model, row, DecodeOptions(beam_size=3, **alone), **ids)[0]
        assert [h.tokens for h in beam[i]] == [h.tokens for h in expected]
        assert len(beam[i][0].tokens) <= lengths[i]
        (alone_greedy,) = greedy_decode(model, row, DecodeOptions(**alone), **ids)
        assert greedy[i][0].tokens == alone_greedy[0].tokens


@torch.no_grad()
def teacher_forced_score(model: Transformer, src: torch.Tensor, tokens: list[int]) -> float:
    """Sum of the log-probabilities of ``tokens`` then eos, given one unpadded source row."""
    tgt = torch.tensor([[BOS, *tokens]])
    lprobs = model(src.unsqueeze(0), tgt)[0].float().log_softmax(-1)  # (t + 1, V)
    return float(lprobs.gather(1, torch.tensor([[*tokens, EOS]]).T).sum())


def test_bfloat16_weights_search_like_float32() -> None:
    """bf16 weights: the cached search equals the uncached one, and each hypothesis' score is
    what the float32 model gives it, within bf16 rounding."""
    model, src = random_model(), sources()
    half = copy.deepcopy(model).bfloat16()
    options = DecodeOptions(beam_size=3, nbest=3, max_len_b=6, len_penalty=0.0)
    cached = beam_search(half, src, options, bos_id=BOS, eos_id=EOS)
    uncached = beam_search(half, src, options, bos_id=BOS, eos_id=EOS, use_cache=False)
    assert [[h.tokens for h in s] for s in cached] == [[h.tokens for h in s] for s in uncached]
    for row, hyps in zip(src, cached, strict=True):
        row = row[row.ne(PAD)]
        for h in hyps:
            exact = teacher_forced_score(model, row, h.tokens)
            assert h.score == pytest.approx(exact, abs=0.05 * (len(h.tokens) + 1))


class DeviceTraffic(TorchDispatchMode):
    """Counts the ops that on a GPU wait for it or copy from the host: ``reads`` of a device
    value (``item``, ``bool``, ``int``); ops ``sized_by_device`` (``nonzero``, boolean-mask
    indexing); tensors made ``from_host`` data (``torch.tensor``, a list index). And ``steps``:
    one log-softmax each."""

    def __init__(self) -> None:
        super().__init__()
        self.counts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        indices = args[1] if name in ("index", "index_put_") else []
        if name == "_local_scalar_dense":
            self.counts["reads"] += 1
        elif name == "nonzero" or any(i is not None and i.dtype == torch.bool for i in indices):
            self.counts["sized_by_device"] += 1
        elif name in ("lift_fresh", "lift_fresh_copy"):
            self.counts["from_host"] += 1
        elif name == "_log_softmax":
            self.counts["steps"] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_decoding_reads_the_device_once_a_step_and_copies_nothing_from_the_host(strategy):
    """The one sync of a step reads how many sentences are done; the ids it bans are tensors made
    once; sampling's random numbers are made on the device. Counted on CPU, through the ops that
    a GPU would run."""
    model, src = random_model(), sources()
    limits = dict(bos_id=BOS, eos_id=EOS, max_lengths=torch.tensor([4, 5, 6, 7]))
    search = {"greedy": greedy_decode, "beam": beam_search, "sample": sample}[strategy]
    options = DecodeOptions(strategy=strategy, beam_size=3, min_len=4)
    with DeviceTraffic() as traffic:
        out = [h[0].tokens for h in search(model, src, options, **limits)]
    assert len({len(tokens) for tokens in out}) > 1  # sentences left the batch at different steps
    counts = traffic.counts
    assert counts["steps"] >= 5
    assert counts["reads"] == counts["steps"] + 1  # + the longest output, before the loop
    assert counts["sized_by_device"] == 0
    assert counts["from_host"] == 2  # the banned ids, once


class Kernels(TorchDispatchMode):
    """The kernels an eager run launches, in order: every op but views, allocations without
    data, and the device reads that ``DeviceTraffic`` counts."""

    NOT_KERNELS = {"empty", "empty_strided", "detach", "_unsafe_view", "_local_scalar_dense"}

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not func.is_view and name not in self.NOT_KERNELS:
            self.ops.append(name)
        return func(*args, **(kwargs or {}))

    def per_step(self) -> list[int]:
        """Kernels from one step's log-softmax to the next's: a decoder step, its cache writes
        and reorder, the search's bookkeeping."""
        steps = [i for i, op in enumerate(self.ops) if op == "_log_softmax"]
        return [b - a for a, b in zip(steps[:-1], steps[1:], strict=True)]


def test_a_beam_step_of_the_base_decoder_launches_at_most_150_kernels(monkeypatch) -> None:
    """Each step of beam search (beam 5) with the base model's 6 decoder layers (narrower), as a
    GPU runs it: CPU tensors sent down the GPU paths (``transformer.kernels``: F.linear, SDPA,
    the static cache, a read every 8 steps), eager, which is what a CUDA graph replays. Before
    the static cache and its masks built once, 187-206."""
    monkeypatch.setattr(kernels, "cpu_kernels", lambda x: False)
    cfg = TransformerConfig(
        60, 60, d_model=64, num_heads=8, num_encoder_layers=1, num_decoder_layers=6, d_ff=128
    )
    model = Transformer(cfg).eval()
    src = torch.randint(4, 60, (4, 9))
    src[1, 5:] = PAD
    options = DecodeOptions(beam_size=5, min_len=12, max_len_a=0.0, max_len_b=12)
    with Kernels() as kernels_launched:
        beam_search(model, src, options, bos_id=BOS, eos_id=EOS)
    per_step = kernels_launched.per_step()
    assert len(per_step) == 12
    assert max(per_step) <= 150, per_step


def test_batch_sizes_come_from_a_short_ladder() -> None:
    assert [batch_size(n, 1) for n in (1, 13, 273)] == [1, 13, 273]  # read every step: exact
    assert [batch_size(n, 8) for n in range(1, 9)] == list(range(1, 9))
    ladder = sorted({batch_size(n, 8) for n in range(1, 1025)})
    assert ladder[8:20] == [10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64]
    assert len(ladder) == 36
    assert all(n <= batch_size(n, 8) < 1.25 * n for n in range(9, 1025))


@pytest.fixture(scope="module")
def trained() -> tuple[Transformer, torch.Tensor]:
    """A tiny model halfway through learning to reverse sequences (tests/test_learning.py), and
    23 sources: its translations end at different steps, some right, some not."""
    src, _, _ = reversal_batch(23, torch.Generator().manual_seed(2))
    return reversing_model(80), src


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_the_gpu_path_decodes_what_the_cpu_path_decodes(monkeypatch, trained, strategy) -> None:
    """The GPU's path without graphs (a static cache read behind a length mask; done sentences
    frozen until the host reads, every 3 steps; batches of the ladder's sizes with padding
    sentences), run on CPU tensors, gives the CPU path's translations and scores, which are the
    uncached decoder's, on a trained model."""
    model, src = trained
    sizes = dict(beam_size=4, nbest=3) if strategy == "beam" else {}
    if strategy == "sample":
        sizes = dict(nbest=2, seed=3, top_k=5)
    limits = dict(strategy=strategy, max_len_a=1.0, max_len_b=2, **sizes)
    cpu_tokens, cpu_scores = decode_all(model, src, DecodeOptions(**limits))
    uncached_tokens, uncached_scores = decode_all(
        model, src, DecodeOptions(**limits), use_cache=False
    )
    assert cpu_tokens == uncached_tokens
    assert flat(cpu_scores) == pytest.approx(flat(uncached_scores), abs=1e-5)
    assert len({len(t[0]) for t in cpu_tokens}) >= 4  # sentences end at different steps
    monkeypatch.setattr(kernels, "cpu_kernels", lambda x: False)
    gpu_tokens, gpu_scores = decode_all(model, src, DecodeOptions(**limits, sync_every=3))
    assert gpu_tokens == cpu_tokens
    assert flat(gpu_scores) == pytest.approx(flat(cpu_scores), abs=1e-5)


def flat(scores: list[list[float]]) -> list[float]:
    return [score for sentence in scores for score in sentence]


@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_off_the_cpu_the_host_reads_the_device_every_8_steps(monkeypatch, strategy):
    """On the GPU's path the one device read (how many sentences are done) comes at the first
    step, every 8th and the last (the last sentence done); still no host data in the loop."""
    monkeypatch.setattr(kernels, "cpu_kernels", lambda x: False)
    model, src = random_model(), sources()
    limits = dict(bos_id=BOS, eos_id=EOS, max_lengths=torch.tensor([3, 9, 12, 20]))
    search = {"greedy": greedy_decode, "beam": beam_search, "sample": sample}[strategy]
    with DeviceTraffic() as traffic:
        out = [h[0].tokens for h in search(model, src, DecodeOptions(strategy), **limits)]
    assert len({len(tokens) for tokens in out}) > 1  # sentences left the batch
    steps = traffic.counts["steps"]
    assert steps > 8
    read_at = {0, steps - 1} | {t for t in range(steps) if (t + 1) % 8 == 0}
    assert traffic.counts["reads"] == len(read_at) + 1  # + the longest output, before the loop
    assert traffic.counts["sized_by_device"] == 0
    assert traffic.counts["from_host"] == 2  # the banned ids, once


# Greedy scores; ensembles.


@pytest.mark.parametrize("len_penalty", [0.0, 1.0])
def test_greedy_scores_are_teacher_forced_log_probabilities(len_penalty: float) -> None:
    model, src = random_model(), sources()
    limits = dict(max_len_b=6, len_penalty=len_penalty)
    greedy = greedy_decode(model, src, DecodeOptions("greedy", **limits), bos_id=BOS, eos_id=EOS)
    for row, (h,) in zip(src, greedy, strict=True):
        exact = teacher_forced_score(model, row[row.ne(PAD)], h.tokens)
        assert h.score == pytest.approx(exact / (len(h.tokens) + 1) ** len_penalty, abs=1e-4)
    beam = beam_search(model, src, DecodeOptions(beam_size=1, **limits), bos_id=BOS, eos_id=EOS)
    assert [h[0].score for h in beam] == pytest.approx([h[0].score for h in greedy], abs=1e-5)


def decode_all(models, src, options: DecodeOptions, **kwargs):
    search = {"greedy": greedy_decode, "beam": beam_search, "sample": sample}[options.strategy]
    hyps = search(models, src, options, bos_id=BOS, eos_id=EOS, **kwargs)
    return [[h.tokens for h in s] for s in hyps], [[h.score for h in s] for s in hyps]


ALL_STRATEGIES = [
    DecodeOptions(strategy="greedy", max_len_b=8),
    DecodeOptions(beam_size=3, nbest=3, max_len_b=8),
    DecodeOptions(strategy="sample", nbest=2, max_len_b=8, seed=5, top_k=10),
]


@pytest.mark.parametrize("options", ALL_STRATEGIES, ids=["greedy", "beam", "sample"])
def test_an_ensemble_of_one_model_or_of_copies_of_it_decodes_as_the_model(options) -> None:
    model, src = random_model(), sources()
    tokens, scores = decode_all(model, src, options)
    assert decode_all([model], src, options) == (tokens, scores)
    copies_tokens, copies_scores = decode_all([model, copy.deepcopy(model)], src, options)
    assert copies_tokens == tokens
    assert copies_scores == [pytest.approx(s, abs=1e-5) for s in scores]


@pytest.mark.slow
def test_an_ensemble_of_two_models_decodes_their_mean_probabilities() -> None:
    torch.manual_seed(1)
    models, src = [random_model(), random_model()], sources()
    limits = dict(max_len_a=0.5, max_len_b=4, min_len=1)
    greedy = decode_all(models, src, DecodeOptions(strategy="greedy", **limits))[0]
    lengths = max_output_lengths(src.ne(PAD).sum(1), 0.5, 4, 1, cap=1000).tolist()
    assert [s[0] for s in greedy] == [
        brute_force_greedy(models, src[i : i + 1], lengths[i], 1)[0] for i in range(len(src))
    ]
    assert greedy != decode_all(models[0], src, DecodeOptions(strategy="greedy", **limits))[0]
    beam = DecodeOptions(beam_size=3, nbest=2, **limits)
    cached, uncached = decode_all(models, src, beam), decode_all(models, src, beam, use_cache=False)
    assert cached[0] == uncached[0]
    assert cached[1] == [pytest.approx(s, abs=1e-4) for s in uncached[1]]
    with pytest.raises(ValueError, match="one target vocabulary"):
        greedy_decode([models[0], tiny_model(41)], src, DecodeOptions(), bos_id=BOS, eos_id=EOS)


# Sampling.


def splitmix64_finaliser(x: int) -> int:
    """The reference, on Python's unbounded integers."""
    mask = (1 << 64) - 1
    x &= mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


def test_the_hash_is_splitmix64_and_its_numbers_look_uniform() -> None:
    xs = [0, 1, 2, 12345, -5, 2**62, -(2**63), 2**63 - 1]
    expected = [splitmix64_finaliser(x) for x in xs]
    assert [x & ((1 << 64) - 1) for x in mix64(torch.tensor(xs)).tolist()] == expected
    n = 100_000
    u = uniforms(streams(0, torch.arange(n), torch.zeros(n, dtype=torch.long)), t=3)
    assert 0 <= float(u.min()) and float(u.max()) < 1
    counts = torch.histc(u.float(), bins=20, min=0, max=1)
    assert chi_square(counts, torch.full((20,), n / 20)) < chi_square_limit(19)


def chi_square(observed: torch.Tensor, expected: torch.Tensor) -> float:
    return float(((observed - expected) ** 2 / expected).sum())


def chi_square_limit(df: int, z: float = 3.09) -> float:
    """The chi-square distribution's 99.9% quantile (Wilson-Hilferty approximation)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize(
    "options",
    [
        dict(top_k=1),
        dict(top_p=1e-6),
        dict(temperature=1e-4),
        dict(top_k=1, temperature=3.0, top_p=0.5),
    ],
    ids=["top_k=1", "top_p_tiny", "cold", "top_k=1_hot"],
)
def test_sampling_the_likeliest_token_only_is_greedy_decoding(options) -> None:
    model, src = random_model(), sources()
    limits = dict(max_len_b=8, min_len=2, no_repeat_ngram_size=2)
    greedy = decode_all(model, src, DecodeOptions(strategy="greedy", **limits))
    sampled = decode_all(model, src, DecodeOptions(strategy="sample", **limits, **options))
    assert sampled[0] == greedy[0]
    assert sampled[1] == [pytest.approx(s, abs=1e-6) for s in greedy[1]]


def first_token_distribution(
    model: Transformer, row: torch.Tensor, temperature: float, top_k: int, top_p: float
) -> list[float]:
    """What the first token should be drawn from, computed on the whole model: bos, pad and eos
    (min_len 1) banned, tempered, the top_k likeliest, then the smallest nucleus >= top_p."""
    with torch.no_grad():
        lprobs = model(row.unsqueeze(0), torch.tensor([[BOS]]))[0, -1].double().log_softmax(-1)
    lprobs[[PAD, BOS, EOS]] = float("-inf")
    probs = (lprobs / temperature).softmax(-1).tolist()
    ranked = sorted(range(len(probs)), key=lambda i: -probs[i])
    kept = ranked[:top_k] if top_k else ranked
    total, nucleus = sum(probs[i] for i in kept), []
    for i in kept:
        if sum(probs[j] for j in nucleus) >= top_p * total:
            break
        nucleus.append(i)
    mass = sum(probs[i] for i in nucleus)
    return [probs[i] / mass if i in nucleus else 0.0 for i in range(len(probs))]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, 0, 1.0), (0.5, 0, 1.0), (2.0, 8, 1.0), (1.0, 0, 0.5), (0.7, 12, 0.8)],
)
def test_first_tokens_follow_the_tempered_truncated_distribution(temperature, top_k, top_p):
    """20,000 draws of one sentence's first token (each its own sentence index) against the
    distribution computed from the full model: a chi-square test at the 0.1% level, and no draw
    outside the kept tokens."""
    model, row = random_model(), sources()[0]
    n = 20_000
    options = DecodeOptions(
        strategy="sample", temperature=temperature, top_k=top_k, top_p=top_p, seed=7
    )
    src = row.expand(n, -1)
    hyps = sample(model, src, options, bos_id=BOS, eos_id=EOS, max_lengths=torch.ones(n))
    counts = torch.bincount(torch.tensor([h[0].tokens[0] for h in hyps]), minlength=V_MODEL)
    probs = torch.tensor(first_token_distribution(model, row, temperature, top_k, top_p))
    support = probs > 0
    assert counts[~support].sum() == 0
    assert chi_square(counts[support].double(), n * probs[support]) < chi_square_limit(
        int(support.sum()) - 1
    )
    if top_k:
        assert int(support.sum()) <= top_k


V_MODEL = 40  # random_model's vocabulary


@pytest.mark.slow
def test_samples_are_reproducible_and_independent_of_the_batch() -> None:
    model, src = random_model(), sources()
    options = DecodeOptions(strategy="sample", max_len_b=8, seed=3)
    first = decode_all(model, src, options)
    assert decode_all(model, src, options) == first
    other_seed = decode_all(model, src, DecodeOptions(strategy="sample", max_len_b=8, seed=4))
    assert other_seed[0] != first[0]
    ids = torch.tensor([10, 11, 12, 13])
    numbered = decode_all(model, src, options, sentence_ids=ids)
    assert numbered[0] != first[0]  # the draws follow the sentence's index
    order = torch.tensor([2, 0, 3, 1])
    shuffled = decode_all(model, src[order], options, sentence_ids=ids[order])
    assert [shuffled[0][order.tolist().index(i)] for i in range(4)] == numbered[0]
    for i, row in enumerate(src):
        alone = decode_all(
            model, row[row.ne(PAD)].unsqueeze(0), options, sentence_ids=ids[i : i + 1]
        )
        assert alone[0] == [numbered[0][i]]
    three = decode_all(model, src, DecodeOptions(strategy="sample", max_len_b=8, seed=3, nbest=3))
    for one, many, scores in zip(first[0], three[0], three[1], strict=True):
        assert one[0] in many  # sample 0 is the same whatever nbest
        assert scores == sorted(scores, reverse=True)
