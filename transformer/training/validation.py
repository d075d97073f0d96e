"""The validation hooks of :class:`transformer.training.lit_module.TranslationModule`: the
validation loss and perplexity of every batch, and BLEU
(:mod:`transformer.training.validation_bleu`) of the first ``val_bleu_sentences`` sentences of
each direction, decoded with ``decoding``."""

from __future__ import annotations

import logging
import math

import torch

from transformer.training.loggers import log_summary
from transformer.training.validation_bleu import (
    bleu_metrics,
    score_directions,
    signature_summary,
    translate_batch,
)

# The BLEU lines keep the logger they have always had (log filters and tests name it).
log = logging.getLogger("transformer.training.lit_module")


class Validation:
    """Lightning's validation hooks, for :class:`TranslationModule` (whose model, loss, decoding
    options and sums they use) to inherit before ``L.LightningModule``."""

    def on_validation_epoch_start(self) -> None:
        self._val_sums = torch.zeros(3, dtype=torch.float64, device=self.device)
        self._val_hyps: dict[int, dict[int, str]] = {}  # per validation loader (direction)

    def validation_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        loss_sum, nll_sum, ntok = self._loss(batch, compiled=False)
        self._val_sums += torch.stack([loss_sum.double(), nll_sum.double(), ntok.double()])
        if self.trainer.sanity_checking or self.val_bleu_sentences == 0:
            return
        tokenizer = self.trainer.datamodule.tgt_tokenizer
        hyps = translate_batch(self.model, tokenizer, batch, self.decoding, self.val_bleu_sentences)
        if hyps:
            self._val_hyps.setdefault(dataloader_idx, {}).update(hyps)

    def on_validation_epoch_end(self) -> None:
        sums = self.trainer.strategy.reduce(self._val_sums, reduce_op="sum")
        loss_sum, nll_sum, ntok = sums.tolist()
        ntok = max(ntok, 1.0)
        self.log("val/loss", loss_sum / ntok, prog_bar=True, sync_dist=False)
        self.log("val/ppl", math.exp(min(nll_sum / ntok, 50.0)))
        if self.trainer.sanity_checking or self.val_bleu_sentences == 0:
            return
        directions = self.trainer.datamodule.directions
        world_size = self.trainer.world_size
        scores = score_directions(
            self.trainer.datamodule, self._val_hyps, world_size, self.bleu_tokenize
        )
        for name, value in bleu_metrics(scores, directions).items():
            self.log(name, value, prog_bar=name == "val/bleu")
        if self.global_rank == 0:
            log_summary(self.loggers, signature_summary(scores))
            for direction, score in scores.items():
                log.info(
                    "step %d: val BLEU %.2f on %d sentences%s (%s)",
                    self.global_step,
                    score.bleu,
                    score.num_sentences,
                    f", {direction}" if len(directions) > 1 else "",
                    score.signatures["bleu"],
                )
