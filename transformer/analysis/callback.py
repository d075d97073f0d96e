"""``AttentionMapsCallback``: attention maps, head statistics and sample translations at
validation, as PNG/JSON/Markdown and the interactive explorer (HTML) under the run directory and
through the loggers."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import torch
import wandb
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import WandbLogger

from transformer.analysis import explorer
from transformer.analysis.maps import capture_probes, translate_probes
from transformer.analysis.report import (
    SAMPLE_COLUMNS,
    Images,
    render_maps,
    stat_scalars,
    write_samples,
    write_stats,
)
from transformer.analysis.trends import TREND_COLUMNS, trend_charts, trend_rows
from transformer.data.collate import encode_sources, encode_targets
from transformer.lit_module import TranslationModule
from transformer.model import ATTENTION_TYPES

log = logging.getLogger(__name__)


class AttentionMapsCallback(Callback):
    """Every ``every_n_validations``-th validation (not the sanity check), on global rank 0:

    * maps of every layer and head of ``types`` for the probe sentences, teacher-forced on the
      reference and on the model's greedy translation: ``<out_dir>/step<N>/<type>/layer<l>/
      probe<i>_<reference|hypothesis>.png``, logged as images ``attn/<type>/layer<l>``;
    * per-head statistics (see :mod:`transformer.analysis.stats`) over the first
      ``stats_sentences`` validation pairs: ``stats_<type>.png`` and ``stats.json``, logged as
      images ``attn_stats/<type>``, the table ``attn_stats/table`` of every validation so far
      and line charts ``attn_trends/<type>/<stat>`` (see :mod:`transformer.analysis.trends`);
      with ``head_scalars``, also as scalars ``attn_stats/<type>/<stat>/l<layer>h<head>``;
    * the explorer (see :mod:`transformer.analysis.explorer`): this validation's record
      ``step<N>/explorer.json``, and ``<out_dir>/explorer.html`` rebuilt from every record so
      far, logged as the HTML ``attn/explorer``;
    * ``num_samples`` sample translations with sentence BLEU: ``samples.md``/``samples.json``,
      logged as the table ``samples``.

    Probes are the first ``num_probes`` validation pairs, or ``sentences`` (sources) with
    optional ``references``. Images, tables, charts and HTML go to wandb only (``WandbLogger``);
    every logger gets the scalars; the files are written whatever the loggers.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike,
        every_n_validations: int = 1,
        num_probes: int = 2,
        sentences: Sequence[str] | None = None,
        references: Sequence[str] | None = None,
        types: Sequence[str] = ATTENTION_TYPES,
        stats_sentences: int = 64,
        num_samples: int = 8,
        max_pieces: int = 40,
        head_scalars: bool = False,
    ) -> None:
        unknown = [t for t in types if t not in ATTENTION_TYPES]
        if unknown:
            raise ValueError(f"attention types {unknown} unknown; choose from {ATTENTION_TYPES}")
        if every_n_validations < 1:
            raise ValueError(f"every_n_validations must be >= 1, got {every_n_validations}")
        if sentences is not None and references is not None and len(sentences) != len(references):
            raise ValueError(f"{len(sentences)} sentences but {len(references)} references")
        if references is not None and sentences is None:
            raise ValueError("references need their sentences (the sources)")
        self.out_dir = Path(out_dir)
        self.every_n_validations = every_n_validations
        self.num_probes = num_probes
        self.sentences = None if sentences is None else list(sentences)
        self.references = None if references is None else list(references)
        self.types = list(types)
        self.stats_sentences, self.num_samples = stats_sentences, num_samples
        self.max_pieces, self.head_scalars = max_pieces, head_scalars
        self._validations = 0
        self._val_texts: tuple[list[str], list[str]] | None = None

    def _texts(self, trainer: L.Trainer, count: int) -> tuple[list[str], list[str]]:
        if self._val_texts is None or len(self._val_texts[0]) < count:
            dm = trainer.datamodule
            self._val_texts = (dm.sources("val")[:count], dm.references("val")[:count])
        return self._val_texts[0][:count], self._val_texts[1][:count]

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not isinstance(pl_module, TranslationModule):  # it decodes with pl_module.decoding
            raise TypeError(f"AttentionMapsCallback needs a TranslationModule, not {pl_module}")

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        if "fsdp" in type(trainer.strategy).__name__.lower():  # rank 0 alone holds a shard only
            if self._validations == 0:
                log.warning("attention maps are off under FSDP (weights are sharded)")
            self._validations += 1
            return
        self._validations += 1
        if (self._validations - 1) % self.every_n_validations:
            return
        with torch.no_grad():
            self._analyse(trainer, pl_module)

    def _analyse(self, trainer: L.Trainer, pl_module: TranslationModule) -> None:
        dm, model, step = trainer.datamodule, pl_module.model, trainer.global_step
        # (a multilingual model reads the first direction's target token first)
        src_tok, tgt_tok = dm.src_tokenizer.with_prefix(dm.source_prefix()), dm.tgt_tokenizer
        out = self.out_dir / f"step{step:07d}"
        val_src, val_ref = self._texts(
            trainer, max(self.num_probes, self.num_samples, self.stats_sentences)
        )
        if self.sentences is not None:
            sources, references = self.sentences, self.references
        else:
            count = max(self.num_probes, self.num_samples)
            sources, references = val_src[:count], val_ref[:count]
        probes, first, captured = None, None, {}
        if sources:  # decoded greedily, with validation's length rules
            probes = translate_probes(
                model, src_tok, tgt_tok, sources, references, pl_module.decoding
            )
        images: Images = {}
        if probes is not None and self.num_probes > 0 and self.types:
            first = probes.first(self.num_probes)
            captured = capture_probes(model, first)
            images |= render_maps(captured, src_tok, tgt_tok, out, self.types, self.max_pieces)
        stats: dict[str, dict[str, torch.Tensor]] = {}
        if self.stats_sentences > 0 and self.types:
            limit = model.cfg.max_positions
            src_ids = encode_sources(src_tok, val_src[: self.stats_sentences], limit)
            ref_ids = encode_targets(tgt_tok, val_ref[: self.stats_sentences], limit)
            stats, stat_images = write_stats(model, src_ids, ref_ids, out, self.types)
            images |= stat_images
        records, page = [], None
        if captured or stats:
            record = explorer.validation_record(
                step, first, captured, stats, src_tok, tgt_tok, self.types, self.max_pieces
            )
            explorer.save_record(record, out)
            records = explorer.load_records(self.out_dir)
            page = explorer.write_page(records, self.out_dir / "explorer.html")
        rows = []
        if probes is not None and self.num_samples > 0:
            rows = write_samples(probes, out, self.num_samples)
        self._log(trainer, images, stats, records, rows, page, step)
        log.info("attention analysis of step %d written to %s", step, out)

    def _log(
        self,
        trainer: L.Trainer,
        images: Images,
        stats: dict[str, dict[str, torch.Tensor]],
        records: list[dict],
        rows: list[list[str | float]],
        page: Path | None,
        step: int,
    ) -> None:
        scalars = stat_scalars(stats) if self.head_scalars else {}
        trends = trend_rows(records) if stats else []
        for logger in trainer.loggers:
            if scalars:
                logger.log_metrics(scalars, step=step)
            if not isinstance(logger, WandbLogger):
                continue  # other loggers have the PNGs, tables and page in the run directory
            for key, shots in images.items():
                paths, captions = zip(*shots, strict=True)
                logger.log_image(key=key, images=[str(p) for p in paths], step=step,
                                 caption=list(captions))  # fmt: skip
            if rows:
                logger.log_table(key="samples", columns=SAMPLE_COLUMNS, data=rows, step=step)
            if trends:
                logger.log_table(key="attn_stats/table", columns=TREND_COLUMNS, data=trends,
                                 step=step)  # fmt: skip
                logger.log_metrics(trend_charts(trends), step=step)
            if page is not None:  # inject=False: no stylesheet from the network
                html = wandb.Html(str(page), inject=False)
                logger.log_metrics({"attn/explorer": html}, step=step)
