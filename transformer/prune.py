"""Pruning attention heads for real: ``python -m transformer.prune CKPT OUT [--heads SPEC |
--share 0.25 --by mask|gradient]``.

A pruned head's rows leave its module's Q, K and V projections and its columns the output
projection, so each layer keeps its own head count (``TransformerConfig.heads_per_layer``) and the
model computes exactly what the head-masked model computes, with smaller matrices. Grouped-query
attention shares keys and values within a group of query heads: whole groups are removed. The
checkpoint written keeps everything else (data settings, tokenizers, training state: the
optimizer's moments are pruned alongside their weights), so ``evaluate.py`` scores it and
``train.py ckpt_path=OUT`` fine-tunes it (continuing the schedule) like any checkpoint.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transformer.analysis.heads import HeadEvaluator, head_importance
from transformer.atomic import atomic_save
from transformer.checkpoints import (
    load_checkpoint,
    model_from_checkpoint,
    tokenizers_from_checkpoint,
)
from transformer.config import ATTENTION_TYPES, TransformerConfig
from transformer.data.datamodule import checkpoint_texts
from transformer.decoding import DecodeOptions
from transformer.errors import CheckpointError, ConfigError, UserError
from transformer.model import Transformer
from transformer.optim import param_groups
from transformer.outputs import check_output_file
from transformer.translate import Translator

log = logging.getLogger(__name__)

HeadKey = tuple[str, int, int]  # (attention type, layer, head)
Selection = dict[str, tuple[int, Tensor]]  # parameter name -> (dimension, indices kept)
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


def group_size(cfg: TransformerConfig) -> int:
    """Query heads that share one key/value head (1 unless grouped-query)."""
    return cfg.num_heads // cfg.num_kv_heads


def check_removable(model: Transformer, heads: Iterable[HeadKey]) -> None:
    """A ConfigError naming the head that does not exist, or the key/value group removed in
    part (grouped-query attention shares keys and values within a group of query heads)."""
    heads = set(heads)
    group = group_size(model.cfg)
    for kind, layer, head in sorted(heads):
        modules = model.attention_modules(kind)
        if not 0 <= layer < len(modules) or not 0 <= head < modules[layer].num_heads:
            counts = [m.num_heads for m in modules]
            raise ConfigError(
                f"--heads: {kind}:{layer}:{head} does not exist; {kind} has {len(modules)} "
                f"layers with {counts} heads (numbered from 0)"
            )
        first = head - head % group
        members = {(kind, layer, h) for h in range(first, first + group)}
        if not members <= heads:
            raise ConfigError(
                f"--heads: {kind}:{layer}:{head} shares its keys and values with heads "
                f"{first}-{first + group - 1} (grouped-query attention, num_kv_heads="
                f"{model.cfg.num_kv_heads}); remove the whole group or none of it"
            )


def _rows(heads: Sequence[int], head_dim: int, start: int = 0) -> Tensor:
    """The rows (or columns) of ``heads``' slices in a projection: (len(heads) * head_dim,)."""
    offsets = torch.arange(head_dim)
    return torch.cat([start + h * head_dim + offsets for h in heads] or [offsets[:0]])


def selection(model: Transformer, heads: Iterable[HeadKey]) -> Selection:
    """What pruning ``heads`` keeps of each parameter it touches: rows of the Q, K, V
    projections (weights and biases), columns of the output projections."""
    heads = set(heads)
    names = {id(module): name for name, module in model.named_modules()}
    kept: Selection = {}
    for kind in ATTENTION_TYPES:
        for layer, module in enumerate(model.attention_modules(kind)):
            removed = {h for k, i, h in heads if (k, i) == (kind, layer)}
            if not removed:
                continue
            H, Hkv, Dh = module.num_heads, module.num_kv_heads, module.head_dim
            keep = [h for h in range(H) if h not in removed]
            kv_keep = sorted({h // (H // Hkv) for h in keep})
            q, k = _rows(keep, Dh), _rows(kv_keep, Dh)
            projections = (
                {"q_proj": q, "kv_proj": torch.cat([k, Hkv * Dh + k])}
                if module.cross
                else {"qkv_proj": torch.cat([q, H * Dh + k, (H + Hkv) * Dh + k])}
            )
            prefix = names[id(module)]
            for projection, rows in projections.items():
                for param in ("weight", "bias"):
                    kept[f"{prefix}.{projection}.{param}"] = (0, rows)
            kept[f"{prefix}.out_proj.weight"] = (1, q)
    return kept


def pruned_config(model: Transformer, heads: Iterable[HeadKey]) -> TransformerConfig:
    removed: dict[tuple[str, int], int] = {}
    for kind, layer, _ in set(heads):
        removed[(kind, layer)] = removed.get((kind, layer), 0) + 1
    counts = {
        kind: [m.num_heads - removed.get((kind, i), 0) for i, m in
               enumerate(model.attention_modules(kind))]
        for kind in ATTENTION_TYPES
    }  # fmt: skip
    return replace(model.cfg, heads_per_layer=counts)


def _select(tensors: dict[str, Tensor], kept: Selection, prefix: str = "") -> dict[str, Tensor]:
    return {
        name: value.index_select(*kept[name[len(prefix) :]])
        if name.startswith(prefix) and name[len(prefix) :] in kept
        else value
        for name, value in tensors.items()
    }


def prune_model(model: Transformer, heads: Iterable[HeadKey]) -> Transformer:
    """A new model without ``heads`` (``(type, layer, head)``, numbered as in ``model``): it
    computes what ``model`` computes with those heads masked."""
    heads = list(heads)
    check_removable(model, heads)
    pruned = Transformer(pruned_config(model, heads))
    param = next(model.parameters())
    pruned.load_state_dict(_select(model.state_dict(), selection(model, heads)))
    return pruned.to(param.device, param.dtype).train(model.training)


def restore_heads(model: Transformer) -> Transformer:
    """A pruned model with every layer back at ``num_heads`` heads, the removed ones as zero
    weights (their queries, keys and values are 0, so they attend uniformly to zero values): it
    computes what ``model`` computes, for a format with one head count per layer stack
    (CTranslate2). Remaining heads come first in each layer."""
    full = Transformer(replace(model.cfg, heads_per_layer=None))
    absent = [
        (kind, layer, head)
        for kind in ATTENTION_TYPES
        for layer, count in enumerate(model.cfg.layer_heads(kind))
        for head in range(count, model.cfg.num_heads)
    ]
    kept = selection(full, absent)
    state = full.state_dict()
    for name, value in model.state_dict().items():
        if name in kept:
            dim, index = kept[name]
            state[name] = torch.zeros_like(state[name]).index_copy_(dim, index, value)
        else:
            state[name] = value
    full.load_state_dict(state)
    param = next(model.parameters())
    return full.to(param.device, param.dtype).train(model.training)


def _prune_optimizer(
    state: dict[str, Any], model: Transformer, kept: Selection, path: str
) -> dict[str, Any]:
    """An AdamW state (``optimizer.state_dict()``) for the pruned weights: the moments of each
    pruned matrix cut as the matrix is. Parameters are numbered in the order
    :func:`transformer.optim.param_groups` gives them, as training built the optimizer."""
    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in param_groups(model, 0.0) for p in group["params"]]
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
    out["state_dict"] = _select(ckpt["state_dict"], kept, prefix="model.")
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
    data_root: str | None = None,
) -> dict[HeadKey, float]:
    """Each head's importance on the first ``sentences`` pairs of a split of the checkpoint's
    corpus (:mod:`transformer.analysis.heads`): ``by`` = "mask", the loss increase when the head
    alone is masked, or "gradient", Michel et al.'s proxy."""
    if by not in BY:
        raise ConfigError(f"--by={by}: choose one of {', '.join(BY)}")
    texts = checkpoint_texts(
        ckpt,
        {} if data_root is None else {"root": data_root},
        CheckpointError(f"{path} records no data settings to score heads on; use --heads"),
        f"{path}: its data settings are unusable here",
    )
    sources, references = texts.sources(split), texts.references(split)
    translator = Translator(
        model_from_checkpoint(ckpt, path), *tokenizers_from_checkpoint(ckpt, path)
    )
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
    parser.add_argument("--force", action="store_true", help="replace an existing OUT")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        check_output_file(args.output, [args.checkpoint], args.force, "OUT")
        ckpt = load_checkpoint(args.checkpoint)
        if args.heads is not None:
            heads = parse_heads(args.heads)
        else:
            scores = checkpoint_scores(
                ckpt, args.checkpoint, args.by, args.split, args.sentences, args.data_root
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
