"""Batched beam search over sentences and beams, on the KV cache.

The search keeps everything on the device: per sentence, the ``beam_size`` live prefixes and the
``beam_size`` best finished hypotheses, merged with each step's finishers by one ``topk``. Each step
draws ``2 * beam_size`` candidates, so that however many of them end in eos, ``beam_size`` live ones
remain (fairseq's rule). A sentence is done when it holds ``beam_size`` finished hypotheses or
reaches its maximum length, ``max_len_a * source_length + max_len_b`` tokens before eos; its rows
then leave the batch (its cache rows too), so the remaining sentences decode alone. The first step
runs one row per sentence (its K beams would be K copies), and so does each step at which every
sentence's token is forced by its prefix (:mod:`transformer.decoding.prefix`); the later ones K.
The only host synchronisation reads how many sentences are done: every step on the CPU, every
``sync_every`` steps elsewhere, where done sentences wait frozen (their live beams at -inf) and
then leave into one of a few batch sizes (``transformer.decoding.runtime.batch_size``), filled
with padding sentences whose hypotheses are dropped. Nothing is copied from the host in the
loop: the ids it bans are index tensors made before it. With ``decode.static_search`` (off by
default), the same rules run as one whole step at static shapes instead, K beams from the first
step and done sentences frozen to the end (:mod:`transformer.decoding.static`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer.decoding import static
from transformer.decoding.constraints import Phrases
from transformer.decoding.hooks import SearchHook
from transformer.decoding.options import DecodeOptions
from transformer.decoding.runtime import sync_interval, use_graphs, use_static_search
from transformer.decoding.search import count_done, live_rows, search_hooks, search_inputs
from transformer.decoding.step import (
    Hypothesis,
    Models,
    Stepper,
    evaluating,
)
from transformer.model import Transformer


@torch.no_grad()
def beam_search(
    model: Models,
    src: Tensor,
    options: DecodeOptions,
    *,
    bos_id: int,
    eos_id: int,
    src_pad_mask: Tensor | None = None,
    max_lengths: Tensor | None = None,
    use_cache: bool = True,
    constraints: Phrases | None = None,
    target_prefix: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """Translate ``src`` (B, S); return each sentence's ``options.nbest`` hypotheses, best first.

    Every hypothesis has between ``min_len`` and ``max_len_a * source_length + max_len_b`` tokens
    before its eos (capped by the model's ``max_positions``); its score divides the log-probability
    by its length with eos, to the power ``len_penalty`` (0: raw log-probability; above 1: longer
    hypotheses favoured more). ``max_lengths`` (B,) sets each sentence's maximum instead of
    ``max_len_a`` and ``max_len_b`` (length-controlled decoding). ``options.strategy`` is not
    read: this is the beam search. ``model``: one model, or a list of them searched as an
    ensemble (their mean probabilities). ``target_prefix`` (B, P): each translation's given
    start, the search running after it (:mod:`transformer.decoding.prefix`).

    ``constraints[i]``: phrases (lists of target ids) that sentence i's translations must contain
    (:mod:`transformer.decoding.constraints`); a hypothesis then ends only once it holds them all,
    unless its sentence reaches its length limit with none that does: then its best ends anyway,
    its ``constraints_met`` False.
    """
    models, src_pad_mask, max_len = search_inputs(model, src, options, src_pad_mask, max_lengths)
    hooks = search_hooks(models, src, options, bos_id, eos_id, target_prefix, constraints)
    max_len = hooks.lengthen(max_len, min(m.cfg.max_positions for m in models) - 1)
    with evaluating(*models):
        if use_static_search(options, src.device, use_cache):
            ids = (bos_id, eos_id, models[0].cfg.pad_id)
            out = static.beam_search(models, src, src_pad_mask, max_len, hooks, options, ids)
        else:
            out = _search(
                models, src, src_pad_mask, max_len, hooks, options, bos_id, eos_id, use_cache
            )
    nbest = options.nbest
    hyps = _hypotheses(out[0][:, :nbest].cpu(), out[1][:, :nbest].cpu(), eos_id)
    hooks.finish(hyps)
    return hyps


def _search(
    models: list[Transformer],
    src: Tensor,
    src_pad_mask: Tensor,
    max_len: Tensor,
    hooks: SearchHook,
    options: DecodeOptions,
    bos_id: int,
    eos_id: int,
    use_cache: bool,
) -> tuple[Tensor, Tensor]:
    """The search whose done sentences leave the batch -> the finished hypotheses' scores
    (B, K), best first (-inf: none), and tokens (B, K, L), eos then padding after each."""
    pad_id, len_penalty = models[0].cfg.pad_id, options.len_penalty
    B, K, device = src.size(0), options.beam_size, src.device
    L = int(max_len.max()) + 1  # steps, eos included
    every = sync_interval(options, src)
    # Row B takes the hypotheses of the padding sentences of a batch (dropped at the end).
    out_scores = torch.full((B + 1, K), float("-inf"), device=device)
    out_tokens = torch.full((B + 1, K, L), pad_id, device=device)

    stepper = Stepper(models, src, src_pad_mask, use_cache, L, use_graphs(options, device))
    # The n unfinished sentences, each with k live prefixes (1 at first and while every
    # sentence's token is forced, then K) in consecutive rows, and its K best finished
    # hypotheses so far.
    sentence = torch.arange(B, device=device)  # (n,) their rows in the output
    prefixes = torch.full((B, 1), bos_id, device=device)  # (n * k, t + 1)
    scores = torch.zeros(B, 1, device=device)  # (n, k)
    fin_scores = torch.full((B, K), float("-inf"), device=device)
    fin_tokens = torch.full((B, K, L), pad_id, device=device)
    order = torch.arange(2 * K, device=device)
    order_eos = order + 2 * K  # an eos candidate ranks after every other
    first_rows = torch.arange(B, device=device).unsqueeze(1)  # (n, 1) k * its first row
    forced = hooks.forced_steps()  # steps at which every sentence's token is given: one row each

    for t in range(L):  # t tokens generated so far
        n, k = scores.shape
        lprobs = stepper.log_probs(prefixes)  # (n * k, V)
        hooks.observe(lprobs, sentence, k, t)
        lprobs = hooks.log_probs(lprobs, prefixes, t)  # bans; a prefix's token alone
        V = lprobs.size(-1)
        if k * V < 2 * K:
            raise ValueError(f"beam_size={K} needs a vocabulary of at least {2 * K} tokens")
        lprobs = lprobs.view(n, k, V)  # a fresh tensor: changed in place below
        last = t >= max_len  # (n,) at its length limit a sentence can only end
        hooks.beam_log_probs(lprobs, last, fin_scores)
        eos_scores = lprobs[..., eos_id] + scores  # (n, k) its candidates then
        # The others draw from every token; a sentence at its limit from its beams' eos.
        lprobs.add_(scores.masked_fill(last.unsqueeze(1), float("-inf")).unsqueeze(-1))
        cand_scores, cand = lprobs.view(n, k * V).topk(2 * K, dim=1)
        cand_beam, cand_tok = cand // V, cand % V  # (n, 2K)
        at_limit, pad = last.unsqueeze(1), (0, 2 * K - k)
        limit_scores, limit_beam = eos_scores.sort(dim=1, descending=True)
        limit_scores = F.pad(limit_scores, pad, value=float("-inf"))
        cand_scores = torch.where(at_limit, limit_scores, cand_scores)
        cand_beam = torch.where(at_limit, F.pad(limit_beam, pad), cand_beam)
        cand_tok = cand_tok.masked_fill_(at_limit, eos_id)
        cand_scores, cand_beam, cand_tok = hooks.candidates(
            lprobs, cand_scores, cand_beam, cand_tok, sentence, t, last
        )  # constraints: by dynamic beam allocation; after a prefix: only the best ends

        history = prefixes.view(n, k, t + 1)[..., 1:].gather(
            1, cand_beam.unsqueeze(-1).expand(-1, -1, t)
        )  # (n, 2K, t)
        cand_seq = torch.cat([history, cand_tok.unsqueeze(-1)], dim=-1)  # (n, 2K, t + 1)

        # Finish the eos candidates among the top K, merged with the finished so far.
        finishing = cand_tok[:, :K].eq(eos_id) & cand_scores[:, :K].gt(float("-inf"))
        normalised = cand_scores[:, :K] / (t + 1) ** len_penalty
        fin_scores, pick = torch.cat(
            [fin_scores, normalised.masked_fill(~finishing, float("-inf"))], dim=1
        ).topk(K, dim=1)  # (n, K)
        new_tokens = F.pad(cand_seq[:, :K], (0, L - t - 1), value=pad_id)
        fin_tokens = torch.cat([fin_tokens, new_tokens], 1).gather(
            1, pick.unsqueeze(-1).expand(-1, -1, L)
        )  # (n, K, L)

        # Continue with the best K candidates that did not end in eos (the best one while
        # the next step's token is forced for every sentence).
        k_next = 1 if t + 1 < forced else K
        is_eos = cand_tok.eq(eos_id)
        live = torch.where(is_eos, order_eos, order).topk(k_next, dim=1, largest=False).indices
        scores, beam = cand_scores.gather(1, live), cand_beam.gather(1, live)  # (n, k_next)
        token = cand_tok.gather(1, live)
        hooks.keep_beams(live)
        rows = first_rows + beam
        prefixes = torch.cat([prefixes[rows.view(-1)], token.view(-1, 1)], 1)
        if k < k_next:  # the first free step next: each sentence's row becomes its K beams' rows
            stepper.expand_beams(K)
            rows = torch.arange(n * K, device=device).view(n, K)
            first_rows = rows[:, :1]

        # A sentence with K finished hypotheses, or at its length limit, is done. Read
        # between steps, a done sentence waits, frozen: none of its beams can finish.
        done = fin_scores[:, -1].gt(float("-inf")) | last  # (n,)
        if every > 1:
            scores.masked_fill_(done.unsqueeze(1), float("-inf"))
        n_done, size = count_done(done, t, L, every)  # read on the host every `every` steps
        if n_done == n:
            break
        if size == n:  # the batch keeps its rows
            if k > 1:  # (one beam, or just expanded: the rows stay as they are)
                stepper.reorder(rows.view(-1))
            continue
        # Done sentences leave: their hypotheses go to the output, the others to a batch of
        # `size` sentences. Index tensors of sizes known on the host: no boolean masks.
        finished = done.nonzero_static(size=n_done).squeeze(1)  # (n_done,)
        out_scores[sentence[finished]] = fin_scores[finished]
        out_tokens[sentence[finished]] = fin_tokens[finished]
        n_live = n - n_done
        keep = live_rows(done, n_live, size)  # (size,) padding sentences: copies of the first
        stepper.reorder(rows[keep].view(-1), sentences=keep)
        sentence, scores, max_len = sentence[keep], scores[keep], max_len[keep]
        fin_scores, fin_tokens = fin_scores[keep], fin_tokens[keep]
        hooks.keep(keep)
        prefixes = prefixes.view(n, k_next, t + 2)[keep].view(-1, t + 2)
        first_rows = k_next * torch.arange(size, device=device).unsqueeze(1)
        if size > n_live:  # padding sentences: done from the start, their output dropped
            sentence[n_live:], max_len[n_live:], scores[n_live:] = B, -1, float("-inf")
    out_scores[sentence] = fin_scores  # the sentences done at the last step
    out_tokens[sentence] = fin_tokens
    return out_scores[:B], out_tokens[:B]


def _hypotheses(scores: Tensor, tokens: Tensor, eos_id: int) -> list[list[Hypothesis]]:
    result = []
    for sent_scores, sent_tokens in zip(scores.tolist(), tokens.tolist(), strict=True):
        hyps = []
        for score, seq in zip(sent_scores, sent_tokens, strict=True):
            if score != float("-inf"):
                hyps.append(Hypothesis(seq[: seq.index(eos_id)], score))
        result.append(hyps)
    return result
