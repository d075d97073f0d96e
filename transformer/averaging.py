"""Checkpoint averaging (Vaswani et al.): the element-wise mean of several checkpoints' weights,
what evaluation and export read for ``ckpt_path=[a,b]`` or a glob, and the command that writes it
as a checkpoint: ``transformer-average OUT.ckpt IN1.ckpt IN2.ckpt ...`` (also
``python -m transformer.checkpoints OUT.ckpt IN1.ckpt ...``).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from typing import Any

from transformer.atomic import atomic_save
from transformer.checkpoints import load_checkpoint, tokenizer_digests
from transformer.errors import CheckpointError, UserError
from transformer.outputs import check_output_file

log = logging.getLogger(__name__)

# What evaluation needs; optimizer, scheduler and loop states are for resuming only.
KEPT_FOR_EVALUATION = ("hyper_parameters", "datamodule_hyper_parameters", "tokenizers")


def average_checkpoints(paths: Sequence[str | os.PathLike]) -> dict[str, Any]:
    """The element-wise mean of the checkpoints' weights (Vaswani et al.'s checkpoint averaging).

    They must share the model config and tokenizers; the result keeps what evaluation needs.
    """
    if not paths:
        raise CheckpointError("no checkpoints to average")
    ckpts = [load_checkpoint(p) for p in paths]
    first, first_path = ckpts[0], paths[0]
    for path, ckpt in zip(paths[1:], ckpts[1:], strict=True):
        if ckpt["hyper_parameters"]["model"] != first["hyper_parameters"]["model"]:
            raise CheckpointError(f"{path} and {first_path} hold models of different configs")
        if ckpt["state_dict"].keys() != first["state_dict"].keys():
            raise CheckpointError(f"{path} and {first_path} hold different sets of weights")
        if tokenizer_digests(ckpt, path) != tokenizer_digests(first, first_path):  # (names may
            # differ: a resumed run stores the same models under names of its own cache)
            raise CheckpointError(f"{path} and {first_path} were trained with other tokenizers")
    state = {}
    for key, value in first["state_dict"].items():
        if value.is_floating_point():
            total = sum(c["state_dict"][key].double() for c in ckpts)
            state[key] = (total / len(ckpts)).to(value.dtype)
        else:
            state[key] = value
    averaged = {k: first[k] for k in KEPT_FOR_EVALUATION if k in first}
    averaged.update(state_dict=state, averaged_from=[str(p) for p in paths])
    return averaged


def load_or_average(paths: Sequence[str | os.PathLike]) -> dict[str, Any]:
    """The checkpoint of one path, or the average of several (what evaluation and export read)."""
    if len(paths) > 1:
        log.info("averaging %d checkpoints: %s", len(paths), ", ".join(map(str, paths)))
        return average_checkpoints(paths)
    if not paths:
        raise CheckpointError("no checkpoints given")
    return load_checkpoint(paths[0])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.checkpoints",
        description="Average the weights of several checkpoints into one (for evaluation).",
    )
    parser.add_argument("output", help="path of the averaged checkpoint to write")
    parser.add_argument("inputs", nargs="+", help="checkpoints of one training run")
    parser.add_argument("--force", action="store_true", help="replace an existing output")
    args = parser.parse_args(argv)
    try:
        check_output_file(
            args.output, args.inputs, args.force, "output",
            " (the first argument is the file written, the checkpoints to average follow it)",
        )  # fmt: skip
        averaged = average_checkpoints(args.inputs)
    except UserError as err:
        parser.exit(2, f"error: {err}\n")
    atomic_save(averaged, args.output)  # a reader never sees a half-written file
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    log.info("averaged %d checkpoints into %s", len(args.inputs), args.output)
