"""The whole search step at static shapes: the model's step and the search's (beam search's
scores, top-k over beams x vocabulary, the cache's reorder, finished hypotheses, the length rules;
greedy's and sampling's choice of a token; the hooks in use) as one function of fixed tensors that
it changes in place, so that on a GPU one CUDA graph replays it
(:class:`~transformer.decoding.graphs.GraphedSearchStep`) and the host only reads, every
``sync_every`` steps, whether every sentence is done.

Nothing changes shape from step to step: beam search runs its K rows a sentence from the first
step (there one live beam, the others at -inf, as the K copies it would expand into), finished
sentences stay in the batch frozen (their live beams at -inf, rows past their eos adding
nothing) instead of leaving it, each step's token goes at the device's step count ``t`` into an
(N, L + 1) buffer of every step's tokens, and the cache is reordered in place over its whole
capacity. The step finds what the loops of :mod:`transformer.decoding.beam_search` and
:mod:`transformer.decoding.greedy` find (``tests/decoding/test_graph_search.py``).

It runs with ``decode.static_search=true`` (:func:`transformer.decoding.runtime.use_static_search`;
off by default until it has run on a GPU): one CUDA graph where cached steps replay graphs (a GPU),
eagerly elsewhere: on a CPU, what a graph would replay (the tests' path). The uncached decoder (its
shapes grow each step) always runs those loops.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer.decoding.graphs import GraphedSearchStep
from transformer.decoding.hooks import SearchHook
from transformer.decoding.options import DecodeOptions
from transformer.decoding.runtime import sync_interval, use_graphs
from transformer.decoding.step import Stepper
from transformer.model import Transformer

# (lprobs (n, V), the rows' indices (n,), the step (1,) on the device) -> (n,) ids
TokenChoice = Callable[[Tensor, Tensor, Tensor], Tensor]


def run(step: Callable[[], None], done: Tensor, steps: int, every: int, graphs: bool) -> None:
    """Run ``step`` up to ``steps`` times, from one CUDA graph with ``graphs``, until ``done``
    (a () bool tensor the step writes), which the host reads every ``every`` steps: the loop's
    one synchronisation."""
    replay = GraphedSearchStep(step) if graphs else step
    for t in range(steps):
        replay()
        if (t + 1) % every == 0 and t + 1 < steps and bool(done):
            break


class BeamStep:
    """One step of beam search over n sentences of K beams and at most L steps, on fixed tensors
    changed in place: ``tokens`` (n * K, L + 1) each beam's bos and tokens (padding after),
    ``scores`` (n, K) the live beams' log-probabilities, ``fin_scores`` (n, K) and
    ``fin_tokens`` (n, K, L) each sentence's best finished hypotheses, best first (-inf: none),
    ``done`` () every sentence done, ``t`` (1,) the steps taken. Rules as
    :func:`transformer.decoding.beam_search.beam_search`'s."""

    def __init__(
        self,
        stepper: Stepper,
        hooks: SearchHook,
        max_len: Tensor,
        options: DecodeOptions,
        steps: int,
        ids: tuple[int, int, int],
    ) -> None:
        (n,), K, device = max_len.shape, options.beam_size, max_len.device
        self.stepper, self.hooks, self.max_len, self.K = stepper, hooks, max_len, K
        self.bos_id, self.eos_id, self.pad_id = ids
        self.len_penalty = options.len_penalty
        self.tokens = torch.full((n * K, steps + 1), self.pad_id, device=device)
        self.tokens[:, 0] = self.bos_id
        self.scores = torch.full((n, K), float("-inf"), device=device)
        self.scores[:, 0] = 0.0  # the first step: one live beam a sentence
        self.fin_scores = torch.full((n, K), float("-inf"), device=device)
        self.fin_tokens = torch.full((n, K, steps), self.pad_id, device=device)
        self.done = torch.zeros((), dtype=torch.bool, device=device)
        self.t = torch.zeros(1, dtype=torch.long, device=device)
        self.sentence = torch.arange(n, device=device)  # (n,)
        self.rows = self.sentence.repeat_interleave(K)  # (n * K,) each row's sentence
        self.first_rows = self.sentence.unsqueeze(1) * K  # (n, 1)
        self.order = torch.arange(2 * K, device=device)
        self.order_eos = self.order + 2 * K  # an eos candidate ranks after every other

    def __call__(self) -> None:
        (n, K), t, eos_id = self.scores.shape, self.t, self.eos_id
        lprobs = self.stepper.step(self.tokens.index_select(1, t), t)  # (n * K, V)
        self.hooks.observe(lprobs, self.rows, 1, t)
        lprobs = self.hooks.log_probs(lprobs, self.tokens, t)  # bans; a prefix's token alone
        V = lprobs.size(-1)
        lprobs = lprobs.view(n, K, V)  # a fresh tensor: changed in place below
        last = t >= self.max_len  # (n,) at its length limit a sentence can only end
        self.hooks.beam_log_probs(lprobs, last, self.fin_scores)
        eos_scores = lprobs[..., eos_id] + self.scores  # (n, K) its candidates then
        # The others draw from every token; a sentence at its limit from its beams' eos.
        lprobs.add_(self.scores.masked_fill(last.unsqueeze(1), float("-inf")).unsqueeze(-1))
        cand_scores, cand = lprobs.view(n, K * V).topk(2 * K, dim=1)
        cand_beam, cand_tok = cand // V, cand % V  # (n, 2K)
        at_limit = last.unsqueeze(1)
        limit_scores, limit_beam = eos_scores.sort(dim=1, descending=True)
        limit_scores = F.pad(limit_scores, (0, K), value=float("-inf"))
        cand_scores = torch.where(at_limit, limit_scores, cand_scores)
        cand_beam = torch.where(at_limit, F.pad(limit_beam, (0, K)), cand_beam)
        cand_tok = cand_tok.masked_fill_(at_limit, eos_id)
        cand_scores, cand_beam, cand_tok = self.hooks.candidates(
            lprobs, cand_scores, cand_beam, cand_tok, self.sentence, t, last
        )  # constraints: by dynamic beam allocation; after a prefix: only the best ends
        self._finish(cand_scores[:, :K], cand_beam[:, :K], cand_tok[:, :K])
        self._go_on(cand_scores, cand_beam, cand_tok)
        # A sentence with K finished hypotheses, or at its length limit, is done: frozen, none
        # of its beams can finish.
        done = self.fin_scores[:, -1].gt(float("-inf")) | last  # (n,)
        self.scores.masked_fill_(done.unsqueeze(1), float("-inf"))
        self.done.copy_(done.all())
        t.add_(1)

    def _finish(self, scores: Tensor, beam: Tensor, token: Tensor) -> None:
        """The eos candidates among the top K, (n, K) each, merged with the finished so far."""
        (n, K), L, t = scores.shape, self.fin_tokens.size(-1), self.t
        finishing = token.eq(self.eos_id) & scores.gt(float("-inf"))
        normalised = scores / (t + 1).double().pow(self.len_penalty).float()
        fin_scores, pick = torch.cat(
            [self.fin_scores, normalised.masked_fill(~finishing, float("-inf"))], dim=1
        ).topk(K, dim=1)  # (n, K)
        history = self.tokens.view(n, K, L + 1)[..., 1:]  # (n, K, L) padding after t
        seqs = history.gather(1, beam.unsqueeze(-1).expand(-1, -1, L))
        seqs.scatter_(2, t.expand(n, K, 1), token.unsqueeze(-1))  # (n, K, L)
        fin_tokens = torch.cat([self.fin_tokens, seqs], 1).gather(
            1, pick.unsqueeze(-1).expand(-1, -1, L)
        )  # (n, K, L)
        self.fin_scores.copy_(fin_scores)
        self.fin_tokens.copy_(fin_tokens)

    def _go_on(self, scores: Tensor, beam: Tensor, token: Tensor) -> None:
        """Continue with the best K of the candidates (n, 2K) that did not end in eos."""
        is_eos = token.eq(self.eos_id)
        live = torch.where(is_eos, self.order_eos, self.order).topk(self.K, largest=False).indices
        scores, beam, token = (x.gather(1, live) for x in (scores, beam, token))  # (n, K)
        self.hooks.keep_beams(live)
        rows = (self.first_rows + beam).view(-1)  # (n * K,)
        self.tokens.copy_(self.tokens.index_select(0, rows))
        self.tokens.index_copy_(1, self.t + 1, token.view(-1, 1))
        if self.K > 1:  # (one beam: the rows stay as they are)
            self.stepper.reorder_in_place(rows)
        self.scores.copy_(scores)


def beam_search(
    models: list[Transformer],
    src: Tensor,
    src_pad_mask: Tensor,
    max_len: Tensor,
    hooks: SearchHook,
    options: DecodeOptions,
    ids: tuple[int, int, int],
) -> tuple[Tensor, Tensor]:
    """Beam search of ``src`` (B, S), each sentence's most tokens before eos ``max_len`` (B,),
    ``ids`` (bos, eos, pad), in eval mode -> each sentence's finished hypotheses: scores
    (B, K), best first (-inf: none), and tokens (B, K, L), eos then padding after each."""
    K, vocab = options.beam_size, models[0].cfg.tgt_vocab_size
    if vocab < 2 * K:
        raise ValueError(f"beam_size={K} needs a vocabulary of at least {2 * K} tokens")
    steps = int(max_len.max()) + 1  # eos included
    graphs = use_graphs(options, src.device)
    stepper = Stepper(models, src, src_pad_mask, True, steps, graphs, whole_step=True)
    stepper.expand_beams(K)
    hooks.static(K)
    step = BeamStep(stepper, hooks, max_len, options, steps, ids)
    run(step, step.done, steps, sync_interval(options, src), graphs)
    return step.fin_scores, step.fin_tokens


class RowStep:
    """One step of greedy decoding or sampling over n rows and at most L steps, on fixed tensors
    changed in place: ``tokens`` (n, L + 1) each row's bos and tokens (padding after its eos),
    ``total`` (n,) their log-probability, ``ended`` (n,) past eos, ``done`` () every row ended,
    ``t`` (1,) the steps taken. Rules as :func:`transformer.decoding.greedy.decode_rows`'s."""

    def __init__(
        self,
        stepper: Stepper,
        hooks: SearchHook,
        choose: TokenChoice,
        max_len: Tensor,
        steps: int,
        ids: tuple[int, int, int],
    ) -> None:
        (n,), device = max_len.shape, max_len.device
        self.stepper, self.hooks, self.choose, self.max_len = stepper, hooks, choose, max_len
        self.bos_id, self.eos_id, self.pad_id = ids
        self.tokens = torch.full((n, steps + 1), self.pad_id, device=device)
        self.tokens[:, 0] = self.bos_id
        self.total = torch.zeros(n, device=device)
        self.ended = torch.zeros(n, dtype=torch.bool, device=device)
        self.done = torch.zeros((), dtype=torch.bool, device=device)
        self.t = torch.zeros(1, dtype=torch.long, device=device)
        self.sentence = torch.arange(n, device=device)

    def __call__(self) -> None:
        t, eos_id = self.t, self.eos_id
        lprobs = self.stepper.step(self.tokens.index_select(1, t), t)  # (n, V)
        self.hooks.observe(lprobs, self.sentence, 1, t)
        lprobs = self.hooks.log_probs(lprobs, self.tokens, t)  # bans; a prefix's token alone
        token = self.choose(lprobs, self.sentence, t).masked_fill(t >= self.max_len, eos_id)
        gain = lprobs.gather(1, token.unsqueeze(1)).squeeze(1)  # (n,)
        # A row past its eos adds nothing.
        token, gain = token.masked_fill(self.ended, self.pad_id), gain.masked_fill(self.ended, 0.0)
        self.tokens.index_copy_(1, t + 1, token.unsqueeze(1))
        self.total.add_(gain)
        self.ended.logical_or_(token.eq(eos_id))
        self.done.copy_(self.ended.all())
        t.add_(1)


def decode_rows(
    models: list[Transformer],
    src: Tensor,
    src_pad_mask: Tensor,
    max_len: Tensor,
    hooks: SearchHook,
    options: DecodeOptions,
    choose: TokenChoice,
    ids: tuple[int, int, int],
) -> tuple[Tensor, Tensor]:
    """One row per sentence of ``src`` (B, S), its tokens chosen by ``choose``, each at most
    ``max_len`` (B,) before eos, ``ids`` (bos, eos, pad), in eval mode -> the tokens (B, L),
    eos then padding after each, and their log-probabilities (B,)."""
    steps = int(max_len.max()) + 1  # eos included
    graphs = use_graphs(options, src.device)
    stepper = Stepper(models, src, src_pad_mask, True, steps, graphs, whole_step=True)
    hooks.static(1)
    step = RowStep(stepper, hooks, choose, max_len, steps, ids)
    run(step, step.done, steps, sync_interval(options, src), graphs)
    return step.tokens[:, 1:], step.total
