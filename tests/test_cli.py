"""The commands' user errors: Hydra's composition errors (a misspelt option or group option, an
override it cannot read) are one ``error:`` line naming the option and the fix, exit status 1;
HYDRA_FULL_ERROR=1 keeps Hydra's own report."""

from __future__ import annotations

import os
import sys

import pytest
from hydra.errors import ConfigCompositionException

from transformer.cli import evaluate_main, train_main


def error_line(main, args: list[str], monkeypatch, capsys) -> str:
    """The one line ``main`` exits with, given the command line ``args``."""
    monkeypatch.setattr(sys, "argv", ["train.py", *args])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main()
    assert capsys.readouterr().out == ""
    assert "HYDRA_FULL_ERROR" not in os.environ  # left as it was
    message = str(exit_.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


@pytest.mark.parametrize(
    "main, args, want",
    [
        (train_main, ["model.num_head=4"],
         "error: model.num_head=4: no such option; did you mean model.num_heads or "
         "model.num_kv_heads? (to add a new key, write +model.num_head=4)"),
        (train_main, ["experiment=foo"],
         "error: experiment=foo: no such experiment option; choose one of iwslt17_de_en, "
         "multi30k_en_de, multi30k_en_de_cpu, wmt14_en_de"),
        (train_main, ["+model.num_heads=4"],
         "error: +model.num_heads=4: model.num_heads is an option already; set it without the "
         "+: model.num_heads=4"),
        (train_main, ["model.d_model=["],
         "error: model.d_model=[: not an override Hydra can read (no viable alternative at "
         "input '[')"),
        (evaluate_main, ["ckpt_path=x.ckpt", "data.target_token=>>fra<<"],
         "error: data.target_token=>>fra<<: not an override Hydra can read "
         "(LexerNoViableAltException: data.target_token=>>fra<<); quote the value for Hydra, "
         "inside the shell's quotes: 'data.target_token=\">>fra<<\"'"),
        (evaluate_main, ["ckpt_path=x.ckpt", "decode.beam=3"],
         "error: decode.beam=3: no such option; did you mean decode.beam_size? (to add a new "
         "key, write +decode.beam=3)"),
    ],
)  # fmt: skip
def test_a_composition_error_is_one_line_naming_the_option_and_the_fix(
    main, args, want, monkeypatch, capsys
):
    assert error_line(main, args, monkeypatch, capsys) == want


def test_hydra_full_error_keeps_hydras_own_report(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train.py", "model.num_head=4"])
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ConfigCompositionException, match="Could not override 'model.num_head'"):
        train_main()
