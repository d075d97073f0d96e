"""docs/finetune.md's "Start from an OPUS-MT model" runs as written: its shell commands, read
from the page, on a tiny random MarianMT directory (``tests/export/tiny_marian.py``) and a tiny
local corpus: the import, both evaluations, the fine-tuning with the options the import prints
(parsed from its log: a printed line that stopped working fails here), the tuned checkpoint's
evaluation, the head analysis and pruning, and the exports to CTranslate2 and to Hugging Face,
which then translate as the tuned checkpoint does. The page's printed line is what the import
prints for OPUS-MT en-de's config.json."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.export.tiny_marian import write_marian_dir
from tests.tiny import ATTENTION_MAPS_OFF, REPO, script_env, write_corpus, write_lines
from transformer.checkpoints import load_checkpoint, model_from_checkpoint
from transformer.checkpoints import tokenizers_from_checkpoint as tokenizers
from transformer.decoding import DecodeOptions
from transformer.export.hf_import import model_config, train_overrides
from transformer.translate import Translator

pytestmark = pytest.mark.heavy

transformers = pytest.importorskip("transformers", reason="the reference: pip install transformers")

PAGE = REPO / "docs" / "finetune.md"
SECTION = PAGE.read_text().split("## Start from an OPUS-MT model\n", 1)[1].split("\n## ", 1)[0]
# the commands that fetch the model (network) or install the extra: the page's, not run here
SETUP = ("pip", "huggingface-cli", "git")
DOMAIN = "/path/to/domain"  # the page's corpus folder, a tiny local corpus here
PRINTED = re.compile(r"fine-tune it with: python train\.py init_from=(\S+) (.*?) \.\.\.", re.S)

# Helsinki-NLP/opus-mt-en-de's config.json (the fields the import reads)
OPUS_MT_EN_DE = {
    "model_type": "marian", "vocab_size": 58101, "decoder_vocab_size": 58101, "d_model": 512,
    "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 8,
    "decoder_attention_heads": 8, "encoder_ffn_dim": 2048, "decoder_ffn_dim": 2048,
    "activation_function": "swish", "max_position_embeddings": 512, "scale_embedding": True,
    "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True, "dropout": 0.1,
    "attention_dropout": 0.0, "activation_dropout": 0.0, "pad_token_id": 58100,
    "eos_token_id": 0, "decoder_start_token_id": 58100,
}  # fmt: skip

# What the tests add to the page's commands: sizes for a tiny model on 2 CPU cores, no wandb
TRAIN_SIZES = [
    "trainer.max_steps=4", "logger=csv", "data.max_len=60",  # (the tiny model: 64 positions)
    "data.num_workers=0", "trainer.accelerator=cpu", "trainer.precision=32-true",
    "trainer.enable_progress_bar=false", "validation.bleu_sentences=8", ATTENTION_MAPS_OFF,
]  # fmt: skip
EVALUATE_SIZES = ["decode.max_len_a=0", "decode.max_len_b=12"]
HEADS_SIZES = ["analysis_options.sentences=4", "analysis_options.importance=gradient"]
PRUNE_SIZES = ["--sentences", "4"]


def page_commands() -> list[list[str]]:
    """The section's shell commands, words as the shell splits them (continuations joined,
    comments dropped)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", SECTION, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words:
                end = words.index("&&") if "&&" in words else len(words)
                commands.append(words[:end])
                words = words[end + 1 :]
    return commands


def page_printed() -> tuple[str, list[str]]:
    """The checkpoint and the options of the page's printed "fine-tune it with" line."""
    block = re.search(r"```text\n(fine-tune it with:.*?)```", SECTION, flags=re.S)
    assert block, "the page shows the import's printed line"
    ckpt, options = PRINTED.search(" ".join(block.group(1).split())).groups()
    return ckpt, options.split()


def test_the_pages_printed_line_is_what_the_import_prints_for_opus_mt_en_de() -> None:
    """(vocab.json's 58,101 ids and our bos.)"""
    _, options = page_printed()
    assert options == train_overrides(model_config(OPUS_MT_EN_DE, 58101 + 1))


def test_the_pages_fine_tuning_command_takes_the_printed_options_as_printed() -> None:
    ckpt, options = page_printed()
    (train,) = [c for c in page_commands() if c[1:2] == ["train.py"]]
    start = train.index(f"init_from={ckpt}") + 1
    assert train[start : start + len(options)] == options


def run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{shlex.join(command)}\n{done.stderr[-3000:]}"
    return done


def greedy(translator: Translator, lines: list[str], b: int) -> list[str]:
    options = DecodeOptions(strategy="greedy", max_len_a=0.0, max_len_b=b, min_len=0)
    return [t[0].text for t in translator.translate(lines, options)]


@pytest.mark.slow  # a training run and eight CLI subprocesses
def test_the_pages_commands_run_on_a_tiny_model(tmp_path) -> None:
    commands = page_commands()
    assert {c[0] for c in commands} == {"python", *SETUP}
    commands = [c for c in commands if c[0] == "python"]
    _, docs_options = page_printed()
    *_, src, dst = next(c for c in commands if c[1:3] == ["-m", "transformer.export.hf_import"])
    write_marian_dir(tmp_path / src)  # the page's directory name
    corpus = write_corpus(tmp_path / "domain")
    inputs = [re.sub(r"^input=", "", w) for c in commands for w in c if w.startswith("input=")]
    for name in inputs:
        write_lines(tmp_path / name, (corpus / "test.en").read_text().splitlines()[:5])
    env = script_env(tmp_path) | {"WANDB_MODE": "offline"}
    printed = None
    for command in commands:
        words = [w.replace(DOMAIN, str(corpus)) for w in command[1:]]
        script = words[0]
        if script in ("evaluate.py", "train.py"):
            words[0] = str(REPO / script)
        if script == "evaluate.py":
            words += EVALUATE_SIZES + (HEADS_SIZES if "analysis=heads" in words else [])
        if words[:2] == ["-m", "transformer.prune"]:
            words += PRUNE_SIZES
        if script == "train.py":  # the page's printed options replaced by those printed here
            assert printed is not None, "the import runs before the fine-tuning"
            start = words.index(f"init_from={printed[0]}") + 1
            words[start : start + len(docs_options)] = printed[1]
            words += TRAIN_SIZES
        done = run([sys.executable, *words], tmp_path, env)
        if words[:2] == ["-m", "transformer.export.hf_import"]:
            match = PRINTED.search(done.stderr + done.stdout)
            assert match, done.stderr
            printed = (match.group(1), match.group(2).split())
            assert printed[0] == dst
        if script == "evaluate.py" and "split=test" in words and "analysis=heads" not in words:
            assert "BLEU = " in done.stdout
    (heads,) = [w[14:] for c in commands if "analysis=heads" in c for w in c if "run.dir=" in w]
    assert len(json.loads((tmp_path / heads / "heads.json").read_text())["heads"]) == 24
    (pruned,) = [c[4] for c in commands if c[1:3] == ["-m", "transformer.prune"]]
    assert len(load_checkpoint(tmp_path / pruned)["pruned_heads"][-1]) == 6  # a quarter of 24
    for name in inputs:  # translated, one line each
        (output,) = [w[7:] for c in commands if f"input={name}" in c for w in c if "output=" in w]
        assert len((tmp_path / output).read_text().splitlines()) == 5
    exports = {c[3]: c[5] for c in commands if c[1:3] == ["-m", "transformer.export"]}
    assert set(exports) == {"ct2", "hf"}
    (tuned,) = {c[4] for c in commands if c[1:3] == ["-m", "transformer.export"]}
    tuned = tmp_path / tuned
    ckpt = load_checkpoint(tuned)
    assert ckpt["global_step"] == 4
    ours = Translator(model_from_checkpoint(ckpt), *tokenizers(ckpt, tuned))
    lines = (corpus / "test.en").read_text().splitlines()[:8]
    want = greedy(ours, lines, b=12)

    from transformer.export.ct2_translate import CT2Translator

    options = DecodeOptions(strategy="greedy", max_len_a=0.0, max_len_b=12, min_len=0)
    got = CT2Translator(tmp_path / exports["ct2"], threads=1).translate(lines, options)
    assert [t[0].text for t in got] == want

    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    hf_dir = tmp_path / exports["hf"]
    model = AutoModelForSeq2SeqLM.from_pretrained(hf_dir).eval()
    tok = AutoTokenizer.from_pretrained(hf_dir)
    out = model.generate(
        **tok(lines, return_tensors="pt", padding=True), do_sample=False, num_beams=1,
        max_length=12 + 2, min_length=0,
    )  # fmt: skip
    assert tok.batch_decode(out, skip_special_tokens=True) == want
