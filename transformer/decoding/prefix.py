"""Prefix-constrained decoding: each sentence's translation starts with given tokens (interactive
translation, forced prefixes; CTranslate2's ``target_prefix``, fairseq's ``--prefix-size``).

A search given ``target_prefix`` (B, P), ids padded with the pad id (a row of pads: no prefix),
steps the model on its cache as usual but, at step t < the sentence's prefix length, takes the
prefix's token t, whatever the model prefers and whatever it bans (n-grams, eos before
``min_len``); the search proper starts after it. Beam search keeps one live beam per sentence
during its prefix (every beam would be a copy): one row a sentence while every sentence of the
batch is within its prefix (:meth:`ForcedPrefix.forced_steps`), then K rows, those of a sentence
still within its prefix all at -inf but one. At the first step after a prefix it lets only the
best candidate be eos (CTranslate2's rule, :meth:`ForcedPrefix.no_early_eos`).

Lengths count the whole hypothesis, prefix included (``min_len``, ``max_len_a * src_len +
max_len_b``, the length that ``len_penalty`` divides by), as CTranslate2's do; a sentence's
maximum is raised to its prefix's length where shorter, so that a hypothesis always starts with
its whole prefix (CTranslate2 cuts the prefix instead). ``decode.score_prefix`` says whether the
prefix's log-probabilities count in the score: by default not, as CTranslate2 returns it, since
the prefix was given, not found. It adds one constant to all of a sentence's hypotheses: with
``len_penalty=0`` the search is the same either way; with length normalisation that constant,
divided by each hypothesis' length, favours longer hypotheses when counted.
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer.decoding.hooks import SearchHook


class ForcedPrefix(SearchHook):
    """The prefixes a search forces: ``tokens`` (B + 1, P) and ``lengths`` (B + 1,), the last row
    a padding row's (no prefix), so that a batch's padding rows (index B) read it. As a
    :class:`~transformer.decoding.hooks.SearchHook`: each sentence's maximum length raised to its
    prefix's, its token at each step of the prefix (:meth:`observe`, then :meth:`log_probs`),
    and no early eos after it (:meth:`candidates`)."""

    def __init__(
        self, target_prefix: Tensor, pad_id: int, bos_id: int, eos_id: int, score: bool
    ) -> None:
        if target_prefix.dim() != 2:
            raise ValueError(f"target_prefix must be (B, P) ids, got shape {target_prefix.shape}")
        real = target_prefix.ne(pad_id)  # (B, P)
        self.lengths = real.sum(1)  # (B,)
        for name, id_ in (("bos", bos_id), ("eos", eos_id)):
            if bool(target_prefix.eq(id_).any()):
                raise ValueError(f"a target prefix holds the {name} id {id_}: give its pieces only")
        positions = torch.arange(target_prefix.size(1), device=target_prefix.device)
        if not bool(real.eq(positions < self.lengths.unsqueeze(1)).all()):
            raise ValueError("a target prefix has padding before its last token: pad at the end")
        pad_row = torch.full_like(target_prefix[:1], pad_id)
        self.tokens = torch.cat([target_prefix, pad_row])  # (B + 1, P)
        self.lengths = torch.cat([self.lengths, self.lengths.new_zeros(1)])  # (B + 1,)
        self.ends = self.lengths.masked_fill(self.lengths.eq(0), -1)  # (B + 1,) -1: no prefix
        self.steps, self.score = target_prefix.size(1), score
        self.pad_id, self.eos_id = pad_id, eos_id
        self.step: tuple[Tensor, Tensor, Tensor] | None = None  # this step's :meth:`at`

    @classmethod
    def of(
        cls,
        target_prefix: Tensor | None,
        pad_id: int,
        bos_id: int,
        eos_id: int,
        score: bool,
    ) -> ForcedPrefix | None:
        """None where nothing is forced: no ``target_prefix``, or only empty ones (the search
        then runs exactly as unconstrained)."""
        if target_prefix is None or not bool(target_prefix.ne(pad_id).any()):
            return None
        return cls(target_prefix, pad_id, bos_id, eos_id, score)

    def lengthen(self, max_len: Tensor, cap: int) -> Tensor:
        """(B,) most tokens before eos, raised to each prefix's length; a prefix longer than the
        model's positions allow (``cap``) is a ValueError."""
        lengths = self.lengths[:-1].to(max_len.device)
        if int(lengths.max()) > cap:
            raise ValueError(
                f"a target prefix of {int(lengths.max())} tokens is longer than the model's "
                f"positions allow ({cap} tokens before eos)"
            )
        return torch.maximum(max_len, lengths)

    def forced_steps(self) -> int:
        """The shortest prefix of the batch: the steps that force every sentence's token."""
        return int(self.lengths[:-1].min())

    def observe(self, lprobs: Tensor, sentences: Tensor, k: int, t: int | Tensor) -> None:
        """Within the prefixes (``t`` below their longest; a static step's, always), which rows
        they force at this step, read before any ban changes ``lprobs`` (:meth:`at`)."""
        rows = sentences.repeat_interleave(k) if k > 1 else sentences  # (n * k,)
        within = isinstance(t, Tensor) or t < self.steps
        self.step = self.at(lprobs, rows, t) if within else None

    def log_probs(self, lprobs: Tensor, prefixes: Tensor, t: int | Tensor) -> Tensor:
        """Each forced row's prefix token alone (:meth:`only`), whatever was banned."""
        return lprobs if self.step is None else self.only(lprobs, *self.step)

    def candidates(
        self,
        lprobs: Tensor,
        scores: Tensor,
        beams: Tensor,
        tokens: Tensor,
        sentences: Tensor,
        t: int | Tensor,
        last: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """At the first step after a sentence's prefix, only the best candidate may end
        (:meth:`no_early_eos`)."""
        if isinstance(t, Tensor) or 0 < t <= self.steps:
            tokens, scores = self.no_early_eos(tokens, scores, sentences, t, last)
        return scores, beams, tokens

    def at(
        self, lprobs: Tensor, sentences: Tensor, t: int | Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """lprobs (N, V), before any ban, of rows of ``sentences`` (N,) at step ``t`` -> which
        rows are forced (N,), the prefix token they take (N,) and its gain (N,): its
        log-probability with ``score``, else 0. A static step's ``t`` (1,) may be past them."""
        forced = self.lengths[sentences] > t  # (N,)
        column = t if isinstance(t, int) else t.clamp(max=self.steps - 1)
        token = self.tokens[sentences, column]  # (N,) pad where not forced
        gain = lprobs.gather(1, token.unsqueeze(1)).squeeze(1) if self.score else None
        return forced, token, torch.zeros_like(lprobs[:, 0]) if gain is None else gain

    def no_early_eos(
        self, tokens: Tensor, scores: Tensor, sentences: Tensor, t: int | Tensor, last: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Beam search's candidates (n, 2K), best first, of ``sentences`` (n,) at step ``t``: at
        the first step after a sentence's prefix, an eos candidate but the best becomes a dead
        one (pad, -inf), unless ``last`` (n,), at its length limit. CTranslate2's rule (its issue
        #277): else an eos right after the prefix, its own beam's second choice, finishes a
        hypothesis that without length normalisation too often wins."""
        after = (self.ends[sentences] == t) & ~last  # (n,)
        drop = after.unsqueeze(1) & tokens.eq(self.eos_id)  # (n, 2K)
        drop[:, 0].fill_(False)  # (a fill: no value copied from the host, as a graph needs)
        return tokens.masked_fill(drop, self.pad_id), scores.masked_fill(drop, float("-inf"))

    @staticmethod
    def only(lprobs: Tensor, forced: Tensor, token: Tensor, gain: Tensor) -> Tensor:
        """lprobs (N, V) with each ``forced`` row's every id at -inf but ``token``, at ``gain``."""
        row = torch.full_like(lprobs, float("-inf")).scatter_(1, token.unsqueeze(1), gain[:, None])
        return torch.where(forced.unsqueeze(1), row, lprobs)
