"""Pruning attention heads for real: ``python -m transformer.prune CKPT OUT [--heads SPEC |
--share 0.25 --by mask|gradient]``.

Each layer keeps its own head count (``TransformerConfig.heads_per_layer``) and the model computes
exactly what the head-masked model computes, with smaller matrices (:mod:`transformer.surgery`;
grouped-query attention: whole key/value groups). The checkpoint written keeps everything else
(data settings, tokenizers, training state: the optimizer's moments are pruned alongside their
weights), so ``evaluate.py`` scores it and ``train.py ckpt_path=OUT`` fine-tunes it (continuing
the schedule) like any checkpoint.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from transformer.analysis.heads import HeadEvaluator, head_importance
from transformer.atomic import atomic_save
from transformer.checkpoints import (
    load_checkpoint,
    model_from_checkpoint,
    tokenizers_from_checkpoint,
)
from transformer.config import ATTENTION_TYPES
from transformer.data.corpora import SOURCES
from transformer.data.datamodule import checkpoint_texts
from transformer.decoding import DecodeOptions
from transformer.errors import CheckpointError, ConfigError, UserError
from transformer.model import Transformer
from transformer.outputs import check_output_file
from transformer.surgery import (
    HeadKey,
    Selection,
    apply_selection,
    check_removable,
    group_size,
    pruned_config,
    selection,
)
from transformer.training.muon import muon_groups, split_groups
from transformer.training.optim import param_groups
from transformer.translate import Translator

log = logging.getLogger(__name__)

BY = ("mask", "gradient")


def parse_heads(spec: str) -> list[HeadKey]:
    """``"cross:0:1,encoder_self:1:0"`` -> [("cross", 0, 1), ("encoder_self", 1, 0)]."""
    heads = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        kind, *numbers = item.split(":")
        if (
            kind not in ATTENTION_TYPES
            or len(numbers) != 2
            or not all(n.isdigit() for n in numbers)
        ):
            raise ConfigError(
                f"--heads: {item!r} is not TYPE:LAYER:HEAD with TYPE one of "
                f"{', '.join(ATTENTION_TYPES)} (e.g. cross:0:1,encoder_self:1:0)"
            )
        heads.append((kind, int(numbers[0]), int(numbers[1])))
    return heads


def _prune_optimizer(
    state: dict[str, Any], model: Transformer, kept: Selection, path: str
) -> dict[str, Any]:
    """An optimizer state (``optimizer.state_dict()``) for the pruned weights: AdamW's, or
    ``optim=muon_wsd``'s (:class:`transformer.training.muon.MuonAdamW`: Muon's and AdamW's), each
    moment of a pruned matrix cut as the matrix is."""
    groups = param_groups(model, 0.0)
    if set(state) == {"muon", "adamw"}:
        muon, rest = split_groups(muon_groups(groups))
        return {
            "muon": _prune_moments(state["muon"], model, kept, path, muon),
            "adamw": _prune_moments(state["adamw"], model, kept, path, rest),
        }
    return _prune_moments(state, model, kept, path, groups)


def _prune_moments(
    state: dict[str, Any],
    model: Transformer,
    kept: Selection,
    path: str,
    groups: list[dict[str, Any]],
) -> dict[str, Any]:
    """One torch optimizer's state with its moments cut. Its parameters are numbered in the
    order of ``groups`` (:func:`transformer.training.optim.param_groups`), as training built
    the optimizer."""
    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in groups for p in group["params"]]
    saved = [i for group in state["param_groups"] for i in group["params"]]
    if len(saved) != len(order):
        raise CheckpointError(
            f"{path}: its optimizer state holds {len(saved)} parameters, the model "
            f"{len(order)}; it was not written by train.py's optimizer"
        )
    shapes = dict(model.named_parameters())
    moments = {}
    for index, entry in state["state"].items():
        name = order[saved.index(index)]
        shape = shapes[name].shape
        moments[index] = {
            key: value.index_select(*kept[name])
            if name in kept and isinstance(value, Tensor) and value.shape == shape
            else value
            for key, value in entry.items()
        }
    return {**state, "state": moments}


def prune_checkpoint(
    ckpt: dict[str, Any], heads: Iterable[HeadKey], path: str | os.PathLike = "checkpoint"
) -> dict[str, Any]:
    """The checkpoint with ``heads`` removed: weights, model config, optimizer moments; all
    else kept. ``pruned_heads`` records each pruning's heads, numbered as they were then."""
    heads = sorted(set(heads))
    model = model_from_checkpoint(ckpt, path)
    check_removable(model, heads)
    kept = selection(model, heads)
    out = dict(ckpt)
    out["state_dict"] = apply_selection(ckpt["state_dict"], kept, prefix="model.")
    out["hyper_parameters"] = {
        **ckpt["hyper_parameters"],
        "model": pruned_config(model, heads).to_dict(),
    }
    if ckpt.get("optimizer_states"):
        out["optimizer_states"] = [
            _prune_optimizer(state, model, kept, str(path)) for state in ckpt["optimizer_states"]
        ]
    out["pruned_heads"] = [*ckpt.get("pruned_heads", []), [list(h) for h in heads]]
    return out


def checkpoint_scores(
    ckpt: dict[str, Any],
    path: str | os.PathLike,
    by: str,
    split: str = "val",
    sentences: int | None = 200,
    data: Mapping[str, str | None] | None = None,
) -> dict[HeadKey, float]:
    """Each head's importance on the first ``sentences`` pairs of a split of the checkpoint's
    corpus (:mod:`transformer.analysis.heads`): ``by`` = "mask", the loss increase when the head
    alone is masked, or "gradient", Michel et al.'s proxy. ``data``: ``data.*`` options (``root``,
    ``source``, ``src_lang``, ``tgt_lang``, ``target_token``) in place of the checkpoint's, those
    None left as it has them (an imported model records no corpus). Each source gets the target
    token a multilingual model was trained with (``data.target_token``) before it."""
    if by not in BY:
        raise ConfigError(f"--by={by}: choose one of {', '.join(BY)}")
    given = {k: v for k, v in (data or {}).items() if v is not None}
    texts = checkpoint_texts(
        ckpt,
        given,
        CheckpointError(
            f"{path} records no corpus to score heads on; name one (--data-source local "
            "--data-root DIR), or use --heads"
        ),
        f"{path}: its data settings are unusable here",
    )
    sources, references = texts.sources(split), texts.references(split)
    translator = Translator(
        model_from_checkpoint(ckpt, path), *tokenizers_from_checkpoint(ckpt, path)
    )
    if prefix := texts.source_prefix():  # the target token the split's sources had in training
        translator.src_tokenizer = translator.src_tokenizer.with_prefix(prefix)
    evaluator = HeadEvaluator(
        translator, sources[:sentences], references[:sentences], DecodeOptions(strategy="greedy")
    )
    _, scores = head_importance(evaluator, by)
    return {(s.kind, s.layer, s.head): s.delta_loss if by == "mask" else s.gradient for s in scores}


def least_important(
    model: Transformer, scores: dict[HeadKey, float], share: float
) -> list[HeadKey]:
    """The ``share`` of all heads (rounded) that score lowest; under grouped-query attention
    whole key/value groups, by the sum of their heads' scores."""
    if not 0.0 <= share < 1.0:
        raise ConfigError(f"--share={share} must be in [0, 1): the share of heads to remove")
    group = group_size(model.cfg)
    groups = sorted(
        {(kind, layer, head - head % group) for kind, layer, head in scores},
        key=lambda g: (sum(scores[(g[0], g[1], g[2] + i)] for i in range(group)), g),
    )  # ties in a fixed order
    count = round(share * len(groups))
    return [(kind, layer, first + i) for kind, layer, first in groups[:count] for i in
            range(group)]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.prune",
        description="Remove attention heads from a checkpoint: smaller matrices, the same "
        "translations as the head-masked model.",
    )
    parser.add_argument("checkpoint", help="a checkpoint written by train.py (or pruned before)")
    parser.add_argument("output", help="path of the pruned checkpoint to write")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--heads", help="TYPE:LAYER:HEAD,... e.g. cross:0:1,encoder_self:1:0")
    which.add_argument("--share", type=float, help="remove this share of all heads, least "
                       "important first (--by)")  # fmt: skip
    parser.add_argument("--by", choices=BY, default="gradient", help="importance measure for "
                        "--share, on the checkpoint's --split (default: gradient)")  # fmt: skip
    parser.add_argument("--split", default="val", help="split scored for --share (default val)")
    parser.add_argument("--sentences", type=int, default=200, help="its first N pairs (200)")
    parser.add_argument("--data-root", help="the corpus folder, where it moved since training")
    parser.add_argument("--data-source", choices=list(SOURCES), help="the corpus's kind, for a "
                        "checkpoint that records none (an imported model)")  # fmt: skip
    parser.add_argument("--data-src-lang", help="the corpus's source language (default: the "
                        "checkpoint's)")  # fmt: skip
    parser.add_argument("--data-tgt-lang", help="the corpus's target language, e.g. fr for an "
                        "imported multilingual model (default: the checkpoint's)")  # fmt: skip
    parser.add_argument("--target-token", help="the token before each source sentence, for an "
                        "imported multilingual model (>>fra<<); default: the checkpoint's "
                        "(data.target_token)")  # fmt: skip
    parser.add_argument("--force", action="store_true", help="replace an existing OUT")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        check_output_file(args.output, [args.checkpoint], args.force, "OUT")
        ckpt = load_checkpoint(args.checkpoint)
        if args.heads is not None:
            heads = parse_heads(args.heads)
        else:
            data = {
                "root": args.data_root, "source": args.data_source,
                "src_lang": args.data_src_lang, "tgt_lang": args.data_tgt_lang,
                "target_token": args.target_token,
            }  # fmt: skip
            scores = checkpoint_scores(
                ckpt, args.checkpoint, args.by, args.split, args.sentences, data
            )
            heads = least_important(model_from_checkpoint(ckpt), scores, args.share)
        pruned = prune_checkpoint(ckpt, heads, args.checkpoint)
    except UserError as err:
        parser.exit(2, f"error: {err}\n")
    atomic_save(pruned, args.output)
    counts = pruned["hyper_parameters"]["model"]["heads_per_layer"]
    log.info("removed %d heads: %s; heads per layer now %s", len(heads),
             ",".join(f"{k}:{i}:{h}" for k, i, h in heads), counts)  # fmt: skip
    log.info("wrote %s", Path(args.output))


if __name__ == "__main__":
    main()
