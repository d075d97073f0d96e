"""Head importance (Michel et al. 2019, "Are Sixteen Heads Really Better than One?").

Two measures, ``importance=mask|gradient|both``:

* mask: each head of each attention module is masked in turn (the rest kept) and the change in
  teacher-forced loss and in greedy BLEU is measured on the given pairs;
* gradient: the paper's proxy I_h = E_x |dL(x)/d xi_h|, the gradient of each sentence's loss with
  respect to a gate xi_h = 1 on head h's output, from one backward pass per batch (optionally
  divided by the l2 norm of its layer's scores, as the paper does before pruning).

With both, the Spearman rank correlation of the two rankings is reported. Heads are then pruned
greedily, least important first (by loss increase when masked, else by the gradient proxy), and
loss and BLEU are measured against the share of heads left. Results
(:mod:`transformer.analysis.heads_report`): ``heads.json``, ``heads.md``,
``heads_importance.png``, ``heads_pruning.png``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer.data.collate import encode_sources, encode_targets, pad
from transformer.data.tokenizer import EOS_ID
from transformer.decoding import DecodeOptions
from transformer.decoding.step import evaluating
from transformer.metrics import score_translations
from transformer.model import ATTENTION_TYPES, Transformer
from transformer.surgery import HeadKey
from transformer.translate import Translator

log = logging.getLogger(__name__)


IMPORTANCES = ("mask", "gradient", "both")


@dataclass
class HeadScore:
    kind: str
    layer: int
    head: int
    loss: float | None = None  # mean NLL per target token with this head masked (mask)
    bleu: float | None = None
    delta_loss: float | None = None  # minus the unmasked model's
    delta_bleu: float | None = None
    gradient: float | None = None  # Michel et al.'s proxy E_x |dL(x)/d xi_h| (gradient)


@dataclass
class PruningPoint:
    heads_left: int
    share_left: float
    loss: float
    bleu: float


class HeadEvaluator:
    """Loss and BLEU of ``translator.model`` on fixed (source, reference) pairs, under whatever
    head masks are set on the model."""

    def __init__(
        self,
        translator: Translator,
        sources: list[str],
        references: list[str],
        options: DecodeOptions,
        batch_size: int = 64,
    ) -> None:
        self.translator, self.options = translator, options
        self.model: Transformer = translator.model
        self.sources, self.references = sources, references
        limit = self.model.cfg.max_positions
        src_ids = encode_sources(translator.src_tokenizer, sources, limit)
        tgt_in = encode_targets(translator.tgt_tokenizer, references, limit)
        labels = [[*ids[1:], EOS_ID] for ids in tgt_in]  # y + eos
        device, pad_id = translator.device, self.model.cfg.pad_id
        self.batches = [
            tuple(
                pad(seqs[i : i + batch_size], pad_id, device) for seqs in (src_ids, tgt_in, labels)
            )
            for i in range(0, len(src_ids), batch_size)
        ]

    @torch.no_grad()
    def loss(self) -> float:
        total, count = 0.0, 0
        pad_id = self.model.cfg.pad_id
        with evaluating(self.model):
            for src, tgt_in, labels in self.batches:
                logits = self.model(src, tgt_in)  # (B, T, V)
                nll = F.cross_entropy(
                    logits.float().transpose(1, 2), labels, ignore_index=pad_id, reduction="sum"
                )
                total, count = total + float(nll), count + int(labels.ne(pad_id).sum())
        return total / max(count, 1)

    def bleu(self) -> float:
        hyps = [t[0].text for t in self.translator.translate(self.sources, self.options)]
        return score_translations(hyps, self.references).bleu

    def score(self) -> tuple[float, float]:
        return self.loss(), self.bleu()

    def gate_gradients(self) -> dict[tuple[str, int], Tensor]:
        """Per attention module, the summed absolute gradients of each sentence's loss (mean NLL
        per target token) with respect to gates of 1 on its heads' outputs, (H,) float64: one
        gate per sentence and head, so one backward pass per batch gives every sentence's own
        gradient. Divide by ``len(self.sources)`` for the mean."""
        model, pad_id = self.model, self.model.cfg.pad_id
        modules = {
            (kind, layer): module
            for kind in ATTENTION_TYPES
            for layer, module in enumerate(model.attention_modules(kind))
        }
        sums = {key: torch.zeros(m.num_heads, dtype=torch.float64) for key, m in modules.items()}
        dtype = torch.promote_types(next(model.parameters()).dtype, torch.float32)
        try:
            with evaluating(model), torch.enable_grad():
                for src, tgt_in, labels in self.batches:
                    gates = {
                        key: torch.ones(src.size(0), m.num_heads, dtype=dtype, device=src.device,
                                        requires_grad=True)
                        for key, m in modules.items()
                    }  # (B, H) each  # fmt: skip
                    for key, module in modules.items():
                        module.head_mask = gates[key]
                    logits = model(src, tgt_in)  # (B, T, V)
                    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
                    nll = F.cross_entropy(
                        logits.transpose(1, 2), labels, ignore_index=pad_id, reduction="none"
                    )  # (B, T)
                    tokens = labels.ne(pad_id).sum(1).clamp(min=1)  # (B,)
                    grads = torch.autograd.grad((nll.sum(1) / tokens).sum(), list(gates.values()))
                    for key, grad in zip(gates, grads, strict=True):
                        sums[key] += grad.abs().sum(0).double().cpu()  # (H,)
        finally:
            model.clear_head_masks()
        return sums


def all_heads(model: Transformer) -> list[HeadKey]:
    return [
        (kind, layer, head)
        for kind in ATTENTION_TYPES
        for layer, module in enumerate(model.attention_modules(kind))
        for head in range(module.num_heads)
    ]


def set_pruned(model: Transformer, pruned: list[tuple[str, int, int]]) -> None:
    """Mask exactly the ``pruned`` heads (all others on)."""
    model.clear_head_masks()
    masks: dict[tuple[str, int], torch.Tensor] = {}
    for kind, layer, head in pruned:
        key = (kind, layer)
        if key not in masks:
            masks[key] = torch.ones(model.attention_modules(kind)[layer].num_heads)
        masks[key][head] = 0.0
    for (kind, layer), mask in masks.items():
        model.set_head_mask(kind, layer, mask)


def gradient_importance(evaluator: HeadEvaluator, normalize: bool = False) -> dict[HeadKey, float]:
    """Michel et al.'s I_h = E_x |dL(x)/d xi_h| of every head over the evaluator's sentences;
    ``normalize`` divides each layer's scores by their l2 norm (the paper's per-layer
    normalisation, which makes layers comparable before a global ranking)."""
    scores = {}
    for (kind, layer), sums in evaluator.gate_gradients().items():
        values = sums / max(len(evaluator.sources), 1)  # (H,)
        if normalize:
            values = values / values.norm().clamp(min=1e-20)
        scores.update({(kind, layer, h): float(v) for h, v in enumerate(values)})
    return scores


def head_importance(
    evaluator: HeadEvaluator, by: str = "mask", normalize: bool = False
) -> tuple[tuple[float, float], list[HeadScore]]:
    """(baseline loss, BLEU) and each head's scores: ``by`` is one of ``IMPORTANCES``, the
    change in loss and BLEU when the head alone is masked, the gradient proxy, or both."""
    if by not in IMPORTANCES:
        raise ValueError(f"importance={by!r}: choose one of {', '.join(IMPORTANCES)}")
    model = evaluator.model
    model.clear_head_masks()
    base_loss, base_bleu = evaluator.score()
    scores = [HeadScore(*key) for key in all_heads(model)]
    if by != "gradient":
        for s in scores:
            set_pruned(model, [(s.kind, s.layer, s.head)])
            s.loss, s.bleu = evaluator.score()
            s.delta_loss, s.delta_bleu = s.loss - base_loss, s.bleu - base_bleu
            log.info("masked %s layer %d head %d: loss %+.4f, BLEU %+.2f", s.kind, s.layer,
                     s.head, s.delta_loss, s.delta_bleu)  # fmt: skip
        model.clear_head_masks()
    if by != "mask":
        gradients = gradient_importance(evaluator, normalize)
        for s in scores:
            s.gradient = gradients[(s.kind, s.layer, s.head)]
    return (base_loss, base_bleu), scores


def ranking(scores: list[HeadScore]) -> list[HeadKey]:
    """Heads from least to most important: by loss increase when masked where measured, else
    by the gradient proxy."""
    by_mask = scores[0].delta_loss is not None
    key = (lambda s: s.delta_loss) if by_mask else (lambda s: s.gradient)
    return [(s.kind, s.layer, s.head) for s in sorted(scores, key=key)]


def prune_greedily(
    evaluator: HeadEvaluator, scores: list[HeadScore], step: float = 0.1
) -> list[PruningPoint]:
    """Mask the least important heads first (:func:`ranking`), a share ``step`` of all heads
    more at each point, down to one head; loss and BLEU at each point."""
    order = ranking(scores)
    total = len(order)
    counts = sorted({min(round(i * step * total), total - 1) for i in range(int(1 / step) + 1)})
    points = []
    for pruned in counts:
        set_pruned(evaluator.model, order[:pruned])
        loss, bleu = evaluator.score()
        left = total - pruned
        points.append(PruningPoint(left, left / total, loss, bleu))
    evaluator.model.clear_head_masks()
    return points
