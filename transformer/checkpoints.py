"""The checkpoint format: what training adds to Lightning's checkpoints and reads back to resume,
and how evaluation loads them (with clear errors) and rebuilds the model and tokenizers.

A checkpoint written by ``train.py`` holds the model config (``hyper_parameters.model``), the
weights (``state_dict``, prefixed ``model.``), the data settings
(``datamodule_hyper_parameters``) and both SentencePiece models (``tokenizers``), so it evaluates
anywhere; for an exact resume also the random states of every process (``rng_states``, a list
indexed by global rank) and the count of NaN/inf steps skipped (``skipped_steps``). Averaging
them (``python -m transformer.checkpoints OUT.ckpt IN1.ckpt IN2.ckpt ...``):
:mod:`transformer.averaging`.
"""

from __future__ import annotations

import glob
import logging
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from transformer.config import TransformerConfig
from transformer.data.spm_model import model_digest
from transformer.data.tokenizer import Tokenizer
from transformer.errors import CheckpointError, DataError
from transformer.model import Transformer

log = logging.getLogger(__name__)


# -- training: what train.py adds to Lightning's checkpoint, and reads back to resume ------


def write_training_state(
    checkpoint: dict[str, Any], skipped_steps: int, tokenizers: tuple[Tokenizer, Tokenizer] | None
) -> None:
    """Add to a checkpoint being saved what training keeps beside Lightning's own state: the
    random states of every rank, the skipped-step count and (when known) the (source, target)
    SentencePiece models, so that it can be evaluated on a machine without the run's data/ folder.

    Under DDP every rank calls this (Lightning saves collectively, rank 0 writes): the ranks'
    states are gathered, since each rank's streams (dropout) have moved on differently."""
    states = get_rng_states()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gathered: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, states)
        checkpoint["rng_states"] = gathered
    else:
        checkpoint["rng_states"] = [states]
    checkpoint["skipped_steps"] = skipped_steps
    if tokenizers is not None:
        checkpoint["tokenizers"] = {
            side: {"name": tok.model_path.name, "model": tok.to_bytes()}
            for side, tok in zip(("src", "tgt"), tokenizers, strict=True)
        }


def read_training_state(
    checkpoint: dict[str, Any], rank: int = 0
) -> tuple[dict[str, Any] | None, int]:
    """(this rank's random states or None, skipped-step count) of a checkpoint being resumed.

    A checkpoint from fewer ranks than now (or from before 2026-11-22: one process's states)
    has none for some ranks: they take rank ``rank % saved`` (a warning: the resume is not exact).
    """
    states = checkpoint.get("rng_states")
    if isinstance(states, dict):
        states = [states]
    if states and rank >= len(states):
        log.warning(
            "the checkpoint holds the random states of %d rank(s); rank %d takes those of rank "
            "%d, so dropout and sampling do not continue exactly as they would have",
            len(states), rank, rank % len(states),
        )  # fmt: skip
    own = states[rank % len(states)] if states else None
    return own, checkpoint.get("skipped_steps", 0)


def get_rng_states() -> dict[str, Any]:
    """The global random states, as tensors and plain values (loadable with weights_only)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    states = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()  # this process's GPU (one per rank)
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(states["python"])
    cuda = states.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if isinstance(cuda, list):  # checkpoints before 2026-11-22: every visible GPU's state,
            cuda = cuda[min(torch.cuda.current_device(), len(cuda) - 1)]  # maybe more than here
        torch.cuda.set_rng_state(cuda)


# -- reading: load with clear errors, the model and tokenizers it carries, ensembles ------


def _torch_load(path: Path, mmap: bool = False) -> Any:
    """``torch.load`` to the CPU, tensors and plain values only; any failure a CheckpointError."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:  # a truncated zip, a pickle of something else, ...
        raise CheckpointError(
            f"checkpoint {path} cannot be read, it is truncated or not a checkpoint "
            f"({type(err).__name__}: {str(err).splitlines()[0]})"
        ) from err


def checkpoint_paths(given: Any, option: str = "ckpt_path") -> list[str]:
    """The checkpoints ``given`` names (as ``option=``): one path, a list, or glob patterns (their
    matches, sorted)."""
    entries = [given] if isinstance(given, str | os.PathLike) else list(given)
    paths = []
    for entry in map(str, entries):
        if glob.has_magic(entry):
            matches = sorted(glob.glob(entry))
            if not matches:
                hint = _no_match_hint(entry, option)
                raise CheckpointError(f"{option}={entry} matches no file{hint}")
            paths += matches
        else:
            paths.append(entry)
    return paths


def _no_match_hint(pattern: str, option: str) -> str:
    """Where the pattern's folder (or the one above) holds a ``last.ckpt``, as a training run's
    ``checkpoints/epochs/`` does: a run shorter than one epoch keeps no epoch checkpoints."""
    folder = Path(pattern).parent
    use = "evaluate it with" if option == "ckpt_path" else "start from it with"
    for last in (folder / "last.ckpt", folder.parent / "last.ckpt"):
        if not glob.has_magic(str(last)) and last.is_file():
            return (
                f"; {last} exists (epoch checkpoints are kept for complete epochs only, so a run "
                f"shorter than one epoch has none): {use} {option}={last}"
            )
    return ""


def load_checkpoint(path: str | os.PathLike, mmap: bool = False) -> dict[str, Any]:
    """A checkpoint written by ``train.py`` (``mmap``: its tensors memory-mapped, not read)."""
    path = Path(path)
    ckpt = _torch_load(path, mmap=mmap)
    if (
        not isinstance(ckpt, dict)
        or "state_dict" not in ckpt
        or "model" not in ckpt.get("hyper_parameters", {})
    ):
        raise CheckpointError(f"{path} is not a checkpoint written by train.py (no model config)")
    return ckpt


def model_from_checkpoint(
    ckpt: dict[str, Any], path: str | os.PathLike = "checkpoint"
) -> Transformer:
    try:
        cfg = TransformerConfig(**ckpt["hyper_parameters"]["model"])
    except ValueError as err:  # the config's own checks (edited, or written by other code)
        raise CheckpointError(f"{path}: its model config is invalid: {err}") from err
    model = Transformer(cfg)
    model.load_state_dict(model_state(ckpt))
    return model


def model_state(ckpt: dict[str, Any]) -> dict[str, Any]:
    """The model's weights in a checkpoint, named as the model names them (Lightning stores them
    under the module's ``model.`` attribute)."""
    prefix = "model."
    return {k[len(prefix) :]: v for k, v in ckpt["state_dict"].items() if k.startswith(prefix)}


def tokenizer_models(ckpt: dict[str, Any]) -> dict[str, bytes | None]:
    """The SentencePiece model bytes of each side that a loaded checkpoint carries."""
    stored = ckpt.get("tokenizers") or {}
    return {
        side: entry.get("model") if isinstance(entry := stored.get(side), dict) else None
        for side in ("src", "tgt")
    }


def tokenizer_digests(ckpt: dict[str, Any], path: str | os.PathLike) -> dict[str, str | None]:
    """What each side's tokenizer does (:func:`model_digest`), to compare checkpoints': alike
    for tokenizers trained alike, whichever process trained them and wherever."""
    digests: dict[str, str | None] = {}
    for side, model in tokenizer_models(ckpt).items():
        try:
            digests[side] = None if model is None else model_digest(model)
        except DataError as err:
            raise CheckpointError(f"{path}: its {side} tokenizer is damaged ({err})") from err
    return digests


def stored_tokenizer_models(
    ckpt: dict[str, Any], path: str | os.PathLike
) -> dict[str, bytes] | None:
    """The SentencePiece models a loaded checkpoint carries, ``{"src": bytes, "tgt": bytes}``, or
    None for one without them."""
    if ckpt.get("tokenizers") is None:
        return None
    models = tokenizer_models(ckpt)
    if not all(isinstance(m, bytes) for m in models.values()):
        raise CheckpointError(f"{path}: its tokenizers entry holds no src and tgt model bytes")
    return models


def tokenizers_from_checkpoint(
    ckpt: dict[str, Any], path: str | os.PathLike
) -> tuple[Tokenizer, Tokenizer]:
    """The (source, target) tokenizers the checkpoint carries, checked against its model."""
    stored = ckpt.get("tokenizers")
    if not stored or not all(isinstance(stored.get(s), dict) for s in ("src", "tgt")):
        raise CheckpointError(f"{path} carries no tokenizer models; it was not written by train.py")
    try:
        src, tgt = (
            Tokenizer(stored[s]["name"], model_proto=stored[s]["model"]) for s in ("src", "tgt")
        )
    except DataError as err:
        raise CheckpointError(f"{path}: {err}; use another checkpoint of the run") from err
    model = ckpt["hyper_parameters"]["model"]
    for side, tok, size in (("source", src, "src_vocab_size"), ("target", tgt, "tgt_vocab_size")):
        if tok.vocab_size != model[size]:
            raise CheckpointError(
                f"{path}: the {side} tokenizer {tok.model_path.name} has {tok.vocab_size} pieces "
                f"but the model's {size} is {model[size]}; the tokenizer does not belong to it"
            )
    return src, tgt


def load_ensemble(paths: Sequence[str | os.PathLike]) -> list[dict[str, Any]]:
    """The checkpoints of an ensemble, each whole: their models may differ in size and depth, not
    in their tokenizers (one vocabulary, one id per piece)."""
    if not paths:
        raise CheckpointError("no checkpoints given")
    ckpts = [load_checkpoint(p) for p in paths]
    for path, ckpt in zip(paths[1:], ckpts[1:], strict=True):
        if tokenizer_digests(ckpt, path) != tokenizer_digests(ckpts[0], paths[0]):
            raise CheckpointError(
                f"{path} and {paths[0]} were trained with other tokenizers; an ensemble's models "
                "must share them"
            )
    return ckpts


if __name__ == "__main__":  # the averaging command (transformer-average), by its old name
    from transformer.averaging import main

    main()
