"""Lexically constrained beam search: target phrases that every translation must contain.

Dynamic beam allocation (Post & Vilar 2018), on tensors over sentences and beams as Hu et al.
(2019) vectorise it. Each sentence has up to C phrases, each a sequence of target ids. A beam
tracks, for every phrase, whether it is met and how many of its tokens the output ends with (a
Knuth-Morris-Pratt automaton, so that "a a b" is found in "a a a b"). Each step's candidates are
the search's usual top ``2 * beam_size``, plus for every beam its best token and the next token of
each of its unmet phrases; a candidate's bank is the number of constraint tokens it holds (the
tokens of its met phrases and of the longest one in progress). The candidates are ordered by
taking from the banks in turn, the fullest bank first, the best candidate of each (fairseq's
"stripes"), so the fullest bank always advances; as in the plain search, the first K that end in
eos finish and the first K others live on. A hypothesis may end only once all its phrases are
met.

A phrase matches only where the output has its very pieces: one encoded on its own may be
segmented otherwise inside a sentence (as in fairseq and Post & Vilar's search).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from transformer.decoding.hooks import SearchHook
from transformer.decoding.step import Hypothesis

Phrases = Sequence[Sequence[Sequence[int]]]  # per sentence, its phrases, each a list of ids


def _automaton(phrase: Sequence[int], width: int) -> list[list[int]]:
    """(width, width): [j][m] is how many tokens of ``phrase`` the output ends with after it
    ended with ``j`` of them and then produced ``phrase[m]`` (the longest prefix of the phrase
    that is a suffix of ``phrase[:j] + [phrase[m]]``); any other token leads to 0."""
    n = len(phrase)
    table = [[0] * width for _ in range(width)]
    for j in range(n):
        for m in range(n):
            seen = [*phrase[:j], phrase[m]]
            table[j][m] = next(
                size
                for size in range(min(n, j + 1), -1, -1)
                if seen[j + 1 - size :] == phrase[:size]
            )
    return table


def contains(tokens: Sequence[int], phrase: Sequence[int]) -> bool:
    """Whether ``phrase`` occurs in ``tokens`` as consecutive ids."""
    n = len(phrase)
    return any(list(tokens[i : i + n]) == list(phrase) for i in range(len(tokens) - n + 1))


class Constraints(SearchHook):
    """The phrases of the n sentences of a beam search and each beam's progress through them.

    ``phrases[i]`` are sentence i's (possibly none). Ids must be generated ones: not ``special``
    (the pad, bos and eos ids, in that order), below ``vocab_size``. The state follows the search
    (:class:`~transformer.decoding.hooks.SearchHook`): :meth:`beam_log_probs` bans eos before a
    step's candidates are drawn, :meth:`candidates` draws them, :meth:`keep_beams` once its live
    beams are chosen, :meth:`keep` when sentences leave the batch; :meth:`finish` says which
    hypotheses hold every phrase.
    """

    def __init__(
        self, phrases: Phrases, vocab_size: int, special: Sequence[int], device: torch.device
    ) -> None:
        for i, sentence in enumerate(phrases):
            for phrase in sentence:
                bad = [t for t in phrase if not 0 <= t < vocab_size or t in special]
                if not phrase or bad:
                    raise ValueError(
                        f"sentence {i}: constraint {list(phrase)} must be a non-empty list of "
                        f"generated ids (below {vocab_size}, not {sorted(special)})"
                    )
        self.phrases, self.eos_id = phrases, special[-1]
        B = len(phrases)
        C = max(len(s) for s in phrases)
        P = max(len(p) for s in phrases for p in s)
        tokens = torch.full((B, C, P), -1, dtype=torch.long)
        lengths = torch.zeros(B, C, dtype=torch.long)
        table = torch.zeros(B, C, P, P, dtype=torch.long)
        for i, sentence in enumerate(phrases):
            for c, phrase in enumerate(sentence):
                tokens[i, c, : len(phrase)] = torch.tensor(phrase)
                lengths[i, c] = len(phrase)
                table[i, c] = torch.tensor(_automaton(phrase, P))
        self.tokens = tokens.to(device)  # (n, C, P) each phrase's ids, -1 after its end
        self.lengths = lengths.to(device).unsqueeze(1)  # (n, 1, C) 0: no phrase
        self.table = table.view(B, 1, C, P * P).to(device)  # (n, 1, C, P * P) the automata
        self.most = int(lengths.sum(1).max())  # the most constraint tokens of a sentence
        self.met = self.lengths.eq(0)  # (n, k, C) a phrase is met (an absent one is)
        self.progress = torch.zeros_like(self.lengths)  # (n, k, C) its tokens the output ends with
        self.in_place = False  # a static search: the state keeps its shape and its address

    @classmethod
    def of(
        cls,
        phrases: Phrases | None,
        sentences: int,
        vocab_size: int,
        special: Sequence[int],
        device: torch.device,
    ) -> Constraints | None:
        """The constraints of ``phrases`` (a list for each of the ``sentences``), or None where
        no sentence has any: a plain search."""
        if phrases is not None and len(phrases) != sentences:
            raise ValueError(f"{len(phrases)} lists of constraints for {sentences} sentences")
        if phrases is None or not any(len(s) for s in phrases):
            return None
        return cls(phrases, vocab_size, special, device)

    def beam_log_probs(self, lprobs: Tensor, last: Tensor, fin_scores: Tensor) -> None:
        """Forbid eos (in ``lprobs`` (n, k, V), in place) to every beam with an unmet phrase,
        unless its sentence is ``last`` (n,) at its length limit with no finished hypothesis
        (``fin_scores`` (n, K), best first) and no beam that meets them all: then its best
        hypothesis ends anyway, unmet."""
        finished = fin_scores[:, 0].gt(float("-inf"))  # (n,)
        all_met = self.met.all(-1)  # (n, k)
        anyway = last & ~finished & ~all_met.any(1)  # (n,)
        lprobs[..., self.eos_id].masked_fill_(~(all_met | anyway.unsqueeze(1)), float("-inf"))

    def candidates(
        self,
        lprobs: Tensor,
        cand_scores: Tensor,
        cand_beam: Tensor,
        cand_tok: Tensor,
        sentences: Tensor,
        t: int | Tensor,
        last: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The step's 2K candidates by dynamic beam allocation, best first, in place of the
        search's: cand_* (n, 2K) its best scores, source beams and tokens; lprobs (n, k, V) each
        beam's score plus each token's log-probability. Like the search's, the first K that end
        in eos finish and the first K others live (:meth:`keep_beams`)."""
        n, k, V = lprobs.shape
        # Each beam's best token, and the next token of each of its unmet phrases.
        best = lprobs.max(dim=-1, keepdim=True)  # (n, k, 1)
        next_tok = self.tokens.unsqueeze(1).expand(-1, k, -1, -1)
        next_tok = next_tok.gather(-1, self.progress.unsqueeze(-1)).squeeze(-1).clamp(min=0)
        forced = lprobs.gather(-1, next_tok).masked_fill(self.met, float("-inf"))  # (n, k, C)
        beams = torch.arange(k, device=lprobs.device).view(1, k, 1)
        extra = torch.cat([best.values, forced], -1)  # (n, k, 1 + C)
        scores = torch.cat([cand_scores, extra.view(n, -1)], 1)  # (n, M)
        beam = torch.cat([cand_beam, beams.expand_as(extra).reshape(n, -1)], 1)
        tok = torch.cat([cand_tok, torch.cat([best.indices, next_tok], -1).view(n, -1)], 1)
        # A (beam, token) pair drawn twice counts once.
        key, order = (beam * V + tok).sort(dim=1, stable=True)
        scores, beam, tok = scores.gather(1, order), beam.gather(1, order), tok.gather(1, order)
        scores[:, 1:].masked_fill_(key[:, 1:].eq(key[:, :-1]), float("-inf"))

        met, progress = self._advance(beam, tok)  # (n, M, C) each
        banks = (self.lengths * met).sum(-1) + progress.max(-1).values  # (n, M)
        banks = banks.masked_fill(scores.eq(float("-inf")), -1)
        # Round-robin over the banks, fullest first, each bank's candidates best first.
        by_score = scores.sort(dim=1, descending=True, stable=True).indices
        bank_sorted, by_bank = banks.gather(1, by_score).sort(dim=1, descending=True, stable=True)
        order = by_score.gather(1, by_bank)  # (n, M) by bank, then by score
        position = torch.arange(order.size(1), device=lprobs.device).expand_as(order)
        starts = torch.ones_like(bank_sorted, dtype=torch.bool)
        starts[:, 1:] = bank_sorted[:, 1:].ne(bank_sorted[:, :-1])
        rank = position - position.masked_fill(~starts, 0).cummax(1).values  # within its bank
        stripes = self.most + 2
        turn = rank * stripes + (self.most - bank_sorted)
        turn = turn.masked_fill(bank_sorted.lt(0), stripes * order.size(1))  # -inf: last
        pick = turn.topk(cand_scores.size(1), dim=1, largest=False).indices
        chosen = order.gather(1, pick)  # (n, 2K) in turn
        index = chosen.unsqueeze(-1).expand(-1, -1, met.size(-1))
        self.drawn = met.gather(1, index), progress.gather(1, index)  # (n, 2K, C) each
        return scores.gather(1, chosen), beam.gather(1, chosen), tok.gather(1, chosen)

    def static(self, beams: int) -> None:
        """Every sentence's ``beams`` rows from the first step, its state changed in place."""
        self.met = self.met.expand(-1, beams, -1).clone()
        self.progress = self.progress.expand(-1, beams, -1).clone()
        self.in_place = True

    def keep_beams(self, live: Tensor) -> None:
        """The state of the live beams, ``live`` (n, K) of the candidates drawn last."""
        index = live.unsqueeze(-1).expand(-1, -1, self.met.size(-1))
        met, progress = (state.gather(1, index) for state in self.drawn)
        if self.in_place:
            self.met.copy_(met)
            self.progress.copy_(progress)
        else:
            self.met, self.progress = met, progress

    def _advance(self, beam: Tensor, tok: Tensor) -> tuple[Tensor, Tensor]:
        """Each candidate's phrases met and progress (n, M, C), after beam (n, M) emits tok."""
        C = self.met.size(-1)
        index = beam.unsqueeze(-1).expand(-1, -1, C)
        met, progress = self.met.gather(1, index), self.progress.gather(1, index)  # (n, M, C)
        P = self.tokens.size(-1)
        same = self.tokens.unsqueeze(1).eq(tok.view(*tok.shape, 1, 1))  # (n, M, C, P)
        m = same.int().argmax(-1)  # where the phrase has the token (any such place: one state)
        table = self.table.expand(-1, tok.size(1), -1, -1)
        after = table.gather(-1, (progress * P + m).unsqueeze(-1)).squeeze(-1)
        after = after.masked_fill(~same.any(-1), 0)
        met = met | after.eq(self.lengths)
        return met, after.masked_fill(met, 0)

    def keep(self, index: Tensor) -> None:
        """Keep sentences ``index`` (n',) in that order (as beam search keeps its rows)."""
        for name in ("tokens", "lengths", "table", "met", "progress"):
            setattr(self, name, getattr(self, name)[index])

    def finish(self, hypotheses: list[list[Hypothesis]]) -> None:
        """Mark each hypothesis with whether it holds every phrase of its sentence."""
        for sentence_hyps, wanted in zip(hypotheses, self.phrases, strict=True):
            for h in sentence_hyps:
                h.constraints_met = all(contains(h.tokens, p) for p in wanted)
