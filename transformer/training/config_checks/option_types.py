"""Each option's value against the type its owner annotates (:func:`check_types`), before any
other check: ``model.d_model=abc`` is named as such, not as a comparison that failed. The
owners' types, and a value against one, are :mod:`transformer.option_types`'s (evaluation's
checks use them too)."""

from __future__ import annotations

from typing import Any

import lightning as L
from omegaconf import DictConfig, OmegaConf

from transformer.config import TransformerConfig
from transformer.errors import show
from transformer.option_types import check_type, describe, fits, option_types
from transformer.training.lit_module import TranslationModule

# Options outside the groups that name a ``_target_``: the parameter of the object that takes
# them, or their type where train() takes them itself.
OWNED_OPTIONS: dict[str, tuple[Any, str] | Any] = {
    "seed": (L.seed_everything, "seed"),
    "loss.label_smoothing": (TranslationModule, "label_smoothing"),
    "loss.rdrop_alpha": (TranslationModule, "rdrop_alpha"),
    "loss.max_bad_steps": (TranslationModule, "max_bad_steps"),
    "loss.kernel": (TranslationModule, "loss_kernel"),
    "validation.bleu_sentences": (TranslationModule, "val_bleu_sentences"),
    "metrics.tokenize": (TranslationModule, "bleu_tokenize"),
    "compile": (TranslationModule, "compile_model"),
    "freeze": (TranslationModule, "freeze"),
    "init_from": str | list[str] | None,  # checkpoints (transformer.training.finetune)
    "compile_backend": (TranslationModule, "compile_backend"),
    "ema.decay": float | None,  # WeightEMA's decay; null: no WeightEMA
}
# Options that train() resolves before their owner sees them (trainer.precision=auto)
RESOLVED_BY_TRAIN = ("trainer.precision",)
_ABSENT = object()


def check_types(cfg: DictConfig) -> None:
    """Each option's value against the type its owner annotates (the model config's field, the
    data module's, optimizer's, scheduler's, Trainer's, a callback's or logger's parameter), so
    that ``model.d_model=abc`` or ``model.num_encoder_layers=2.5`` fails naming the option, its
    value and the type expected, before any data work."""
    groups = {}  # data first: the model's vocabulary options interpolate its
    for name in ("data", "model", "optim.optimizer", "optim.scheduler", "trainer"):
        node = OmegaConf.select(cfg, name)
        if name == "model":
            groups[name] = (TransformerConfig, node)
        elif node is not None and node.get("_target_"):
            groups[name] = (node._target_, node)
    for kind in ("callbacks", "logger"):
        for name, node in (cfg.get(kind) or {}).items():
            if isinstance(node, DictConfig) and node.get("_target_"):
                groups[f"{kind}.{name}"] = (node._target_, node)
    for group, (owner, node) in groups.items():
        hints = option_types(owner)
        options = OmegaConf.to_container(node, resolve=True)
        for key, value in options.items():  # type: ignore[union-attr]
            option = f"{group}.{key}"
            if key in hints and option not in RESOLVED_BY_TRAIN:
                check_type(option, value, *hints[key])
    for option, owner in OWNED_OPTIONS.items():
        value = OmegaConf.select(cfg, option, default=_ABSENT)
        if OmegaConf.is_config(value):  # a list or mapping: as the owner gets it
            value = OmegaConf.to_container(value, resolve=True)
        hint = option_types(owner[0]).get(owner[1]) if isinstance(owner, tuple) else (owner, None)
        if value is not _ABSENT and hint is not None:
            check_type(option, value, *hint)


__all__ = ["check_type", "check_types", "describe", "fits", "option_types", "show"]
