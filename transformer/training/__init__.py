"""Training: ``train(cfg)`` (:mod:`transformer.training.run`) turns a composed Hydra config into a
trained model. Around it: the Lightning module (``lit_module``), its step (``step``), the loss,
optimizer and schedules (``loss``, ``optim``, ``budget``), validation BLEU, callbacks, loggers,
non-finite steps, the run directory, resuming, and the config checks (``config_checks/``).

:func:`train` and :class:`TranslationModule` are imported on first use, so that what needs only a
light piece (the loss, the run directory's Hydra callback) does not load Lightning.
"""

from typing import Any

__all__ = ["TranslationModule", "train"]


def __getattr__(name: str) -> Any:  # PEP 562
    if name == "train":
        from transformer.training.run import train

        return train
    if name == "TranslationModule":
        from transformer.training.lit_module import TranslationModule

        return TranslationModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
