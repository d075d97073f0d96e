"""A run that starts from a trained model (``init_from=``): the weights and tokenizers of
checkpoints written by ``train.py`` (a last, best or epoch checkpoint, an average, or several
averaged here), with a fresh optimizer, schedule and data position on the run's own corpus.

The model must be the configured one, option for option, as for a resume
(:func:`transformer.training.resume.check_model`: the dropouts may change, pruned heads are taken
from the checkpoint); the data takes the checkpoint's SentencePiece models, so that the weights
see the ids they were trained on. ``ckpt_path=`` keeps its meaning, an exact resume: a fine-tuning
run resumes from its own ``last.ckpt``, and ``init_from`` is then not read again. ``freeze``
keeps named parts of the model fixed (:func:`transformer.training.freeze.freeze`).
"""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import DictConfig
from torch import Tensor

from transformer.averaging import load_or_average
from transformer.checkpoints import checkpoint_paths, model_state, stored_tokenizer_models
from transformer.config import TransformerConfig
from transformer.data.datamodule import TranslationDataModule
from transformer.data.tokenizer import Tokenizer
from transformer.errors import CheckpointError, ConfigError
from transformer.training.resume import check_model

log = logging.getLogger(__name__)


def initial_checkpoint(cfg: DictConfig) -> tuple[dict[str, Any], str]:
    """The checkpoint ``init_from`` names (several: their average) and how to name it."""
    paths = checkpoint_paths(cfg.init_from, "init_from")
    ckpt = load_or_average(paths)
    return ckpt, paths[0] if len(paths) == 1 else f"{paths[0]} (and {len(paths) - 1} more)"


def check_one_vocabulary(models: dict[str, bytes], name: str) -> None:
    """Two SentencePiece models under shared embeddings must number the same pieces alike (an
    imported Marian model's split text each their own way over one vocabulary)."""
    src, tgt = (Tokenizer(f"{side}.model", model_proto=models[side]) for side in ("src", "tgt"))
    if src.pieces(range(src.vocab_size)) != tgt.pieces(range(tgt.vocab_size)):
        raise ConfigError(
            f"init_from={name} has separate source and target vocabularies, which "
            "model.share_all_embeddings=true cannot share; set model.share_all_embeddings=false"
        )


def initial_weights(
    ckpt: dict[str, Any], name: str, model_cfg: TransformerConfig, data: TranslationDataModule
) -> dict[str, Tensor]:
    """The model's weights in ``ckpt`` (from ``init_from``, named ``name``), checked against this
    run's model; the data takes the checkpoint's tokenizers."""
    fix = "start from it with {fix}, or train from scratch (without init_from)"
    check_model(ckpt["hyper_parameters"]["model"], model_cfg, name, "init_from", fix)
    models = stored_tokenizer_models(ckpt, name)
    if models is None:
        raise CheckpointError(
            f"init_from={name} carries no tokenizers: its weights' ids could not be read; start "
            "from a checkpoint written by train.py"
        )
    if model_cfg.share_all_embeddings and models["src"] != models["tgt"]:
        check_one_vocabulary(models, name)
    data.use_tokenizers(models["src"], models["tgt"], checkpoint=name)
    log.info("init_from=%s: its weights and tokenizers; a fresh optimizer and schedule", name)
    return model_state(ckpt)
