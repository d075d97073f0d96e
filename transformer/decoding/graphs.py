"""CUDA graphs of decoding: a cached model step's hundred-odd kernels launched as one graph
(:class:`GraphedStep`), or the whole search step's, model and search
(:class:`GraphedSearchStep`, :mod:`transformer.decoding.static`).

A step on a static cache (``transformer.kv_cache.DecoderCache``) reads and writes the same
addresses every time: the newest tokens, the device position, the cache's buffers. Its graph is
captured at the second step of a batch size, after a warm-up on a side stream (PyTorch's advice:
lazy initialisation stays out of the capture), and replayed until the rows change (the beams'
expansion, sentences leaving into a smaller size), when :meth:`GraphedStep.reset` drops it. A
size stepped once (beam search's first step) runs eagerly and captures nothing.

The whole search step keeps one shape from its first step to its last (finished sentences stay,
frozen), so its graph is captured once a batch and replayed at every later step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


class GraphedStep:
    """``step`` (tokens (N, 1) -> (N, V) log-probabilities, on a static cache) replayed from a
    CUDA graph; the caller sets the cache's position before each call and counts the step
    after it."""

    def __init__(self, step: Callable[[Tensor], Tensor]) -> None:
        self.step = step
        self.reset()

    def reset(self) -> None:
        """Forget the graph: the cache's buffers moved (a new batch size)."""
        self.graph: torch.cuda.CUDAGraph | None = None
        self.tokens: Tensor | None = None  # (N, 1) the graph's input
        self.lprobs: Tensor | None = None  # (N, V) its output, rewritten by each replay
        self.stepped = False  # a step ran at this size: the next one captures

    def __call__(self, tokens: Tensor) -> Tensor:
        if self.graph is None and not self.stepped:
            self.stepped = True
            return self.step(tokens)
        if self.graph is None:
            self._capture(tokens)
        else:
            self.tokens.copy_(tokens)
        self.graph.replay()
        return self.lprobs

    def _capture(self, tokens: Tensor) -> None:
        self.tokens = tokens.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.step(self.tokens)  # the warm-up: the same step, written to the same cache rows
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.lprobs = self.step(self.tokens)


class GraphedSearchStep:
    """A whole search step, ``step`` (no arguments: the model's step and the search's, on fixed
    tensors changed in place; :mod:`transformer.decoding.static`), replayed from one CUDA graph.

    The first call runs the step eagerly on a side stream: the warm-up, and a real step (beam
    search's first, its beams but one at -inf, has the later steps' shapes). The second captures
    the step, which runs nothing, then replays it; every later call replays it.
    """

    def __init__(self, step: Callable[[], None]) -> None:
        self.step = step
        self.graph: torch.cuda.CUDAGraph | None = None
        self.stepped = False

    def __call__(self) -> None:
        if not self.stepped:
            self.stepped = True
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.step()
            torch.cuda.current_stream().wait_stream(side)
            return
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.step()
        self.graph.replay()
