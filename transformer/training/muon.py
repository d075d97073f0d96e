"""Muon on the layers' weight matrices, AdamW on everything else, as one optimizer.

Muon (Jordan et al., 2024) replaces each weight matrix's momentum update by its nearest
semi-orthogonal matrix (a few Newton-Schulz iterations). It is meant for the matrices that
multiply hidden states, the group :func:`transformer.training.optim.param_groups` decays;
embeddings (the tied output projection with them), biases, norms and position tables keep AdamW.
Each matrix's update is scaled to AdamW's typical RMS (``0.2 * sqrt(max(rows, columns))``; Liu et
al., 2025, "Muon is scalable for LLM training"), so both share one learning rate, one weight decay
and one schedule (``optim=muon_wsd``).

:class:`Muon` is ``torch.optim.Muon``'s update (its momentum, Nesterov, quintic coefficients and
decoupled weight decay) with two changes for this model's many small matrices: the matrices of one
shape are orthogonalised together (batched products instead of one matrix at a time), and in
float32 on a CPU (torch's casts to bfloat16, which a CPU without bf16 instructions emulates
slowly). The matrices must be whole on every process: DDP, not FSDP's flat shards.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim import AdamW, Optimizer

# torch.optim.Muon's quintic Newton-Schulz coefficients (Keller Jordan's)
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def orthogonalise(g: Tensor, steps: int, dtype: torch.dtype, eps: float = 1e-7) -> Tensor:
    """About the nearest semi-orthogonal matrices to g (K, A, B), each of the K alone, in
    ``dtype``; returned in g's dtype."""
    x = g.to(dtype)
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT  # (K, B, A): the Gram matrices below are the smaller side's
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)  # spectral norms <= 1
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):
        gram = x @ x.mT  # (K, m, m)
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return (x.mT if tall else x).to(g.dtype)


def closure_loss(closure: Callable[[], float] | None) -> float | None:
    """A step's closure run with gradients (the loss it returns), as torch's optimizers run it;
    None without one."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class Muon(Optimizer):
    """torch.optim.Muon's update on 2-D parameters, batched by shape, each update scaled to
    AdamW's RMS. ``ns_dtype``: the Newton-Schulz iterations' dtype; None = bfloat16 on CUDA (as
    torch's), float32 elsewhere."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        ns_dtype: torch.dtype | None = None,
    ) -> None:
        defaults = dict(
            lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
            ns_steps=ns_steps,
        )  # fmt: skip
        super().__init__(params, defaults)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = closure_loss(closure)
        for group in self.param_groups:
            by_shape: dict[tuple[torch.Size, torch.device], list[Tensor]] = defaultdict(list)
            for p in group["params"]:
                if p.grad is not None:
                    by_shape[p.shape, p.device].append(p)
            for (shape, device), params in by_shape.items():
                self._update(group, params, shape, device)
        return loss

    def _update(
        self, group: dict[str, Any], params: list[Tensor], shape: torch.Size, device: torch.device
    ) -> None:
        """One step for the parameters of one shape: momentum, the Nesterov look-ahead,
        orthogonalised together, decoupled weight decay, the update."""
        grads = [p.grad for p in params]
        bufs = [self.state[p].setdefault("momentum_buffer", torch.zeros_like(p)) for p in params]
        torch._foreach_lerp_(bufs, grads, 1 - group["momentum"])
        update = torch.stack(bufs)  # (K, A, B)
        if group["nesterov"]:
            update = torch.stack(grads).lerp_(update, group["momentum"])
        dtype = self.ns_dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
        update = orthogonalise(update, group["ns_steps"], dtype)
        lr = group["lr"]
        torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
        torch._foreach_add_(params, list(update.unbind(0)), alpha=-lr * 0.2 * math.sqrt(max(shape)))


class MuonAdamW(Optimizer):
    """:class:`Muon` on the groups marked ``"muon": True`` (2-D parameters only),
    ``torch.optim.AdamW`` on the others; ``lr`` and ``weight_decay`` are both's defaults.

    The two share the parameter groups (``param_groups`` is Muon's then AdamW's, the same
    dicts), so a learning-rate schedule and gradient clipping act on both. ``state_dict``
    holds each one's own.
    """

    def __init__(
        self,
        params: Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        fused: bool | None = None,
    ) -> None:
        matrices, others = split_groups(params)
        flat = [tuple(p.shape) for g in matrices for p in g["params"] if p.dim() != 2]
        if flat or not any(g["params"] for g in matrices):
            raise ValueError(
                "optim=muon_wsd needs the layers' weight matrices whole (2-D): got "
                f"{flat[:3] or 'none'}. Under trainer=fsdp they are flat shards; train with "
                "DDP (trainer=ddp), or choose optim=adamw_wsd."
            )
        self.muon = Muon(
            matrices, lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
            ns_steps=ns_steps,
        )  # fmt: skip
        self.adamw = AdamW(
            others, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused
        )
        super().__init__(self.muon.param_groups + self.adamw.param_groups, {"lr": lr})
        self._share()

    def _share(self) -> None:
        """The groups as the two optimizers hold them (again after loading, which gives each
        new group dicts)."""
        self.param_groups = self.muon.param_groups + self.adamw.param_groups

    @property
    def state(self) -> dict[Tensor, Any]:
        """Both optimizers' state by parameter, to read: each keeps and steps its own."""
        return {**self.muon.state, **self.adamw.state}

    @state.setter
    def state(self, value: dict[Tensor, Any]) -> None:
        if value:  # Optimizer.__init__ sets an empty one
            raise AttributeError("MuonAdamW's state is its two optimizers': load_state_dict")

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = closure_loss(closure)
        self.muon.step()
        self.adamw.step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if set(state_dict) != {"muon", "adamw"}:
            raise ValueError(
                "this optimizer state is not optim=muon_wsd's (keys "
                f"{sorted(state_dict)[:4]}): resume a Muon run from its own checkpoint, or "
                "start from the weights alone"
            )
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])
        self._share()


def split_groups(
    groups: Iterable[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Copies of the groups marked ``"muon": True`` (the mark dropped), and of the others, each
    in order: Muon's and AdamW's, as :class:`MuonAdamW` numbers their parameters."""
    matrices: list[dict[str, Any]] = []
    others: list[dict[str, Any]] = []
    for group in map(dict, groups):
        (matrices if group.pop("muon", False) else others).append(group)
    return matrices, others


def muon_groups(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`transformer.training.optim.param_groups`' groups for :class:`MuonAdamW`: the
    decayed group's matrices (its first) marked for Muon, the rest for AdamW."""
    decay, *rest = groups
    matrices = [p for p in decay["params"] if p.dim() == 2]
    others = [p for p in decay["params"] if p.dim() != 2]
    return [
        {**decay, "params": matrices, "muon": True},
        *([{**decay, "params": others}] if others else []),
        *rest,
    ]
