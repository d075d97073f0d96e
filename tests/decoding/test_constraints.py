"""Lexically constrained beam search: the best constrained translation by brute force, phrases a
scripted decoder makes unlikely placed anyway, every phrase present whenever the length allows."""

import itertools
import math
import random

import pytest
import torch

from tests.decoding.test_decoding import (
    BOS,
    EOS,
    PAD,
    A,
    B,
    C,
    DeviceTraffic,
    ScriptedModel,
    random_model,
    sources,
)
from transformer import TransformerConfig, kernels
from transformer.decoding import DecodeOptions, beam_search
from transformer.decoding.constraints import Constraints, contains

IDS = dict(bos_id=BOS, eos_id=EOS)


def constrained(script, constraints, src=None, **options):
    src = torch.tensor([[A, B, C]] * len(constraints)) if src is None else src
    opts = DecodeOptions(**{"beam_size": 2, "len_penalty": 0.0, **options})
    return beam_search(ScriptedModel(script), src, opts, **IDS, constraints=constraints)


# Scripted decoders: the unconstrained search misses the phrases; the constrained one places them.

# "A" then eos is likely; "C" is unlikely anywhere.
SCRIPT = {
    (): {A: 0.7, B: 0.25, C: 0.05},
    (A,): {EOS: 0.8, B: 0.15, C: 0.05},
    (B,): {EOS: 0.6, A: 0.3, C: 0.1},
    (C,): {EOS: 0.5, A: 0.5},
    (A, B): {EOS: 0.5, C: 0.25, A: 0.25},
    (A, C): {EOS: 0.9, B: 0.1},
    (A, B, C): {EOS: 0.9, A: 0.1},
    (B, C): {EOS: 0.8, A: 0.2},
    (C, A): {EOS: 0.9, B: 0.1},
    (B, A): {EOS: 0.6, C: 0.4},
}


def test_a_single_token_constraint_is_placed_where_it_scores_best() -> None:
    (plain,) = constrained(SCRIPT, [[]])
    assert plain[0].tokens == [A]
    (hyps,) = constrained(SCRIPT, [[[C]]])
    # "A C" 0.7 * 0.05 * 0.9 = 0.0315; "A B C" 0.7 * 0.15 * 0.25 * 0.9 = 0.0236;
    # "C" 0.05 * 0.5 = 0.025; "B C" 0.25 * 0.1 * 0.8 = 0.02
    assert hyps[0].tokens == [A, C]
    assert hyps[0].score == pytest.approx(math.log(0.7 * 0.05 * 0.9), abs=1e-6)
    assert hyps[0].constraints_met is True


def test_a_multi_token_phrase_is_placed_whole() -> None:
    # "B C": "A B C" 0.0236 beats "B C" 0.02; unconstrained, "A" 0.56 and "B" 0.15 come first.
    (hyps,) = constrained(SCRIPT, [[[B, C]]])
    assert hyps[0].tokens == [A, B, C]
    assert hyps[0].score == pytest.approx(math.log(0.7 * 0.15 * 0.25 * 0.9), abs=1e-6)
    (plain,) = constrained(SCRIPT, [[]], nbest=2)
    assert [h.tokens for h in plain] == [[A], [B]]


def test_two_constraints_each_placed() -> None:
    # "C" and "B A": only "B A C" (0.25 * 0.3 * 0.4) holds both (the others are 1e-12).
    script = {**SCRIPT, (B, A, C): {EOS: 1.0}}
    (hyps,) = constrained(script, [[[C], [B, A]]], beam_size=3)
    assert hyps[0].tokens == [B, A, C]
    assert hyps[0].score == pytest.approx(math.log(0.25 * 0.3 * 0.4), abs=1e-6)


def test_a_batch_with_different_constraint_counts() -> None:
    lists = [[[C]], [], [[B, C]], [[C], [B, A]]]
    script = {**SCRIPT, (B, A, C): {EOS: 1.0}}
    out = constrained(script, lists, beam_size=3)
    assert [s[0].tokens for s in out] == [[A, C], [A], [A, B, C], [B, A, C]]
    for sentence, alone in zip(out, lists, strict=True):  # as each decoded alone
        (single,) = constrained(script, [alone], beam_size=3)
        assert [h.tokens for h in single] == [h.tokens for h in sentence]
    # A sentence without constraints decodes as the plain search decodes it.
    (plain,) = beam_search(
        ScriptedModel(script),
        torch.tensor([[A, B, C]]),
        DecodeOptions(beam_size=3, len_penalty=0.0),
        **IDS,
    )
    assert [h.tokens for h in plain] == [h.tokens for h in out[1]]


def test_a_phrase_too_long_for_the_length_limit_gives_the_best_hypothesis_flagged() -> None:
    # At most 2 tokens: "A B C" cannot be. The beams at the limit are the fullest banks' best,
    # "A B" (2 tokens of the phrase: 0.7 * 0.15 * 0.5) and "B A" (1: 0.25 * 0.3 * 0.6); the
    # likelier ends, flagged.
    (hyps,) = constrained(SCRIPT, [[[A, B, C]]], max_len_a=0.0, max_len_b=2, nbest=2)
    assert [h.tokens for h in hyps] == [[A, B], [B, A]]
    assert [h.constraints_met for h in hyps] == [False, False]


def test_bad_constraints_are_refused() -> None:
    with pytest.raises(ValueError, match=r"sentence 0: constraint \[3\] must be a non-empty"):
        constrained(SCRIPT, [[[EOS]]])
    with pytest.raises(ValueError, match="sentence 1: constraint"):
        constrained(SCRIPT, [[[A]], [[]]])
    with pytest.raises(ValueError, match="1 lists of constraints for 2 sentences"):
        constrained(SCRIPT, [[[A]]], src=torch.tensor([[A], [B]]))


def test_the_automaton_finds_phrases_that_overlap_themselves() -> None:
    # "A A B" in "A A A B": after "A A" an A keeps two A's of the phrase, not one.
    phrases = Constraints([[[A, A, B]]], 7, (PAD, BOS, EOS), torch.device("cpu"))
    phrases.met, phrases.progress = phrases.met.expand(1, 1, 1), phrases.progress.expand(1, 1, 1)
    progress = []
    for token in (A, A, A, B):
        met, after = phrases._advance(torch.zeros(1, 1, dtype=torch.long), torch.tensor([[token]]))
        phrases.met, phrases.progress = met, after
        progress.append((int(after), bool(met)))
    assert progress == [(1, False), (2, False), (2, False), (0, True)]


# Brute force: every output up to 3 tokens over a vocabulary of three words.


class RandomLanguageModel(ScriptedModel):
    """A decoder whose next-token distribution over A, B, C and eos is random for each prefix
    (a different one for every prefix), and exactly 0 for every other of its ``vocab`` ids."""

    def __init__(self, vocab: int, length: int, seed: int) -> None:
        rng = random.Random(seed)
        script = {}
        for n in range(length + 1):
            for prefix in itertools.product((A, B, C), repeat=n):
                weights = [rng.random() ** 2 for _ in range(4)]
                script[prefix] = {
                    t: w / sum(weights) for t, w in zip((A, B, C, EOS), weights, strict=True)
                }
        super().__init__(script)
        self.cfg = TransformerConfig(vocab, vocab, d_model=8, num_heads=1, pad_id=PAD)

    def decode(self, tokens, cache):
        if cache.offset:
            cache.prefixes = [
                p + (t,) for p, t in zip(cache.prefixes, tokens[:, 0].tolist(), strict=True)
            ]
        cache.offset += 1
        probs = torch.zeros(tokens.size(0), self.cfg.tgt_vocab_size)
        for row, prefix in enumerate(cache.prefixes):
            for token, p in self.script.get(prefix, {EOS: 1.0}).items():
                probs[row, token] = p
        return probs.log().unsqueeze(1)  # (N, 1, V)

    def score(self, tokens: tuple[int, ...], len_penalty: float) -> float:
        lprob = sum(math.log(self.script[tokens[:i]][t]) for i, t in enumerate(tokens))
        return (lprob + math.log(self.script[tokens][EOS])) / (len(tokens) + 1) ** len_penalty


PHRASES = [[[A]], [[C, C]], [[A, B], [B, A]], [[B], [C], [A]], [[C, A, C]], [[A, A], [B]]]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("len_penalty", [0.0, 1.0])
def test_a_beam_as_wide_as_every_output_finds_the_best_constrained_one(seed, len_penalty) -> None:
    """With 40 beams every prefix of up to 3 tokens over A, B, C stays in the beam (the other 77
    ids have probability 0): the search must return the best-scoring output that contains every
    phrase, and each of its n-best in order."""
    length, model = 3, RandomLanguageModel(80, 3, seed)
    outputs = [o for n in range(1, length + 1) for o in itertools.product((A, B, C), repeat=n)]
    options = DecodeOptions(
        beam_size=40, nbest=5, len_penalty=len_penalty, max_len_a=0.0, max_len_b=length
    )
    src = torch.tensor([[A, B, C]] * len(PHRASES))
    out = beam_search(model, src, options, **IDS, constraints=PHRASES)
    for phrases, hyps in zip(PHRASES, out, strict=True):
        holding = [o for o in outputs if all(contains(o, p) for p in phrases)]
        best = sorted(holding, key=lambda o: -model.score(o, len_penalty))[:5]
        assert [tuple(h.tokens) for h in hyps] == best
        assert [h.score for h in hyps] == pytest.approx(
            [model.score(o, len_penalty) for o in best], abs=1e-5
        )
        assert all(h.constraints_met for h in hyps)


def random_phrases(rng: random.Random, count: int, vocab: int) -> list[list[list[int]]]:
    return [
        [
            [rng.randrange(4, vocab) for _ in range(rng.randint(1, 3))]
            for _ in range(rng.randint(0, 3))
        ]
        for _ in range(count)
    ]


@pytest.mark.parametrize("beam_size", [1, 2, 4])
def test_every_phrase_is_present_whenever_the_length_limit_allows(beam_size) -> None:
    """A real (untrained) model, random phrases of random ids: with any beam, each output holds
    all of its sentence's phrases when they fit in its length limit (their total length), and
    decoding with the cache equals decoding without it."""
    torch.manual_seed(0)
    model, src, rng = random_model(), sources(), random.Random(beam_size)
    for _ in range(3):
        lists = random_phrases(rng, len(src), 40)
        options = DecodeOptions(beam_size=beam_size, nbest=beam_size, max_len_a=0.0, max_len_b=9)
        out = beam_search(model, src, options, **IDS, constraints=lists)
        uncached = beam_search(model, src, options, **IDS, constraints=lists, use_cache=False)
        for phrases, hyps, other in zip(lists, out, uncached, strict=True):
            assert [h.tokens for h in hyps] == [h.tokens for h in other]
            assert hyps, "a sentence lost all its hypotheses"
            if sum(len(p) for p in phrases) <= 9:
                for h in hyps:
                    assert all(contains(h.tokens, p) for p in phrases), (phrases, h.tokens)
                    assert h.constraints_met


def test_constraints_on_the_gpu_path_decode_as_on_the_cpu(monkeypatch) -> None:
    """Off the CPU (a static cache; sentences frozen until the host reads every 3 steps, then
    batches of the ladder's sizes with padding sentences) the constrained search finds what it
    finds on the CPU, and still reads the device only at those steps."""
    model, rng = random_model(), random.Random(5)
    src = torch.randint(4, 40, (11, 7), generator=torch.Generator().manual_seed(3))
    lists = random_phrases(rng, len(src), 40)
    options = dict(beam_size=3, nbest=2, max_len_a=0.0, max_len_b=12, sync_every=3)
    lengths = torch.tensor([3, 12, 5, 8, 12, 6, 10, 4, 12, 7, 9])
    cpu = beam_search(
        model, src, DecodeOptions(**options), **IDS, constraints=lists, max_lengths=lengths
    )
    monkeypatch.setattr(kernels, "cpu_kernels", lambda x: False)
    with DeviceTraffic() as traffic:
        gpu = beam_search(
            model, src, DecodeOptions(**options), **IDS, constraints=lists, max_lengths=lengths
        )
    assert [[h.tokens for h in s] for s in gpu] == [[h.tokens for h in s] for s in cpu]
    flat = [[h.score for h in s] for s in cpu]
    assert [h.score for s in gpu for h in s] == pytest.approx(sum(flat, []), abs=1e-5)
    assert traffic.counts["sized_by_device"] == 0


def test_without_constraints_the_search_is_unchanged() -> None:
    model, src = random_model(), sources()
    options = DecodeOptions(beam_size=3, nbest=3)
    plain = beam_search(model, src, options, **IDS)
    for lists in (None, [[]] * len(src)):
        same = beam_search(model, src, options, **IDS, constraints=lists)
        assert [[h.tokens for h in s] for s in same] == [[h.tokens for h in s] for s in plain]
        assert all(h.constraints_met is None for s in same for h in s)


@pytest.mark.parametrize("beam_size", [2, 4])
def test_a_prefix_and_constraints_together_give_both(beam_size) -> None:
    """Given a start and phrases at once (interactive translation with terminology): every
    output begins with its sentence's prefix and holds all its phrases when they fit after it;
    a phrase the prefix already holds counts as met."""
    torch.manual_seed(0)
    model, src, rng = random_model(), sources(), random.Random(beam_size)
    lists = random_phrases(rng, len(src), 40)
    starts = [[rng.randrange(4, 40) for _ in range(rng.randint(0, 3))] for _ in range(len(src))]
    starts[0] = list(lists[0][0]) if lists[0] else starts[0]  # its first phrase as its prefix
    width = max(len(s) for s in starts)
    prefix = torch.full((len(src), width), PAD, dtype=torch.long)
    for i, s in enumerate(starts):
        prefix[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    options = DecodeOptions(beam_size=beam_size, nbest=beam_size, max_len_a=0.0, max_len_b=12)
    out = beam_search(model, src, options, **IDS, constraints=lists, target_prefix=prefix)
    for start, phrases, hyps in zip(starts, lists, out, strict=True):
        assert hyps
        for h in hyps:
            assert h.tokens[: len(start)] == start, (start, h.tokens)
            if len(start) + sum(len(p) for p in phrases) <= 12:
                assert all(contains(h.tokens, p) for p in phrases), (start, phrases, h.tokens)
                assert h.constraints_met
