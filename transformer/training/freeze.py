"""Parts of the model kept fixed while training (``freeze``), as fine-tuning often wants."""

from __future__ import annotations

from torch import nn

# What ``freeze`` may name: the model's parts, as its attributes
PARTS = {
    "embeddings": ("src_embed", "tgt_embed"),  # the tables (and learned positions)
    "encoder": ("encoder",),
    "decoder": ("decoder",),
    "output": ("output",),  # the output projection (the target embedding's, when tied)
}


def freeze(model: nn.Module, parts: list[str]) -> None:
    """Keep ``parts`` of the model (:data:`PARTS`) fixed: their parameters take no gradient, so
    the optimizer leaves them alone. A parameter shared with another part (the tied output
    projection is the target embedding) is fixed for both."""
    for part in parts:
        if part not in PARTS:
            raise ValueError(f"freeze: {part!r} is not a part; choose from {', '.join(PARTS)}")
        for name in PARTS[part]:
            for p in getattr(model, name).parameters():
                p.requires_grad_(False)
