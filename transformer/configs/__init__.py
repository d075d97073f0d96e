"""The Hydra configs of training and evaluation: ``train.yaml``, ``evaluate.yaml`` and their groups
(data, model, optim, trainer, logger, callbacks, decode, experiment, debug, paths, hydra).
Installed with the package; Hydra reads them as ``pkg://transformer.configs``."""

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent  # for Hydra's compose API (initialize_config_dir)
