"""Forced decoding: the log-probability a model (or an ensemble) gives each token of a given
translation, teacher-forced in one pass, for reranking and corpus filtering."""

from __future__ import annotations

import torch
from torch import Tensor

from transformer.decoding.step import Models, as_ensemble, evaluating, mean_probabilities


@torch.no_grad()
def token_log_probs(
    model: Models, src: Tensor, tgt_in: Tensor, labels: Tensor, src_pad_mask: Tensor | None = None
) -> Tensor:
    """Source ids (B, S), decoder inputs (B, T) (bos + y) and labels (B, T) (y + eos, padded) ->
    (B, T) log-probability of each label, 0 at padding; an ensemble's is the log of its models'
    mean probability (as its searches use)."""
    models = as_ensemble(model)
    per_model = []
    with evaluating(*models):
        for m in models:
            lprobs = m(src, tgt_in, src_pad_mask).float().log_softmax(-1)  # (B, T, V)
            per_model.append(lprobs.gather(-1, labels.unsqueeze(-1)).squeeze(-1))  # (B, T)
    return mean_probabilities(per_model).masked_fill(labels.eq(models[0].cfg.pad_id), 0.0)


def sentence_score(token_lprobs: list[float], len_penalty: float) -> float:
    """A translation's score from its tokens' log-probabilities (eos included), as the searches
    score: their sum / length ** len_penalty (0: the sum; 1: the mean per token)."""
    return sum(token_lprobs) / len(token_lprobs) ** len_penalty
