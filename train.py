"""Train a translation model: ``python train.py [group=option ...] [key=value ...]``.

See the README's Training section; ``python train.py --help`` lists the config groups.
"""

import contextlib
import sys

import hydra
from omegaconf import DictConfig

from transformer.errors import UserError
from transformer.training import train


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    try:
        with contextlib.redirect_stdout(sys.stderr):  # progress bars and prints, as the log
            metrics = train(cfg)
    except UserError as err:  # the message names the fix; any other exception is a bug
        sys.exit(f"error: {err}")
    return metrics.get("val/bleu")  # for sweepers that optimise a value


if __name__ == "__main__":
    main()
