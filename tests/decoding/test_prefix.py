"""Prefix-constrained decoding: a scripted decoder shows each sentence's prefix forced and the
search going on after it (greedy, beam, sampling, batched, prefixes of different lengths and none);
on a real model the cached search equals the uncached one and brute force."""

import copy
import math

import pytest
import torch

from tests.decoding.test_decoding import (
    BOS,
    EOS,
    PAD,
    A,
    B,
    C,
    ScriptedModel,
    random_model,
    sources,
)
from transformer import kernels
from transformer.decoding import DecodeOptions, beam_search, greedy_decode, sample
from transformer.decoding.step import Stepper

SEARCHES = {"greedy": greedy_decode, "beam": beam_search, "sample": sample}
# Unconstrained, every search says "A". After "B": "C" for sure. After "C": greedy "C A" (0.6 x
# 0.4), beam "C B" (0.4 x 0.9). A prefix missing from the script ends at once.
SCRIPT = {
    (): {A: 0.98, B: 0.01, C: 0.01},
    (A,): {EOS: 1.0},
    (B,): {C: 1.0},
    (B, C): {EOS: 1.0},
    (C,): {A: 0.6, B: 0.4},
    (C, A): {EOS: 0.4, A: 0.3, B: 0.3},
    (C, B): {EOS: 0.9, A: 0.1},
}
PREFIXES = [[B], [], [C], [C, A, A]]


def prefix_tensor(prefixes: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(prefixes), max(map(len, prefixes))), PAD)
    for i, p in enumerate(prefixes):
        out[i, : len(p)] = torch.tensor(p, dtype=torch.long)
    return out


def decode(strategy: str, prefixes=PREFIXES, script=SCRIPT, **options):
    src = torch.full((len(prefixes), 3), A)
    opts = DecodeOptions(strategy=strategy, **options)
    target_prefix = prefix_tensor(prefixes)
    return SEARCHES[strategy](
        ScriptedModel(script), src, opts, bos_id=BOS, eos_id=EOS, target_prefix=target_prefix
    )


@pytest.mark.parametrize(
    ("strategy", "options", "after_c"),
    [
        ("greedy", {}, [C, A]),
        ("beam", {"beam_size": 2, "len_penalty": 0.0}, [C, B]),
        ("sample", {"top_k": 1}, [C, A]),  # the likeliest token: greedy's
    ],
)
def test_the_prefix_is_forced_and_the_search_goes_on_after_it(strategy, options, after_c) -> None:
    hyps = decode(strategy, **options)
    assert [h[0].tokens for h in hyps] == [[B, C], [A], after_c, [C, A, A]]


def test_samples_start_with_their_prefix_and_draw_after_it() -> None:
    hyps = decode("sample", nbest=8, seed=0)
    assert all(h.tokens == [B, C] for h in hyps[0])
    assert all(h.tokens[:1] == [C] for h in hyps[2])
    assert {tuple(h.tokens[:2]) for h in hyps[2]} == {(C, A), (C, B)}  # drawn after the prefix
    assert all(h.tokens == [C, A, A] for h in hyps[3])


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
@pytest.mark.parametrize("score_prefix", [False, True])
def test_the_prefix_counts_in_the_score_by_option(strategy, score_prefix) -> None:
    """Lengths (of len_penalty) count the whole hypothesis, prefix and eos included."""
    beam = {"beam_size": 2} if strategy == "beam" else {}
    hyps = decode(strategy, len_penalty=1.0, score_prefix=score_prefix, **beam)
    prefix = {0: math.log(0.01), 2: math.log(0.01), 3: math.log(0.01 * 0.6 * 0.3)}
    searched = {0: 0.0, 1: math.log(0.98), 2: math.log(0.6 * 0.4), 3: 0.0}
    if strategy == "beam":
        searched[2] = math.log(0.4 * 0.9)
    for i, (h,) in enumerate(hyps):
        expected = searched[i] + (prefix.get(i, 0.0) if score_prefix else 0.0)
        assert h.score == pytest.approx(expected / (len(h.tokens) + 1), abs=1e-6)


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_length_limits_count_the_prefix(strategy) -> None:
    beam = {"beam_size": 2} if strategy == "beam" else {}
    short = {(C,) * n: {EOS: 0.9, C: 0.1} for n in range(30)}
    # min_len: 5 tokens in all, the 2-token prefix included
    hyps = decode(strategy, [[C, C], []], short, min_len=5, **beam)
    assert [h[0].tokens for h in hyps] == [[C] * 5] * 2
    # at most 2 tokens; a longer prefix raises its sentence's limit to its length
    endless = {(C,) * n: {C: 0.9, EOS: 0.1} for n in range(30)}
    hyps = decode(strategy, [[C], [C, C, C, C]], endless, max_len_a=0.0, max_len_b=2, **beam)
    assert [h[0].tokens for h in hyps] == [[C, C], [C, C, C, C]]


def test_right_after_its_prefix_only_the_best_candidate_may_end() -> None:
    """CTranslate2's rule (see ForcedPrefix.no_early_eos): eos, second after the prefix "C",
    does not finish "C" (0.3), and its beam stays dead (so "C B" is not searched either): "C A
    B" (0.2) comes second. Without a prefix, eos second at the first step finishes the empty
    translation, as in unconstrained beam search."""
    script = {
        (): {A: 0.5, EOS: 0.3, B: 0.2},
        (C,): {A: 0.5, EOS: 0.3, B: 0.2},
        (C, A): {EOS: 0.6, B: 0.4},
        (C, B): {EOS: 1.0},
    }
    options = dict(beam_size=2, nbest=2, min_len=0, len_penalty=0.0)
    hyps = decode("beam", [[C], []], script, **options)
    assert [h.tokens for h in hyps[0]] == [[C, A], [C, A, B]]
    assert [h.tokens for h in hyps[1]] == [[A], []]
    free = beam_search(ScriptedModel(script), torch.full((1, 3), A), DecodeOptions(**options),
                       bos_id=BOS, eos_id=EOS)[0]  # fmt: skip
    assert [h.tokens for h in free] == [[A], []]


def test_while_every_sentence_is_within_its_prefix_beam_search_steps_one_row_each(
    monkeypatch,
) -> None:
    """Prefixes of 3, 5 and 4 tokens: the first 3 steps decode one row a sentence (its K beams
    would be copies), then K rows; cached or not, the hypotheses are those of the static search,
    which runs K rows a sentence from the first step."""
    model, src = random_model(), sources()[:3]
    prefixes = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14, 15, 16]]
    rows: list[int] = []
    log_probs = Stepper.log_probs

    def counted(self: Stepper, p: torch.Tensor) -> torch.Tensor:
        rows.append(p.size(0))
        return log_probs(self, p)

    monkeypatch.setattr(Stepper, "log_probs", counted)
    options = dict(beam_size=4, nbest=4, max_len_b=9, len_penalty=0.6)
    ids = dict(bos_id=BOS, eos_id=EOS, target_prefix=prefix_tensor(prefixes))
    want = beam_search(model, src, DecodeOptions(**options, static_search=True), **ids)
    for use_cache in (True, False):
        rows.clear()
        got = beam_search(model, src, DecodeOptions(**options), **ids, use_cache=use_cache)
        assert rows[:4] == [3, 3, 3, 12]
        assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]
        for a, b in zip(got, want, strict=True):
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)
        assert all(s[0].tokens[: len(p)] == p for s, p in zip(got, prefixes, strict=True))


def test_the_prefix_is_forced_where_it_repeats_a_banned_ngram() -> None:
    hyps = decode("greedy", [[C, A, C, A]], no_repeat_ngram_size=2)
    assert hyps[0][0].tokens == [C, A, C, A]


@pytest.mark.parametrize(
    ("prefix", "message"),
    [([[EOS]], "eos id"), ([[BOS, A]], "bos id"), ([[PAD, A]], "padding before")],
)
def test_bad_prefixes_raise(prefix, message) -> None:
    with pytest.raises(ValueError, match=message):
        decode("greedy", prefix)


# A real (untrained) model: cached equals uncached and brute force; batched equals alone.


def random_prefixes() -> list[list[int]]:
    g = torch.Generator().manual_seed(2)
    return [torch.randint(4, 40, (n,), generator=g).tolist() for n in (2, 0, 5, 1)]


@torch.no_grad()
def brute_force_greedy(model, row: torch.Tensor, prefix: list[int], max_len: int) -> list[int]:
    """The whole decoder re-run on the whole prefix at every step, one sentence alone."""
    tokens = [BOS, *prefix]
    while len(tokens) - 1 < max_len:
        logits = model(row.unsqueeze(0), torch.tensor([tokens]))[0, -1]
        logits[[PAD, BOS]] = float("-inf")
        if int(logits.argmax()) == EOS:
            break
        tokens.append(int(logits.argmax()))
    return tokens[1:]


def test_greedy_with_prefixes_equals_brute_force() -> None:
    model, src, prefixes = random_model().eval(), sources(), random_prefixes()
    options = DecodeOptions("greedy", min_len=0, max_len_a=0.0, max_len_b=9)
    ids = dict(bos_id=BOS, eos_id=EOS, target_prefix=prefix_tensor(prefixes))
    out = greedy_decode(model, src, options, **ids)
    for row, p, (h,) in zip(src, prefixes, out, strict=True):
        assert h.tokens == brute_force_greedy(model, row[row.ne(PAD)], p, 9)
        assert h.tokens[: len(p)] == p


@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_cached_equals_uncached_and_batched_equals_alone(strategy) -> None:
    model, src, prefixes = random_model(), sources(), random_prefixes()
    options = {
        "greedy": DecodeOptions("greedy", max_len_b=8),
        "beam": DecodeOptions(beam_size=4, nbest=3, max_len_b=8),
        "sample": DecodeOptions("sample", nbest=3, max_len_b=8, seed=1),
    }[strategy]
    search, ids = SEARCHES[strategy], dict(bos_id=BOS, eos_id=EOS)
    target_prefix = prefix_tensor(prefixes)
    cached = search(model, src, options, **ids, target_prefix=target_prefix)
    uncached = search(model, src, options, **ids, target_prefix=target_prefix, use_cache=False)
    for a, b, p in zip(cached, uncached, prefixes, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)
        assert all(h.tokens[: len(p)] == p for h in a)
    for i, row in enumerate(src):
        row, one = row[row.ne(PAD)].unsqueeze(0), prefix_tensor([prefixes[i]])
        kwargs = {"sentence_ids": torch.tensor([i])} if strategy == "sample" else {}
        alone = search(model, row, options, **ids, target_prefix=one, **kwargs)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in cached[i]]


@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_the_gpu_path_decodes_prefixes_as_the_cpu_path(monkeypatch, strategy) -> None:
    """Static cache, finished sentences leaving every 8 steps into padded batch sizes (CPU
    tensors sent down the GPU's paths): the same hypotheses."""
    model, src, prefixes = random_model(), sources(), random_prefixes()
    options = DecodeOptions(strategy, **({"beam_size": 3} if strategy == "beam" else {}))
    kwargs = dict(bos_id=BOS, eos_id=EOS, max_lengths=torch.tensor([3, 9, 12, 20]))
    kwargs["target_prefix"] = prefix_tensor(prefixes)
    cpu = SEARCHES[strategy](model, src, options, **kwargs)
    monkeypatch.setattr(kernels, "cpu_kernels", lambda x: False)
    gpu_path = SEARCHES[strategy](model, src, options, **kwargs)
    assert [[h.tokens for h in s] for s in gpu_path] == [[h.tokens for h in s] for s in cpu]
    assert all(s[0].tokens[: len(p)] == p for s, p in zip(cpu, prefixes, strict=True))


@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_an_ensemble_of_copies_decodes_prefixes_as_the_model(strategy) -> None:
    model, src, prefixes = random_model(), sources(), random_prefixes()
    options = DecodeOptions(strategy, **({"beam_size": 3} if strategy == "beam" else {}))
    kwargs = dict(bos_id=BOS, eos_id=EOS, target_prefix=prefix_tensor(prefixes))
    alone = SEARCHES[strategy](model, src, options, **kwargs)
    copies = SEARCHES[strategy]([model, copy.deepcopy(model)], src, options, **kwargs)
    assert [[h.tokens for h in s] for s in copies] == [[h.tokens for h in s] for s in alone]
