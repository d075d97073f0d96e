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
from transformer.analysis.figures import Drawing, Drawn, FigureWorker
from transformer.analysis.maps import capture_probes, translate_probes
from transformer.analysis.report import (
    SAMPLE_COLUMNS,
    map_figures,
    stat_scalars,
    write_samples,
    write_stats,
)
from transformer.analysis.trends import TREND_COLUMNS, trend_charts
from transformer.data.collate import encode_sources, encode_targets
from transformer.model import ATTENTION_TYPES
from transformer.training.lit_module import TranslationModule

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

    The figures and the page are drawn in a worker process (:mod:`transformer.analysis.figures`),
    with ``draw_when_idle`` only in the CPU time training leaves idle: on a machine whose cores
    training keeps busy, a map validation's figures are skipped when a newer one comes first.
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
        draw_when_idle: bool = True,
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
        self._worker = FigureWorker(idle=draw_when_idle)
        self.drawn: list[int] = []  # steps whose figures were drawn
        self.failures = 0  # map validations whose figures failed

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
        self._report(trainer, self._worker.finished())
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

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The last figures drawn and logged before the loggers close."""
        self._report(trainer, self._worker.close())

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception) -> None:
        self._worker.close(wait=False)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._worker.close(wait=False)

    def _analyse(self, trainer: L.Trainer, pl_module: TranslationModule) -> None:
        """The data, on the training thread (probes translated and their maps captured, head
        statistics, the explorer's record, samples); the figures go to the worker process."""
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
        job = Drawing(step, out, self.out_dir)
        if probes is not None and self.num_probes > 0 and self.types:
            first = probes.first(self.num_probes)
            captured = capture_probes(model, first)
            job.maps = map_figures(captured, src_tok, tgt_tok, out, self.types, self.max_pieces)
        stats: dict[str, dict[str, torch.Tensor]] = {}
        if self.stats_sentences > 0 and self.types:
            limit = model.cfg.max_positions
            src_ids = encode_sources(src_tok, val_src[: self.stats_sentences], limit)
            ref_ids = encode_targets(tgt_tok, val_ref[: self.stats_sentences], limit)
            stats, _ = write_stats(model, src_ids, ref_ids, out, self.types, draw=False)
            job.stats, job.stats_sentences = stats, len(src_ids)
        if captured or stats:
            record = explorer.validation_record(
                step, first, captured, stats, src_tok, tgt_tok, self.types, self.max_pieces
            )
            explorer.save_record(record, out)
            job.page = True
        rows = []
        if probes is not None and self.num_samples > 0:
            rows = write_samples(probes, out, self.num_samples)
        self._log_data(trainer, stats, rows, step)
        replaced = self._worker.submit(job)
        if replaced is not None:
            log.info(
                "attention figures of step %d skipped: the worker was still drawing an earlier "
                "step%s (the maps are in %s/explorer.json and on the explorer page)",
                replaced.step, " in the CPU time training leaves idle" if self._worker.idle else "",
                replaced.step_dir,
            )  # fmt: skip
        log.info("attention analysis of step %d written to %s (figures: being drawn)", step, out)

    def _log_data(
        self,
        trainer: L.Trainer,
        stats: dict[str, dict[str, torch.Tensor]],
        rows: list[list[str | float]],
        step: int,
    ) -> None:
        """What the training thread has at once: the head scalars, the samples table."""
        scalars = stat_scalars(stats) if self.head_scalars else {}
        for logger in trainer.loggers:
            if scalars:
                logger.log_metrics(scalars, step=step)
            if rows and isinstance(logger, WandbLogger):
                logger.log_table(key="samples", columns=SAMPLE_COLUMNS, data=rows, step=step)

    def _report(
        self, trainer: L.Trainer, done: list[tuple[Drawing, Drawn | BaseException]]
    ) -> None:
        """Log the figures drawn (images, trend charts, the explorer page) at their step, to
        wandb (the other loggers have the files in the run directory); report failures."""
        for job, drawn in done:
            if isinstance(drawn, BaseException):
                log.error(
                    "attention figures of step %d failed in the worker process: %s: %s (the "
                    "maps and statistics are in %s)",
                    job.step, type(drawn).__name__, drawn, job.step_dir,
                )  # fmt: skip
                self.failures += 1
                continue
            self.drawn.append(job.step)
            for logger in trainer.loggers:
                if not isinstance(logger, WandbLogger):
                    continue
                for key, shots in drawn.images.items():
                    paths, captions = zip(*shots, strict=True)
                    logger.log_image(key=key, images=[str(p) for p in paths], step=job.step,
                                     caption=list(captions))  # fmt: skip
                if drawn.trends:
                    logger.log_table(key="attn_stats/table", columns=TREND_COLUMNS,
                                     data=drawn.trends, step=job.step)  # fmt: skip
                    logger.log_metrics(trend_charts(drawn.trends), step=job.step)
                if drawn.page is not None:  # inject=False: no stylesheet from the network
                    html = wandb.Html(str(drawn.page), inject=False)
                    logger.log_metrics({"attn/explorer": html}, step=job.step)
