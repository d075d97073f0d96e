"""Every decode option is declared for the CTranslate2 engine: mapped to its arguments, about how
results are written or ours runs, or ours alone and then refused by name, never silently dropped;
every position kind and activation has the exporter's mapping, or is refused by name."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from transformer.decoding import DecodeOptions
from transformer.errors import ConfigError
from transformer.export.ct2_translate import HOST, MAPPED, OURS_ONLY, check_options, search_kwargs

# A value other than the default for each option, valid with strategy=beam (sampling's with sample)
OTHER = {
    "strategy": "greedy", "beam_size": 3, "len_penalty": 0.5, "max_len_a": 2.0, "max_len_b": 3,
    "min_len": 2, "nbest": 2, "no_repeat_ngram_size": 3, "temperature": 0.7, "top_k": 5,
    "top_p": 0.9, "seed": 7, "score_prefix": True, "print_scores": True, "alignment": True,
    "alignment_layer": 0, "alignment_head": 1, "graphs": True, "sync_every": 4,
    "static_search": True,
}  # fmt: skip
SAMPLING = {"temperature", "top_k", "top_p", "seed"}


def test_every_decode_option_is_declared_once() -> None:
    names = [f.name for f in fields(DecodeOptions)]
    groups = (MAPPED, HOST, OURS_ONLY)
    assert sorted(names) == sorted(n for group in groups for n in group)
    assert set(OTHER) == set(names)


@pytest.mark.parametrize("name", sorted(OURS_ONLY))
def test_an_option_of_ours_alone_is_refused_by_name(name) -> None:
    base = DecodeOptions(strategy="sample") if name in SAMPLING else DecodeOptions()
    with pytest.raises(ConfigError, match=r"runs our decoder; use engine=torch"):
        check_options(replace(base, **{name: OTHER[name]}))
    if name not in SAMPLING:  # (sampling's options come with strategy=sample, refused first)
        with pytest.raises(ConfigError, match=rf"^decode\.{name}="):
            check_options(replace(base, **{name: OTHER[name]}))


@pytest.mark.parametrize("name", sorted(MAPPED - {"max_len_a", "max_len_b"}))
def test_a_mapped_option_changes_what_ctranslate2_is_asked(name) -> None:
    """(The length rules set each call's limit, tested against our decoder's outputs.)"""
    base = DecodeOptions(beam_size=4, nbest=1)
    changed = replace(base, **{name: OTHER[name]})
    check_options(changed)
    assert search_kwargs(changed, "<pad>", "<s>") != search_kwargs(base, "<pad>", "<s>")


@pytest.mark.parametrize("name", sorted(HOST))
def test_options_of_how_ours_runs_are_accepted(name) -> None:
    check_options(replace(DecodeOptions(), **{name: OTHER[name]}))


def test_every_position_kind_and_activation_has_a_mapping_or_is_refused_by_name() -> None:
    """Each of the model's position kinds and activations has its CTranslate2 mapping but ALiBi
    (CTranslate2's encoder has none), which is refused by name, as a new one without an export
    branch would be, not exported as something else."""
    from typing import get_args, get_type_hints

    from tests.tiny import tiny_model
    from transformer.config import POSITIONS, TransformerConfig
    from transformer.export.ct2 import CT2_ACTIVATIONS, CT2_POSITIONS, check_convertible

    assert set(POSITIONS) - set(CT2_POSITIONS) == {"alibi"}
    assert set(get_args(get_type_hints(TransformerConfig)["activation"])) <= set(CT2_ACTIVATIONS)
    with pytest.raises(ConfigError, match=r"^model\.positions=alibi has no CTranslate2 mapping"):
        check_convertible(tiny_model(positions="alibi"))
    model = tiny_model()
    check_convertible(model)
    for option, value in (("positions", "xpos"), ("activation", "gelu_new")):
        cfg = replace(model.cfg)
        object.__setattr__(cfg, option, value)  # as a config of a newer version would hold it
        model.cfg = cfg
        with pytest.raises(ConfigError, match=rf"^model\.{option}={value} has no CTranslate2"):
            check_convertible(model)
        model = tiny_model()
