"""Train a translation model: ``python train.py [group=option ...] [key=value ...]``, the
``transformer-train`` command of an installed package (:func:`transformer.cli.train_main`).

See the README's Training section; ``python train.py --help`` lists the config groups.
"""

from transformer.cli import train_main

if __name__ == "__main__":
    train_main()
