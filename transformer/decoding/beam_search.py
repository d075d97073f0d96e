"""Batched beam search over sentences and beams, on the KV cache.

The search keeps everything on the device: per sentence, the ``beam_size`` live prefixes and the
``beam_size`` best finished hypotheses, merged with each step's finishers by one ``topk``. Each step
draws ``2 * beam_size`` candidates, so that however many of them end in eos, ``beam_size`` live ones
remain (fairseq's rule). A sentence is done when it holds ``beam_size`` finished hypotheses or
reaches its maximum length, ``max_len_a * source_length + max_len_b`` tokens before eos. The only
host synchronisation per step is the check whether every sentence is done.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from transformer.decoding.greedy import max_output_lengths
from transformer.decoding.step import Stepper, evaluating
from transformer.masks import padding_mask
from transformer.model import Transformer


@dataclass
class Hypothesis:
    tokens: list[int]  # generated ids, without bos and eos
    score: float  # sum of token log-probabilities (eos included) / length ** len_penalty


def ban_repeated_ngrams(lprobs: Tensor, generated: Tensor, n: int) -> Tensor:
    """Forbid any token that would repeat an n-gram already in ``generated`` (N, t): (N, V)."""
    t = generated.size(1)
    if n <= 0 or t < n:
        return lprobs
    windows = generated.unfold(1, n, 1)  # (N, t - n + 1, n)
    match = (windows[..., :-1] == generated[:, None, t - n + 1 :]).all(-1)  # (N, t - n + 1)
    banned = torch.zeros_like(lprobs).scatter_add_(1, windows[..., -1], match.to(lprobs.dtype))
    return lprobs.masked_fill(banned > 0, float("-inf"))


@torch.no_grad()
def beam_search(
    model: Transformer,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    src_pad_mask: Tensor | None = None,
    beam_size: int = 5,
    len_penalty: float = 1.0,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    min_len: int = 1,
    nbest: int = 1,
    no_repeat_ngram_size: int = 0,
    use_cache: bool = True,
) -> list[list[Hypothesis]]:
    """Translate ``src`` (B, S); return each sentence's ``nbest`` hypotheses, best first.

    Every hypothesis has between ``min_len`` and ``max_len_a * source_length + max_len_b`` tokens
    before its eos (capped by the model's ``max_positions``); its score divides the log-probability
    by its length with eos, to the power ``len_penalty`` (0: raw log-probability; above 1: longer
    hypotheses favoured more).
    """
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest={nbest} must be between 1 and beam_size={beam_size}")
    if min_len < 0:
        raise ValueError(f"min_len={min_len} must be >= 0")
    pad_id = model.cfg.pad_id
    if src_pad_mask is None:
        src_pad_mask = padding_mask(src, pad_id)
    B, K, device = src.size(0), beam_size, src.device
    max_len = max_output_lengths(
        (~src_pad_mask).sum(1), max_len_a, max_len_b, min_len, model.cfg.max_positions - 1
    )  # (B,) tokens before eos; the decoder reads bos + every token but eos
    L = int(max_len.max()) + 1  # steps, eos included

    with evaluating(model):
        stepper = Stepper(model, src, src_pad_mask, use_cache)
        stepper.expand_beams(K)  # K rows per sentence
        prefixes = torch.full((B * K, 1), bos_id, device=device)  # (B*K, t + 1)
        scores = torch.full((B, K), float("-inf"), device=device)
        scores[:, 0] = 0.0  # one live beam at first, or the K beams would be K copies
        fin_scores = torch.full((B, K), float("-inf"), device=device)
        fin_tokens = torch.full((B, K, L), pad_id, device=device)
        done = torch.zeros(B, dtype=torch.bool, device=device)
        row_offset = torch.arange(B, device=device).unsqueeze(1) * K  # (B, 1)
        order = torch.arange(2 * K, device=device)

        for t in range(L):  # t tokens generated so far
            lprobs = stepper.log_probs(prefixes)  # (B*K, V)
            lprobs[:, [pad_id, bos_id]] = float("-inf")
            if t < min_len:
                lprobs[:, eos_id] = float("-inf")
            lprobs = ban_repeated_ngrams(lprobs, prefixes[:, 1:], no_repeat_ngram_size)
            V = lprobs.size(-1)
            lprobs = lprobs.view(B, K, V)
            last = (t >= max_len).view(B, 1, 1)  # this token must be eos
            not_eos = torch.arange(V, device=device) != eos_id
            lprobs = lprobs.masked_fill(last & not_eos, float("-inf"))

            cand_scores, cand = (scores.unsqueeze(-1) + lprobs).view(B, K * V).topk(2 * K, dim=1)
            cand_beam, cand_tok = cand // V, cand % V  # (B, 2K)
            history = prefixes.view(B, K, t + 1)[..., 1:].gather(
                1, cand_beam.unsqueeze(-1).expand(-1, -1, t)
            )  # (B, 2K, t)
            cand_seq = torch.cat([history, cand_tok.unsqueeze(-1)], dim=-1)  # (B, 2K, t + 1)

            # Finish the eos candidates among the top K, merged with the finished so far.
            is_eos = cand_tok.eq(eos_id) & cand_scores.isfinite()
            finishing = is_eos[:, :K] & ~done.unsqueeze(1)
            normalised = cand_scores[:, :K] / (t + 1) ** len_penalty
            fin_scores, pick = torch.cat(
                [fin_scores, normalised.masked_fill(~finishing, float("-inf"))], dim=1
            ).topk(K, dim=1)  # (B, K)
            new_tokens = torch.nn.functional.pad(cand_seq[:, :K], (0, L - t - 1), value=pad_id)
            fin_tokens = torch.cat([fin_tokens, new_tokens], 1).gather(
                1, pick.unsqueeze(-1).expand(-1, -1, L)
            )  # (B, K, L)

            # Continue with the best K candidates that did not end in eos.
            live = torch.where(is_eos, order + 2 * K, order).topk(K, dim=1, largest=False).indices
            scores = cand_scores.gather(1, live)
            done = done | fin_scores[:, -1].isfinite() | last.view(B)
            scores = scores.masked_fill(done.unsqueeze(1), float("-inf"))
            rows = (row_offset + cand_beam.gather(1, live)).view(-1)  # (B*K,)
            stepper.reorder(rows)
            prefixes = torch.cat([prefixes[rows], cand_tok.gather(1, live).view(-1, 1)], dim=1)
            if bool(done.all()):
                break

    return _hypotheses(fin_scores[:, :nbest].cpu(), fin_tokens[:, :nbest].cpu(), eos_id)


def _hypotheses(scores: Tensor, tokens: Tensor, eos_id: int) -> list[list[Hypothesis]]:
    result = []
    for sent_scores, sent_tokens in zip(scores.tolist(), tokens.tolist(), strict=True):
        hyps = []
        for score, seq in zip(sent_scores, sent_tokens, strict=True):
            if score != float("-inf"):
                hyps.append(Hypothesis(seq[: seq.index(eos_id)], score))
        result.append(hyps)
    return result
