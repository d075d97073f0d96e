"""What a training step spends its time on, from ``torch.profiler``: one step's kernels, GPU busy
share, host time and SDPA backend (:class:`StepProfile`), and over many steps the time of each
category of work (:func:`categories`).

Categories, each kernel (on CPU: each operator's own time, outside the operators it calls) counted
in the first that holds it:

- ``optimizer``: a multi-tensor operator (``_foreach_*``, ``_fused_*``; not the autocast weights'
  ``_foreach_copy_``): AdamW and gradient clipping;
- ``loss``: inside the loss (an event named like one: ours is the output projection fused with
  the loss, ``_ProjectedLoss``; a peer's, ``cross_entropy_loss`` and its backward), the output
  projection's products included where the loss holds them;
- ``attention``: the SDPA kernels, forward and backward;
- ``matrix products``: ``mm``, ``addmm``, ``bmm`` and their like (the linear layers), and what
  they call;
- ``norms and elementwise``: everything else (layer norms, dropout, residual adds, casts,
  embeddings, masks);
- ``host gaps``: the steps' time when no kernel runs (on CPU: outside every operator's own time),
  the host issuing work or waiting.

On CPU the kernels inductor generates for a compiled graph are no operators to the profiler: their
time is the own time of the range that calls the graph (``## Call CompiledFxGraph ...``, its
Python wrapper included), counted in its category like an operator's (norms and elementwise,
unless a loss holds it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

CATEGORIES = (
    "matrix products",
    "attention",
    "loss",
    "norms and elementwise",
    "optimizer",
    "host gaps",
)
STEP_MARK = "bench_step"  # the record_function range of each profiled step

# The aten op an SDPA call dispatches to, as torch.profiler names it -> its backend.
SDPA_BACKENDS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "mem-efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "cpu-flash",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
}
MATRIX_PRODUCTS = (
    "mkldnn::_linear_pointwise",  # the linear layers' float32 CPU kernel (transformer/linear.py)
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::linear",
    "aten::matmul",
)
COMPILED_GRAPH = "## Call CompiledFxGraph"  # the range around a compiled graph's kernels
ATTENTION_OPS = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")


@dataclass
class StepProfile:
    """One step under torch.profiler. ``kernels``: CUDA kernels (on CPU: aten ops that call no
    other aten op); ``gpu_busy``: the share of the step's span (host start to the last kernel's
    end) when a kernel ran; ``host_ms``: the host's time to issue the step."""

    kernels: int
    gpu_busy: float | None
    host_ms: float
    sdpa: dict[str, int]  # backend -> forward calls
    attention_kernels: list[str]  # CUDA kernel names of attention (forward and backward)


def profiler(device: torch.device) -> torch.profiler.profile:
    """A profiler of the host's operators and, on CUDA, the device's kernels."""
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_step(step: Callable[[], object], device: torch.device) -> StepProfile:
    """Run ``step`` once under torch.profiler: :class:`StepProfile`."""
    synchronize(device)
    with profiler(device) as prof:
        with torch.profiler.record_function(STEP_MARK):
            step()
        synchronize(device)
    return one_step(prof, device)


def one_step(prof: torch.profiler.profile, device: torch.device) -> StepProfile:
    """:class:`StepProfile` of the one step marked :data:`STEP_MARK` in a finished profile."""
    from torch.autograd import DeviceType

    events = prof.events()
    (mark,) = [e for e in events if e.name == STEP_MARK and e.device_type == DeviceType.CPU]
    host = mark.time_range
    sdpa = Counter(SDPA_BACKENDS[e.name] for e in events if e.name in SDPA_BACKENDS)
    if device.type != "cuda":  # the ops that do the work: aten ops calling no other aten op
        return StepProfile(len(_leaves(events)), None, host.elapsed_us() / 1e3, dict(sdpa), [])
    kernels = _kernels(events)
    if not kernels:
        raise RuntimeError("the profile holds no CUDA kernel")
    intervals = [(k.time_range.start, k.time_range.end) for k in kernels]
    end = max([host.end, *(e for _, e in intervals)])
    busy = _union(intervals, host.start, end)
    attention = sorted({e.name[:120] for e in kernels if _attention_kernel(e.name)})
    span = end - host.start
    return StepProfile(len(kernels), busy / span, host.elapsed_us() / 1e3, dict(sdpa), attention)


def categories(prof: torch.profiler.profile, device: torch.device) -> dict[str, float]:
    """Milliseconds a step in each of :data:`CATEGORIES`, averaged over the steps marked
    :data:`STEP_MARK` in a finished profile (each step synchronised before its mark ends); and
    ``steps``, their number."""
    from torch.autograd import DeviceType

    events = prof.events()
    marks = [e for e in events if e.name == STEP_MARK and e.device_type == DeviceType.CPU]
    if not marks:
        raise RuntimeError(f"the profile holds no step marked {STEP_MARK!r}")
    span = sum(m.time_range.elapsed_us() for m in marks)
    totals = dict.fromkeys(CATEGORIES, 0.0)
    in_steps = [e for e in events if e.device_type == DeviceType.CPU and _in_step(e)]
    if device.type == "cuda":
        for op in in_steps:
            for kernel in op.kernels:
                totals[_category(op)] += kernel.duration
        windows = [(m.time_range.start, m.time_range.end) for m in marks]
        busy = sum(
            _union([(k.time_range.start, k.time_range.end) for k in _kernels(events)], start, end)
            for start, end in windows
        )
        totals["host gaps"] = span - busy
    else:  # an operator's own time: aten::mm calls aten::resolve_conj, and computes itself
        ops = [e for e in in_steps if _operator(e) or e.name.startswith(COMPILED_GRAPH)]
        for op in ops:
            totals[_category(op)] += op.self_cpu_time_total
        totals["host gaps"] = span - sum(op.self_cpu_time_total for op in ops)
    out = {name: us / len(marks) / 1e3 for name, us in totals.items()}
    return out | {"steps": len(marks)}


def _in_step(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name == STEP_MARK:
            return True
        parent = parent.cpu_parent
    return False


def _category(op) -> str:
    """The category of the kernels ``op`` launched, from ``op`` and the events around it. (Not
    from the optimizer's step range: Lightning runs the forward and backward inside it.)"""
    chain, event = [], op
    while event is not None:
        chain.append(event.name)
        event = event.cpu_parent
    multi_tensor = [n for n in chain if n.startswith(("aten::_foreach_", "aten::_fused_"))]
    if any(n != "aten::_foreach_copy_" for n in multi_tensor):  # not the autocast weights' copy
        return "optimizer"
    if any("loss" in n.lower() or "crossentropy" in n.lower() for n in chain):
        return "loss"
    if any(a in n for n in chain for a in ATTENTION_OPS):
        return "attention"
    if any(n in MATRIX_PRODUCTS for n in chain):
        return "matrix products"
    return "norms and elementwise"


def _operator(event) -> bool:
    """An operator of the dispatcher (``aten::mm``, ``mkldnn::_linear_pointwise``), not an
    autograd node or a range."""
    return "::" in event.name and not event.name.startswith(("autograd::", "profiler::"))


def _leaves(events: Iterable) -> list:
    """The operators that call no other: on CPU, where the work is done."""
    ops = [e for e in events if _operator(e)]
    return [e for e in ops if not any(_operator(c) for c in e.cpu_children)]


def _kernels(events: Iterable) -> list:
    from torch.autograd import DeviceType

    return [
        e for e in events
        if e.device_type == DeviceType.CUDA
        and not getattr(e, "is_user_annotation", False)  # record_function's GPU-side ranges
        and e.name != STEP_MARK and not e.name.startswith(("Memcpy", "Memset"))
    ]  # fmt: skip


def _union(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Length of the union of ``intervals`` clipped to [start, end]."""
    busy, reach = 0.0, start
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, end)
        if b > a:
            busy += b - a
            reach = b
    return busy


def _attention_kernel(name: str) -> bool:
    lowered = name.lower()
    return any(k in lowered for k in ("flash", "fmha", "attention", "sdpa", "cudnn"))
