"""What a run resumed from ``ckpt_path=`` checks against its checkpoint before any data work.

The checkpoint must hold the whole training state (``last.ckpt`` or a best checkpoint; not an epoch
checkpoint, which holds weights only, nor an average). Its data settings must be the run's: the
languages, the vocabulary mode (joint or separate) and the kind of each corpus; where a corpus lies
may change (another machine, a copy). Its model must be the configured one, option for option,
except the dropouts (they change the training, not the model), ``max_positions`` (the sinusoidal and
rotary tables are no weights; learned positions are, and keep it) and pruned heads (taken from the
checkpoint by ``training.adopt_pruned_heads``). Each mismatch is one :class:`ConfigError` naming
both values and the option to set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformer.config import TransformerConfig
from transformer.data.corpora import CORPUS_IDENTITY, corpus_options
from transformer.errors import CheckpointError, ConfigError
from transformer.training.config_checks import show

# Model options a resumed run may change: they leave the weights' shapes and meaning alone.
FREE_MODEL_OPTIONS = (
    "dropout", "attention_dropout", "activation_dropout", "max_positions", "pad_id",
    "heads_per_layer",
)  # fmt: skip
NEW_RUN = "or start a new run (without ckpt_path)"


def check_resume(
    ckpt: dict[str, Any],
    path: str | os.PathLike,
    model: TransformerConfig,
    data: Mapping[str, Any],
) -> None:
    """Refuse to resume from ``ckpt`` (loaded from ``path``) unless it holds a training state for
    this run's ``model`` and ``data`` (the data module's hyperparameters)."""
    check_training_state(ckpt, Path(path))
    stored = ckpt.get("datamodule_hyper_parameters")
    if stored is not None:  # (every checkpoint of train.py has them)
        check_data_settings(stored, data, path)
    check_model(ckpt["hyper_parameters"]["model"], model, path)


def check_training_state(ckpt: dict[str, Any], path: Path) -> None:
    """Refuse an average or a weights-only checkpoint, saying what to resume from instead."""
    if "averaged_from" in ckpt:
        raise ConfigError(
            f"ckpt_path={path} is an average of {len(ckpt['averaged_from'])} checkpoints: weights "
            "only, no optimizer or schedule state to resume; evaluate it (python evaluate.py "
            f"ckpt_path={path}), or resume from one of its run's last.ckpt"
        )
    if not ckpt.get("optimizer_states"):
        last = next(
            (
                p
                for p in (path.parent / "last.ckpt", path.parent.parent / "last.ckpt")
                if p.is_file()
            ),
            "the run's checkpoints/last.ckpt",
        )
        raise ConfigError(
            f"ckpt_path={path} holds weights only (an epoch checkpoint), no optimizer or schedule "
            f"state to resume; resume from {last}, or evaluate or average it (python evaluate.py "
            f"ckpt_path={path})"
        )


def check_data_settings(
    stored: Mapping[str, Any], given: Mapping[str, Any], path: str | os.PathLike
) -> None:
    """The languages, vocabulary mode, target tokens and corpora of ``stored`` (a checkpoint's
    data hyperparameters) against ``given`` (this run's)."""
    differ = {  # option -> (the checkpoint's value, this run's)
        f"data.{key}": (stored.get(key, default), given.get(key, default))
        for key, default in (("joint_vocab", True), ("target_token", False))
    }
    trained, now = (_corpora(h) for h in (stored, given))
    if len(trained) != len(now):
        raise ConfigError(
            f"ckpt_path={path} was trained on {len(trained)} corpora, but data.corpora lists "
            f"{len(now)}; resume with the corpora it was trained on, {NEW_RUN}"
        )
    for i, (was, new) in enumerate(zip(trained, now, strict=True)):
        for key in CORPUS_IDENTITY:
            option = f"data.corpora[{i}].{key}" if given.get("corpora") else f"data.{key}"
            differ[option] = was[key], new[key]
        if given.get("corpora"):  # an entry's own token (data.target_token: above)
            option = f"data.corpora[{i}].target_token"
            differ[option] = was.get("target_token"), new.get("target_token")
    differ = {option: values for option, values in differ.items() if values[0] != values[1]}
    if differ:
        was = " ".join(f"{option}={show(a)}" for option, (a, _) in differ.items())
        now = " ".join(f"{option}={show(b)}" for option, (_, b) in differ.items())
        raise ConfigError(
            f"ckpt_path={path} was trained with {was}, but this run has {now}; resume with "
            f"{was}, {NEW_RUN}"
        )


def _corpora(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [corpus_options(entry, data) for entry in data.get("corpora") or [{}]]


def check_model(
    stored: Mapping[str, Any],
    model: TransformerConfig,
    path: str | os.PathLike,
    option: str = "ckpt_path",
    instead: str = f"resume with {{fix}}, {NEW_RUN}",
) -> None:
    """Every model option but :data:`FREE_MODEL_OPTIONS` as the checkpoint has it; the vocabulary
    sizes are set by ``data.vocab_size``. The message names the checkpoint as ``option=path``
    and ends with ``instead``, its ``{fix}`` the options to set."""
    given = model.to_dict()
    try:
        stored = TransformerConfig(**stored).to_dict()  # its defaults filled in (num_kv_heads)
    except (TypeError, ValueError) as err:  # edited, or written by other code
        raise CheckpointError(f"{path}: its model config is invalid: {err}") from err
    free = set(FREE_MODEL_OPTIONS)
    if given["positions"] == "learned":  # its table is a weight of max_positions rows
        free.discard("max_positions")
    differ = [k for k in given if k not in free and stored.get(k) != given[k]]
    if not differ:
        return
    fix = {
        ("data.vocab_size" if k.endswith("vocab_size") else f"model.{k}"): show(stored[k])
        for k in differ
    }
    was = " ".join(f"model.{k}={show(stored[k])}" for k in differ)
    now = " ".join(f"model.{k}={show(given[k])}" for k in differ)
    fix = " ".join(f"{k}={v}" for k, v in fix.items())
    raise ConfigError(
        f"{option}={path} holds a model with {was}, but this run's has {now}; "
        + instead.format(fix=fix)
    )
