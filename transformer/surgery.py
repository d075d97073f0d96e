"""Model surgery on attention heads: removing heads from a model (:func:`prune_model`), putting
them back as zero weights (:func:`restore_heads`), and the parameter slices both cut.

A removed head's rows leave its module's Q, K and V projections and its columns the output
projection, so each layer keeps its own head count (``TransformerConfig.heads_per_layer``) and the
model computes exactly what the head-masked model computes, with smaller matrices. Grouped-query
attention shares keys and values within a group of query heads: whole groups are removed.
Checkpoints and the command line are :mod:`transformer.prune`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

import torch
from torch import Tensor

from transformer.config import ATTENTION_TYPES, TransformerConfig
from transformer.errors import ConfigError
from transformer.model import Transformer

HeadKey = tuple[str, int, int]  # (attention type, layer, head)
Selection = dict[str, tuple[int, Tensor]]  # parameter name -> (dimension, indices kept)


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
    projections (weights and biases), columns of the output projections, and the heads a
    relative bias keeps (``bias_heads``)."""
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
            if module.bias_heads is not None:  # which heads of the stack's relative bias it reads
                kept[f"{prefix}.bias_heads"] = (0, torch.tensor(keep, dtype=torch.long))
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


def apply_selection(
    tensors: dict[str, Tensor], kept: Selection, prefix: str = ""
) -> dict[str, Tensor]:
    """``tensors`` (a state dict, its names after ``prefix``) with what ``kept`` keeps of each."""
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
    pruned.load_state_dict(apply_selection(model.state_dict(), selection(model, heads)))
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
