"""Forced decoding: batched, padded token log-probabilities against one teacher-forced call per
sentence; the scores the searches give their own output."""

import pytest
import torch

from tests.tiny import tiny_model
from transformer.data.collate import pad
from transformer.decoding import DecodeOptions, beam_search, sample
from transformer.decoding.scoring import sentence_score, token_log_probs

PAD, BOS, EOS = 0, 2, 3


def pairs(seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Sources (x + eos) and targets (y, no eos) of different lengths, one target empty."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [(5, 3), (2, 7), (8, 0), (3, 4)]
    srcs = [[*torch.randint(4, 40, (s,), generator=gen).tolist(), EOS] for s, _ in lengths]
    tgts = [torch.randint(4, 40, (t,), generator=gen).tolist() for _, t in lengths]
    return srcs, tgts


@torch.no_grad()
def brute_force(models, src: list[int], tgt: list[int]) -> list[float]:
    """One unpadded call per model; the log of the mean of their probabilities of y + eos."""
    probs = [m(torch.tensor([src]), torch.tensor([[BOS, *tgt]]))[0].softmax(-1) for m in models]
    mean = sum(probs) / len(probs)  # (t + 1, V)
    return mean.log().gather(1, torch.tensor([[*tgt, EOS]]).T).squeeze(1).tolist()


def batched(models, srcs, tgts) -> torch.Tensor:
    src = pad(srcs, PAD)
    tgt_in = pad([[BOS, *t] for t in tgts], PAD)
    labels = pad([[*t, EOS] for t in tgts], PAD)
    return token_log_probs(models, src, tgt_in, labels)


@pytest.mark.parametrize("ensemble", [1, 2])
def test_token_log_probs_equal_one_teacher_forced_call_per_sentence(ensemble: int) -> None:
    torch.manual_seed(0)
    models = [tiny_model(40) for _ in range(ensemble)]
    srcs, tgts = pairs()
    out = batched(models if ensemble > 1 else models[0], srcs, tgts)  # (B, T)
    for row, src, tgt in zip(out, srcs, tgts, strict=True):
        expected = brute_force(models, src, tgt)
        assert row[: len(tgt) + 1].tolist() == pytest.approx(expected, abs=1e-5)
        assert row[len(tgt) + 1 :].eq(0).all()  # padding


def test_the_searches_scores_are_the_forced_scores_of_their_output() -> None:
    """Scoring the n-best of beam search and of sampling gives back their scores: the score is
    the same formula, log-probability / length ** len_penalty, wherever it comes from."""
    torch.manual_seed(1)
    models = [tiny_model(40), tiny_model(40)]
    srcs, _ = pairs(1)
    src = pad(srcs, PAD)
    for options in (
        DecodeOptions(beam_size=3, nbest=3, max_len_b=6, len_penalty=0.6),
        DecodeOptions(strategy="sample", nbest=2, max_len_b=6, len_penalty=0.0, top_p=0.9),
    ):
        search = beam_search if options.strategy == "beam" else sample
        hyps = search(models, src, options, bos_id=BOS, eos_id=EOS)
        for s, sentence in zip(srcs, hyps, strict=True):
            tgts = [h.tokens for h in sentence]
            scores = batched(models, [s] * len(tgts), tgts)
            for h, row in zip(sentence, scores, strict=True):
                forced = sentence_score(row[: len(h.tokens) + 1].tolist(), options.len_penalty)
                assert h.score == pytest.approx(forced, abs=1e-4)
