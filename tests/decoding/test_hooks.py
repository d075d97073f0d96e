"""The searches' hook interface: a feature is one SearchHook that greedy, beam search and sampling
call at the same moments; a hook that overrides nothing launches nothing and changes nothing."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import Tensor

from tests.decoding.test_decoding import Kernels
from tests.tiny import tiny_model
from transformer.decoding import DecodeOptions, beam_search, greedy_decode, sample
from transformer.decoding.hooks import Hooks, SearchHook

BOS, EOS = 2, 3
SEARCHES = {"greedy": greedy_decode, "beam": beam_search, "sample": sample}


def decode_options(strategy: str, min_len: int) -> DecodeOptions:
    nbest = 1 if strategy == "greedy" else 2
    return DecodeOptions(strategy=strategy, beam_size=3, min_len=min_len, max_len_b=8, nbest=nbest)


def plug(monkeypatch, extra: SearchHook) -> None:
    """Every search's hooks, then ``extra``: a feature added without touching a search."""
    for name in ("beam_search", "greedy"):  # (the package's beam_search is the function)
        module = importlib.import_module(f"transformer.decoding.{name}")
        made = module.search_hooks
        monkeypatch.setattr(
            module, "search_hooks", lambda *a, made=made, **k: Hooks(made(*a, **k), extra)
        )


def source() -> Tensor:
    torch.manual_seed(0)
    src = torch.randint(4, 50, (3, 7))
    src[1, 4:] = 0  # padding
    return src


@pytest.mark.parametrize("strategy", SEARCHES)
def test_a_hook_that_overrides_no_moment_launches_no_kernel_and_changes_nothing(
    strategy, monkeypatch
) -> None:
    model, src = tiny_model(), source()
    options = decode_options(strategy, min_len=2)

    def run() -> tuple[list, list[str]]:
        with Kernels() as kernels:
            out = SEARCHES[strategy](model, src, options, bos_id=BOS, eos_id=EOS)
        return [[(h.tokens, h.score) for h in hyps] for hyps in out], kernels.ops

    plain, plain_ops = run()
    plug(monkeypatch, SearchHook())
    hooked, hooked_ops = run()
    assert hooked == plain
    assert hooked_ops == plain_ops


class BanToken(SearchHook):
    """A new decoding feature in a few lines: one id never produced."""

    def __init__(self, token: int) -> None:
        self.token = token

    def log_probs(self, lprobs: Tensor, prefixes: Tensor, t: int) -> Tensor:
        return lprobs.index_fill(1, torch.tensor([self.token]), float("-inf"))


@pytest.mark.parametrize("strategy", SEARCHES)
def test_a_new_feature_is_one_hook_that_every_search_calls(strategy, monkeypatch) -> None:
    model, src = tiny_model(), source()
    options = decode_options(strategy, min_len=3)
    produced = {
        t for hyps in SEARCHES[strategy](model, src, options, bos_id=BOS, eos_id=EOS)
        for h in hyps for t in h.tokens
    }  # fmt: skip
    assert produced, "the untouched search produced no token to ban"
    banned = max(produced)
    plug(monkeypatch, BanToken(banned))
    out = SEARCHES[strategy](model, src, options, bos_id=BOS, eos_id=EOS)
    assert all(banned not in h.tokens for hyps in out for h in hyps)
