"""The whole search step at static shapes (transformer.decoding.static): what a CUDA graph
replays, run eagerly on the CPU (decode.static_search=true), finds what today's loops find, token
for token and score for score, for beam search, greedy decoding and sampling with every feature;
outside the step the loop issues no operator but the periodic read of whether all are done, and
inside it nothing reads the device or copies from the host. The CUDA tests capture and replay it."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.decoding.test_decoding import BOS, EOS, PAD, Kernels, random_model, sources
from tests.test_learning import reversal_batch, reversing_model
from transformer import kernels
from transformer.decoding import DecodeOptions, beam_search, greedy_decode, sample, static
from transformer.decoding.runtime import use_static_search

SEARCHES = {"greedy": greedy_decode, "beam": beam_search, "sample": sample}
PREFIXES = torch.tensor([[7, 8, PAD], [PAD, PAD, PAD], [9, PAD, PAD], [10, 11, 12]])
EVERY_PREFIXED = torch.tensor([[7, 8, PAD], [13, 9, PAD], [9, 16, 15], [10, 11, 12]])
PHRASES = [[[13, 14]], [], [[15]], [[16], [17, 18]]]


def decode(model, src, options: DecodeOptions, **kwargs):
    hyps = SEARCHES[options.strategy](model, src, options, bos_id=BOS, eos_id=EOS, **kwargs)
    return [[h.tokens for h in s] for s in hyps], [[h.score for h in s] for s in hyps]


def assert_same_search(model, src, options: dict, tol: float = 1e-5, **kwargs) -> None:
    """Today's loop (sentences leave as they finish) and the static step give the same
    hypotheses, and scores within float tolerance."""
    tokens, scores = decode(model, src, DecodeOptions(**options), **kwargs)
    static_tokens, static_scores = decode(
        model, src, DecodeOptions(**options, static_search=True), **kwargs
    )
    assert static_tokens == tokens
    for got, want in zip(static_scores, scores, strict=True):
        assert got == pytest.approx(want, abs=tol)


BEAM_CASES = {
    "nbest1": dict(beam_size=4, nbest=1),
    "nbest3": dict(beam_size=4, nbest=3),
    "nbest3_raw": dict(beam_size=4, nbest=3, len_penalty=0.0),
    "min_len": dict(beam_size=4, nbest=3, min_len=5, max_len_b=9),
    "max_len": dict(beam_size=4, nbest=2, max_len_a=0.5, max_len_b=1, min_len=0),
    "ngrams": dict(beam_size=4, nbest=3, no_repeat_ngram_size=2, min_len=6, max_len_b=9),
    "one_beam": dict(beam_size=1, min_len=3),
    "sync_every_3": dict(beam_size=4, nbest=3, sync_every=3, len_penalty=0.6),
}


@pytest.mark.parametrize("case", BEAM_CASES)
def test_beam_search_at_static_shapes_finds_todays_hypotheses(case) -> None:
    assert_same_search(random_model(), sources(), dict(max_len_b=8) | BEAM_CASES[case])


def test_per_sentence_max_lengths() -> None:
    lengths = dict(max_lengths=torch.tensor([2, 6, 0, 4]))
    for options in (dict(beam_size=3, nbest=3, min_len=0), dict(strategy="greedy", min_len=0)):
        assert_same_search(random_model(), sources(), options, **lengths)


ROW_CASES = {
    "greedy": dict(strategy="greedy"),
    "greedy_min_len_ngrams": dict(strategy="greedy", min_len=4, no_repeat_ngram_size=1),
    "greedy_sync_every_3": dict(strategy="greedy", sync_every=3, len_penalty=0.0),
    "sample": dict(strategy="sample", nbest=3, seed=3),
    "sample_top_k": dict(strategy="sample", nbest=2, seed=5, top_k=10, temperature=0.7),
    "sample_top_p": dict(strategy="sample", nbest=2, seed=1, top_p=0.8, min_len=2),
}


@pytest.mark.parametrize("case", ROW_CASES)
def test_greedy_and_sampling_at_static_shapes_find_todays_tokens(case) -> None:
    assert_same_search(random_model(), sources(), dict(max_len_b=8) | ROW_CASES[case])


@pytest.mark.parametrize("score_prefix", [False, True])
@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_target_prefixes(strategy, score_prefix) -> None:
    options = dict(strategy=strategy, max_len_b=8, score_prefix=score_prefix, min_len=0)
    options |= dict(beam_size=3, nbest=3) if strategy == "beam" else {}
    options |= dict(seed=2, nbest=2) if strategy == "sample" else {}
    assert_same_search(random_model(), sources(), options, target_prefix=PREFIXES)


@pytest.mark.parametrize("beams", [1, 2, 4])
def test_constraints(beams) -> None:
    options = dict(beam_size=beams, nbest=min(beams, 2), max_len_b=9)
    assert_same_search(random_model(), sources(), options, constraints=PHRASES)
    both = dict(constraints=PHRASES, target_prefix=PREFIXES)
    assert_same_search(random_model(), sources(), options | dict(sync_every=2), **both)
    every = dict(constraints=PHRASES, target_prefix=EVERY_PREFIXED)  # one row a sentence at first
    assert_same_search(random_model(), sources(), options | dict(sync_every=2), **every)


@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_ensembles_and_position_encodings(strategy) -> None:
    torch.manual_seed(1)
    models = [random_model(positions="rope"), random_model(positions="relative")]
    options = dict(strategy=strategy, max_len_b=6)
    options |= dict(beam_size=3, nbest=2) if strategy == "beam" else {}
    options |= dict(seed=4) if strategy == "sample" else {}
    assert_same_search(models, sources(), options)
    assert_same_search(models[1], sources(), options)


@pytest.fixture(scope="module")
def trained():
    """The tiny model halfway through learning to reverse sequences, and 23 sources: its
    translations end at different steps (test_decoding.py's fixture)."""
    src, _, _ = reversal_batch(23, torch.Generator().manual_seed(2))
    return reversing_model(80), src


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_a_trained_model(trained, strategy) -> None:
    model, src = trained
    options = dict(strategy=strategy, max_len_a=1.0, max_len_b=2)
    options |= dict(beam_size=4, nbest=3) if strategy == "beam" else {}
    options |= dict(nbest=2, seed=3, top_k=5) if strategy == "sample" else {}
    tokens = decode(model, src, DecodeOptions(**options))[0]
    assert len({len(t[0]) for t in tokens}) >= 4  # sentences end at different steps
    assert_same_search(model, src, options)
    assert_same_search(model, src, options | dict(sync_every=4))


def test_the_static_search_runs_when_asked(monkeypatch) -> None:
    """Off by default (until it has run on a GPU); asked for, it runs on a CPU (eagerly) or a
    GPU; the uncached decoder always falls back to today's loop."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not use_static_search(DecodeOptions(), cpu, use_cache=True)
    assert use_static_search(DecodeOptions(static_search=True), cpu, use_cache=True)
    assert not use_static_search(DecodeOptions(), cuda, use_cache=True)
    assert not use_static_search(DecodeOptions(graphs=False), cuda, use_cache=True)
    assert use_static_search(DecodeOptions(graphs=False, static_search=True), cuda, True)
    assert not use_static_search(DecodeOptions(static_search=False), cuda, use_cache=True)
    assert not use_static_search(DecodeOptions(static_search=True), cuda, use_cache=False)
    calls = Counter()
    for name in ("beam_search", "decode_rows"):
        made = getattr(static, name)

        def counted(*args, made=made, name=name):
            calls[name] += 1
            return made(*args)

        monkeypatch.setattr(static, name, counted)
    model, src = random_model(), sources()
    for strategy in SEARCHES:
        options = DecodeOptions(strategy=strategy, static_search=True, max_len_b=4)
        today = DecodeOptions(strategy=strategy, max_len_b=4)
        assert decode(model, src, options, use_cache=False) == decode(
            model, src, today, use_cache=False
        )
    assert not calls  # uncached: today's loop
    decode(model, src, DecodeOptions(max_len_b=4))
    assert not calls  # the CPU's default: today's loop
    for strategy in SEARCHES:
        decode(model, src, DecodeOptions(strategy=strategy, static_search=True, max_len_b=4))
    assert calls == {"beam_search": 1, "decode_rows": 2}
    with pytest.raises(ValueError, match=r"decode\.static_search must be true or false"):
        DecodeOptions(static_search="yes")


class StepTraffic(TorchDispatchMode):
    """The operators of a static search, each tagged inside or outside its step (the step's
    ``__call__`` wrapped): ``outside`` lists those the loop issues between its first step and
    its last; ``inside`` counts the ones a CUDA graph could not capture (device reads, ops sized
    by the device, tensors made from host data) and the kernels (as :class:`Kernels` counts)."""

    def __init__(self, step_class: type, monkeypatch) -> None:
        super().__init__()
        self.inside, self.steps = Counter(), 0
        self.events: list[str] = []  # ops outside the step, and "STEP" where one ran
        self.stepping = False
        call = step_class.__call__

        def tagged(step) -> None:
            self.steps += 1
            self.events.append("STEP")
            self.stepping = True
            try:
                call(step)
            finally:
                self.stepping = False

        monkeypatch.setattr(step_class, "__call__", tagged)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self.stepping:
            if not func.is_view and name not in Kernels.NOT_KERNELS - {"_local_scalar_dense"}:
                self.events.append(name)
        elif name == "_local_scalar_dense":
            self.inside["reads"] += 1
        elif name == "nonzero" or any(
            i is not None and i.dtype == torch.bool
            for i in (args[1] if name in ("index", "index_put_") else [])
        ):
            self.inside["sized_by_device"] += 1
        elif name in ("lift_fresh", "lift_fresh_copy"):
            self.inside["from_host"] += 1
        elif not func.is_view and name not in Kernels.NOT_KERNELS:
            self.inside["ops"] += 1
        return func(*args, **(kwargs or {}))

    def outside(self) -> list[str]:
        """The ops between the first step and the last, outside them."""
        first = self.events.index("STEP")
        last = len(self.events) - 1 - self.events[::-1].index("STEP")
        return [e for e in self.events[first:last] if e != "STEP"]


@pytest.mark.parametrize("gpu_paths", [False, True], ids=["cpu", "gpu_paths"])
@pytest.mark.parametrize("every", [1, 3])
@pytest.mark.parametrize("strategy", ["beam", "greedy", "sample"])
def test_outside_the_step_the_loop_only_reads_whether_all_are_done(
    monkeypatch, strategy, every, gpu_paths
) -> None:
    """Every feature on (bans, n-grams, a prefix; constraints in beam search): inside the step
    no device read, no op sized by the device, no tensor from host data (what a CUDA graph
    captures); between steps nothing but the read every ``every`` steps. ``gpu_paths``: CPU
    tensors sent down the GPU's kernels (SDPA, F.linear)."""
    if gpu_paths:
        monkeypatch.setattr(kernels, "cpu_kernels", lambda x: False)
    step_class = static.BeamStep if strategy == "beam" else static.RowStep
    traffic = StepTraffic(step_class, monkeypatch)
    options = DecodeOptions(
        strategy=strategy, static_search=True, sync_every=every, min_len=2, max_len_b=9,
        no_repeat_ngram_size=2, **(dict(beam_size=3, nbest=2) if strategy == "beam" else {}),
    )  # fmt: skip
    extra = dict(target_prefix=PREFIXES)
    if strategy == "beam":
        extra["constraints"] = PHRASES
    model, src = random_model(), sources()
    with traffic:
        out = SEARCHES[strategy](
            model, src, options, bos_id=BOS, eos_id=EOS, max_lengths=torch.tensor([4, 9, 9, 5]),
            **extra,
        )  # fmt: skip
    assert len({len(h[0].tokens) for h in out}) > 1  # sentences finished at different steps
    steps = traffic.steps
    assert steps == 10 if every == 1 else steps >= 10  # the longest: 9 tokens and eos
    assert traffic.inside["ops"] > 0
    assert traffic.inside["reads"] == traffic.inside["sized_by_device"] == 0
    assert traffic.inside["from_host"] == 0
    reads = len([t for t in range(1, steps) if t % every == 0])
    assert traffic.outside() == ["_local_scalar_dense"] * reads


def test_a_whole_beam_step_of_the_base_decoder(monkeypatch) -> None:
    """The operators a CUDA graph of the whole beam step (beam 5, transformer-base's 6 decoder
    layers, narrower; the GPU's kernels) captures: the model's step and the search's, none
    between steps but the read: 160 a step (today's loop: 145, the model's share graphed)."""
    monkeypatch.setattr(kernels, "cpu_kernels", lambda x: False)
    cfg = dict(d_model=64, num_heads=8, num_encoder_layers=1, num_decoder_layers=6, d_ff=128)
    model = random_model(**cfg).eval()
    src = torch.randint(4, 40, (4, 9))
    src[1, 5:] = PAD
    options = DecodeOptions(
        beam_size=5, min_len=12, max_len_a=0.0, max_len_b=12, static_search=True, sync_every=8
    )
    traffic = StepTraffic(static.BeamStep, monkeypatch)
    with traffic:
        beam_search(model, src, options, bos_id=BOS, eos_id=EOS)
    assert traffic.steps == 13
    assert traffic.outside() == ["_local_scalar_dense"]  # after step 8
    assert traffic.inside["ops"] / traffic.steps <= 165, traffic.inside["ops"] / traffic.steps


# On a GPU: the whole step captured in a CUDA graph and replayed.

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_the_graphed_whole_step_decodes_as_eager(strategy, dtype) -> None:
    """One CUDA graph of the whole step (the default on a GPU), against the same step eager
    (graphs=false, static_search=true) and today's loop with the model's step graphed
    (static_search=false): the same translations, scores within float tolerance."""
    model, src = random_model().to("cuda", dtype), sources().cuda()
    options = dict(strategy=strategy, max_len_b=8, sync_every=3, min_len=2)
    options |= dict(beam_size=4, nbest=3) if strategy == "beam" else {}
    options |= dict(nbest=2, seed=5, top_k=10) if strategy == "sample" else {}
    graphed = decode(model, src, DecodeOptions(**options))
    eager = decode(model, src, DecodeOptions(**options, graphs=False, static_search=True))
    before = decode(model, src, DecodeOptions(**options, static_search=False))
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    for other in (eager, before):
        assert graphed[0] == other[0]
        for got, want in zip(graphed[1], other[1], strict=True):
            assert got == pytest.approx(want, abs=tol)


@pytest.mark.cuda
@needs_cuda
def test_cuda_prefixes_constraints_and_ensembles_in_the_graph() -> None:
    """Prefixes, constraints, n-gram bans and an ensemble inside the captured step: the CPU's
    translations (today's loop), float32."""
    torch.manual_seed(1)
    models = [random_model(), random_model(positions="rope")]
    gpu = [copy.deepcopy(m).cuda() for m in models]
    src = sources()
    runs = [
        (dict(strategy="greedy", no_repeat_ngram_size=2), dict(target_prefix=PREFIXES)),
        (dict(beam_size=3, nbest=3), dict(target_prefix=PREFIXES)),
        (dict(beam_size=3, nbest=2, max_len_b=9), dict(constraints=PHRASES)),
        (dict(strategy="sample", seed=2, nbest=2), dict(target_prefix=PREFIXES)),
    ]
    for options, extra in runs:
        options = dict(max_len_b=8) | options
        on_cpu = decode(models, src, DecodeOptions(**options), **extra)
        if "target_prefix" in extra:
            extra = dict(target_prefix=PREFIXES.cuda())
        on_gpu = decode(gpu, src.cuda(), DecodeOptions(**options, sync_every=4), **extra)
        assert on_gpu[0] == on_cpu[0]
        for got, want in zip(on_gpu[1], on_cpu[1], strict=True):
            assert got == pytest.approx(want, abs=1e-3)
