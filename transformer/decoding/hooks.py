"""The moments of a search step where an optional feature acts, declared once.

A feature of decoding (banned ids, a forced prefix, terminology constraints) is a
:class:`SearchHook`: it overrides the moments it needs, and every other one is a no-op that launches
no kernel. The searches (greedy, sampling: :func:`transformer.decoding.greedy.decode_rows`; beam:
:func:`transformer.decoding.beam_search.beam_search`) call the moments of their :class:`Hooks`
without branching on which features are on. In step order:

1. :meth:`SearchHook.lengthen`, once before the loop: each sentence's most tokens before eos;
   beam search then asks :meth:`SearchHook.forced_steps`, the first steps that force every
   sentence's token (it runs them on one row a sentence).
2. :meth:`SearchHook.observe`: the step's log-probabilities as the model gives them.
3. :meth:`SearchHook.log_probs`: the same, changed (bans at -inf, a forced token alone).
4. Beam search only: :meth:`SearchHook.beam_log_probs` on the per-beam view, then
   :meth:`SearchHook.candidates` on the 2K candidates drawn, :meth:`SearchHook.keep_beams` once
   its live beams are chosen.
5. :meth:`SearchHook.keep`, when finished sentences leave the batch.
6. :meth:`SearchHook.finish`, on the hypotheses returned.

A static search (:mod:`transformer.decoding.static`: the whole step at fixed shapes, replayed
from a CUDA graph on a GPU) calls :meth:`SearchHook.static` once before its loop, then moments 2-4
with ``t`` a (1,) int64 tensor on the device and ``prefixes`` the (N, L + 1) buffer of every
step's tokens (padding after the t + 1 so far); no sentence leaves (no :meth:`SearchHook.keep`).
There a moment must not read the device on the host nor branch on ``t``, and it changes its
state in place (a graph replays the addresses it captured).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from torch import Tensor

if TYPE_CHECKING:
    from transformer.decoding.step import Hypothesis


class SearchHook:
    """A feature of a search: each moment a no-op unless overridden."""

    def lengthen(self, max_len: Tensor, cap: int) -> Tensor:
        """(n,) each sentence's most tokens before eos, at most ``cap`` -> the same, changed."""
        return max_len

    def forced_steps(self) -> int:
        """How many steps, from the first, force the token of every sentence of the batch."""
        return 0

    def static(self, beams: int) -> None:
        """A static search: ``beams`` rows a sentence from the first step (beam search's first
        step has one live beam, the others at -inf), no sentence leaving; state at its full
        shape from now on, changed in place."""

    def observe(self, lprobs: Tensor, sentences: Tensor, k: int, t: int | Tensor) -> None:
        """lprobs (n * k, V) at step ``t``, before any change; rows of ``sentences`` (n,), ``k``
        consecutive rows a sentence (its beams)."""

    def log_probs(self, lprobs: Tensor, prefixes: Tensor, t: int | Tensor) -> Tensor:
        """lprobs (N, V) of prefixes (N, t + 1), bos first, after t tokens generated -> (N, V),
        changed (in place or not)."""
        return lprobs

    def beam_log_probs(self, lprobs: Tensor, last: Tensor, fin_scores: Tensor) -> None:
        """Beam search: lprobs (n, k, V), changed in place before candidates are drawn; ``last``
        (n,) sentences at their length limit, ``fin_scores`` (n, K) the scores of their finished
        hypotheses, best first (-inf: none)."""

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
        """Beam search: the step's candidates (n, 2K), best first (their scores, source beams and
        tokens), drawn from lprobs (n, k, V), each beam's score plus each token's
        log-probability -> the candidates to go on with."""
        return scores, beams, tokens

    def keep_beams(self, live: Tensor) -> None:
        """Beam search: the live beams chosen, ``live`` (n, K) of the candidates drawn last."""

    def keep(self, index: Tensor) -> None:
        """The batch keeps its sentences ``index`` (n',), in that order."""

    def finish(self, hypotheses: list[list[Hypothesis]]) -> None:
        """Each sentence's hypotheses, as the search returns them."""


class Hooks(SearchHook):
    """Several hooks, each moment called on each in order (those given as None left out)."""

    def __init__(self, *hooks: SearchHook | None) -> None:
        self.hooks: Sequence[SearchHook] = [h for h in hooks if h is not None]

    def lengthen(self, max_len: Tensor, cap: int) -> Tensor:
        for hook in self.hooks:
            max_len = hook.lengthen(max_len, cap)
        return max_len

    def forced_steps(self) -> int:
        return max((hook.forced_steps() for hook in self.hooks), default=0)

    def static(self, beams: int) -> None:
        for hook in self.hooks:
            hook.static(beams)

    def observe(self, lprobs: Tensor, sentences: Tensor, k: int, t: int | Tensor) -> None:
        for hook in self.hooks:
            hook.observe(lprobs, sentences, k, t)

    def log_probs(self, lprobs: Tensor, prefixes: Tensor, t: int | Tensor) -> Tensor:
        for hook in self.hooks:
            lprobs = hook.log_probs(lprobs, prefixes, t)
        return lprobs

    def beam_log_probs(self, lprobs: Tensor, last: Tensor, fin_scores: Tensor) -> None:
        for hook in self.hooks:
            hook.beam_log_probs(lprobs, last, fin_scores)

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
        for hook in self.hooks:
            scores, beams, tokens = hook.candidates(
                lprobs, scores, beams, tokens, sentences, t, last
            )
        return scores, beams, tokens

    def keep_beams(self, live: Tensor) -> None:
        for hook in self.hooks:
            hook.keep_beams(live)

    def keep(self, index: Tensor) -> None:
        for hook in self.hooks:
            hook.keep(index)

    def finish(self, hypotheses: list[list[Hypothesis]]) -> None:
        for hook in self.hooks:
            hook.finish(hypotheses)
