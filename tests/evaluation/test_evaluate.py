"""evaluate.py end to end on a tiny trained checkpoint: scores, files translated in chunks and
resumed, forced scoring, ensembles, alignments; checkpoint averaging and bad checkpoints."""

from __future__ import annotations

import io
import json
import logging
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sacrebleu
import torch

from tests.tiny import (
    REPO,
    compose_cfg,
    compose_eval_cfg,
    other_tokenizer,
    tiny_overrides,
    trained_elsewhere,
)
from transformer.averaging import average_checkpoints
from transformer.averaging import main as average_main
from transformer.checkpoints import (
    load_checkpoint,
    load_ensemble,
    model_from_checkpoint,
    tokenizers_from_checkpoint,
)
from transformer.data.tokenizer import BOS_ID, EOS_ID
from transformer.errors import CheckpointError, ConfigError, DataError
from transformer.evaluation import evaluate
from transformer.line_batches import length_batches
from transformer.training import train

pytestmark = pytest.mark.heavy


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory) -> tuple[Path, Path]:
    """A tiny model trained briefly; the training data's cache is deleted afterwards, so
    evaluation can only use what the checkpoint carries (and the raw corpus)."""
    out = tmp_path_factory.mktemp("run")
    overrides = [*tiny_overrides(corpus), "trainer.max_steps=40"]
    train(compose_cfg(overrides, out))
    shutil.rmtree(corpus / "cache")
    return out / "checkpoints" / "last.ckpt", corpus


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


@pytest.mark.slow
def test_metrics_equal_sacrebleu_on_the_written_hypotheses(trained, tmp_path) -> None:
    ckpt, corpus = trained
    metrics = evaluate(
        compose_eval_cfg([f"ckpt_path={ckpt}", "split=test", "decode.beam_size=3"], tmp_path)
    )
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written == json.loads(json.dumps(metrics))
    hyps, refs = lines(tmp_path / "hypotheses.txt"), lines(corpus / "test.de")
    assert len(hyps) == len(refs) == written["num_sentences"] == 32
    assert written["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    lowercased = sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score
    assert written["bleu_lc"] == pytest.approx(lowercased)
    assert written["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    chrf_pp = sacrebleu.corpus_chrf(hyps, [refs], word_order=2).score
    assert written["chrf_pp"] == pytest.approx(chrf_pp)
    assert written["ter"] == pytest.approx(sacrebleu.corpus_ter(hyps, [refs]).score)
    assert "tok:13a" in written["signature"]["bleu"] and "nw:2" in written["signature"]["chrf_pp"]
    assert "tok:tercom" in written["signature"]["ter"]
    assert "case:lc" in written["signature"]["bleu_lc"]
    assert written["split"] == "test" and written["direction"] == "en-de"
    assert written["decode"]["beam_size"] == 3
    assert written["translate_seconds"] > 0
    assert written["device"] == ("cuda" if torch.cuda.is_available() else "cpu")  # device=auto


@pytest.mark.slow
def test_an_input_file_translated_and_scored_against_a_reference_scores_as_the_split(
    trained, tmp_path, monkeypatch
) -> None:
    """input=FILE reference=FILE: the translations (into output=) scored as the split's are,
    with the BLEU tokenizer of metrics.tokenize; from standard input, a reference of another
    length is refused once the lines are counted, the translations kept."""
    ckpt, corpus = trained
    run = [f"ckpt_path={ckpt}", "decode=greedy", "metrics.tokenize=char"]
    split = evaluate(compose_eval_cfg(run, tmp_path / "split"))
    hyps, refs = lines(tmp_path / "split" / "hypotheses.txt"), lines(corpus / "test.de")
    assert split["bleu"] == pytest.approx(
        sacrebleu.corpus_bleu(hyps, [refs], tokenize="char").score
    )
    assert "tok:char" in split["signature"]["bleu"] and "tok:char" in split["signature"]["bleu_lc"]
    output, reference = tmp_path / "test.hyp.de", corpus / "test.de"
    files = [f"input={corpus / 'test.en'}", f"reference={reference}", f"output={output}"]
    scored = evaluate(compose_eval_cfg([*run, *files], tmp_path / "input"))
    assert lines(output) == hyps and scored["lines"] == 32 and scored["output"] == str(output)
    assert json.loads((tmp_path / "input" / "metrics.json").read_text()) == scored
    for name in ("bleu", "bleu_lc", "chrf", "chrf_pp", "ter"):
        assert scored[name] == pytest.approx(split[name]), name
    assert scored["signature"] == split["signature"] and scored["num_sentences"] == 32
    source = source_file(corpus, tmp_path / "source.en")  # 34 lines
    stdin = io.TextIOWrapper(io.BufferedReader(io.BytesIO(source.read_bytes())))
    monkeypatch.setattr(sys, "stdin", stdin)
    kept = tmp_path / "stdin" / "hypotheses.txt"
    message = (
        rf"input=- has 34 lines but reference={reference} has 32: .*translations are in {kept}"
    )
    with pytest.raises(DataError, match=message):
        evaluate(compose_eval_cfg([*run, "input=-", f"reference={reference}"], tmp_path / "stdin"))
    assert len(lines(tmp_path / "stdin" / "hypotheses.txt")) == 34


@pytest.mark.slow
def test_a_split_alias_is_resolved_once(trained, tmp_path) -> None:
    """split=test names the file split data.test_split says, even when that is another
    alias's name: the swapped names translate and score the val files."""
    ckpt, corpus = trained
    swapped = ["data.test_split=val", "data.val_split=test"]
    metrics = evaluate(compose_eval_cfg([f"ckpt_path={ckpt}", "split=test", *swapped], tmp_path))
    hyps, refs = lines(tmp_path / "hypotheses.txt"), lines(corpus / "val.de")
    assert metrics["split"] == "val"
    assert metrics["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    unswapped = evaluate(compose_eval_cfg([f"ckpt_path={ckpt}", "split=val"], tmp_path / "val"))
    assert lines(tmp_path / "val" / "hypotheses.txt") == hyps
    assert unswapped["bleu"] == pytest.approx(metrics["bleu"])


@pytest.mark.slow
def test_input_file_translates_like_the_split(trained, tmp_path) -> None:
    ckpt, corpus = trained
    evaluate(compose_eval_cfg([f"ckpt_path={ckpt}", "decode=greedy"], tmp_path / "split"))
    text = tmp_path / "input.txt"
    text.write_text("\n".join(lines(corpus / "test.en")[:5] + ["", "a dog"]) + "\n")
    out = evaluate(
        compose_eval_cfg([f"ckpt_path={ckpt}", "decode=greedy", f"input={text}"], tmp_path)
    )
    translations = lines(tmp_path / "hypotheses.txt")
    assert translations[:5] == lines(tmp_path / "split" / "hypotheses.txt")[:5]
    assert translations[5] == "" and len(translations) == out["lines"] == 7


@pytest.mark.slow
def test_input_file_quirks_translate_as_their_clean_lines(trained, tmp_path, caplog) -> None:
    """One translation per input line whatever the file's quirks: a UTF-8 byte-order mark is
    dropped, CRLF line ends are line ends, a U+2028 inside a sentence does not split it, blank
    lines give "", and a line too long for the model is cut with a warning naming its line."""
    ckpt, corpus = trained
    clean = ["a dog runs", "the man sits\u2028in the park", "", "the cat", "a " * 300]
    plain, quirky = tmp_path / "plain.txt", tmp_path / "quirky.txt"
    plain.write_text("\n".join(clean) + "\n", encoding="utf-8")
    quirky.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(clean).encode("utf-8"))  # no final newline
    greedy = [f"ckpt_path={ckpt}", "decode=greedy"]
    with caplog.at_level(logging.WARNING, logger="transformer.data.collate"):
        evaluate(compose_eval_cfg([*greedy, f"input={quirky}"], tmp_path / "quirky"))
    assert "1 input line(s) have more than 256 pieces" in caplog.text
    assert "(first: line 5)" in caplog.text
    evaluate(compose_eval_cfg([*greedy, f"input={plain}"], tmp_path / "plain"))
    got = lines(tmp_path / "quirky" / "hypotheses.txt")
    assert len(got) == len(clean) and got[2] == ""
    assert got == lines(tmp_path / "plain" / "hypotheses.txt")
    utf16 = tmp_path / "utf16.txt"
    utf16.write_bytes("a dog runs\n".encode("utf-16"))
    with pytest.raises(DataError, match=r"utf16.txt, line 1: a UTF-16 or UTF-32 byte-order mark"):
        evaluate(compose_eval_cfg([*greedy, f"input={utf16}"], tmp_path / "utf16"))


@pytest.mark.slow
def test_averaging_compares_tokenizer_models_not_their_file_names(trained, tmp_path) -> None:
    """A run resumed elsewhere stores the same SentencePiece models under its own cache's file
    names, and a run that trained them again in another process holds them with another record
    of where SentencePiece wrote them: their checkpoints average and ensemble with the earlier
    ones. Other models are refused."""
    ckpt, _ = trained
    renamed = load_checkpoint(ckpt)
    for side in ("src", "tgt"):
        renamed["tokenizers"][side]["name"] = f"elsewhere.{side}.model"
        renamed["tokenizers"][side]["model"] = trained_elsewhere(
            renamed["tokenizers"][side]["model"]
        )
    torch.save(renamed, tmp_path / "renamed.ckpt")
    average_main([str(tmp_path / "avg.ckpt"), str(ckpt), str(tmp_path / "renamed.ckpt")])
    assert len(load_ensemble([ckpt, tmp_path / "renamed.ckpt"])) == 2
    other = load_checkpoint(ckpt)
    other["tokenizers"]["tgt"]["model"] = other_tokenizer(other["tokenizers"]["tgt"]["model"])
    torch.save(other, tmp_path / "other.ckpt")
    with pytest.raises(CheckpointError, match="trained with other tokenizers"):
        average_checkpoints([ckpt, tmp_path / "other.ckpt"])
    with pytest.raises(CheckpointError, match="trained with other tokenizers"):
        load_ensemble([ckpt, tmp_path / "other.ckpt"])


@pytest.mark.slow
def test_averaged_checkpoint(trained, tmp_path) -> None:
    ckpt, _ = trained
    tripled = load_checkpoint(ckpt)
    tripled["state_dict"] = {k: v * 3 for k, v in tripled["state_dict"].items()}
    torch.save(tripled, tmp_path / "tripled.ckpt")
    average_main([str(tmp_path / "avg.ckpt"), str(ckpt), str(tmp_path / "tripled.ckpt")])
    averaged, original = load_checkpoint(tmp_path / "avg.ckpt"), load_checkpoint(ckpt)
    for key, value in original["state_dict"].items():
        torch.testing.assert_close(averaged["state_dict"][key], value * 2)
    assert "optimizer_states" not in averaged
    # The same average, made on the fly, evaluates to the same translations.
    evaluate(
        compose_eval_cfg([f"ckpt_path={tmp_path / 'avg.ckpt'}", "decode=greedy"], tmp_path / "a")
    )
    both = f"ckpt_path=[{ckpt},{tmp_path / 'tripled.ckpt'}]"
    evaluate(compose_eval_cfg([both, "decode=greedy"], tmp_path / "b"))
    assert lines(tmp_path / "a" / "hypotheses.txt") == lines(tmp_path / "b" / "hypotheses.txt")
    # A glob pattern names the same set (epoch checkpoints: ckpt_path='OUT/checkpoints/epochs/*').
    pair = tmp_path / "pair"
    pair.mkdir()
    shutil.copy(ckpt, pair / "a.ckpt")
    shutil.copy(tmp_path / "tripled.ckpt", pair / "b.ckpt")
    out = evaluate(
        compose_eval_cfg([f"ckpt_path='{pair}/*.ckpt'", "decode=greedy"], tmp_path / "c")
    )
    assert out["checkpoints"] == [str(pair / "a.ckpt"), str(pair / "b.ckpt")]
    assert lines(tmp_path / "c" / "hypotheses.txt") == lines(tmp_path / "a" / "hypotheses.txt")


@pytest.mark.slow
def test_bfloat16_weights_when_asked_float32_on_cpu_by_default(trained, tmp_path) -> None:
    ckpt, corpus = trained
    run = [f"ckpt_path={ckpt}", "split=test", "decode.beam_size=3", "device=cpu"]
    metrics = evaluate(compose_eval_cfg([*run, "dtype=bfloat16"], tmp_path))
    assert metrics["dtype"] == "bfloat16"
    assert metrics["backend"].startswith("decoding on cpu in bfloat16: oneDNN linear layers")
    assert len(lines(tmp_path / "hypotheses.txt")) == len(lines(corpus / "test.de"))
    assert evaluate(compose_eval_cfg(run, tmp_path / "auto"))["dtype"] == "float32"  # dtype=auto


def test_dtype_is_checked_before_any_work(tmp_path) -> None:
    missing = f"ckpt_path={tmp_path / 'none.ckpt'}"  # the option is refused first
    with pytest.raises(ValueError, match="dtype=float16 is for GPUs.*use dtype=bfloat16"):
        evaluate(compose_eval_cfg([missing, "dtype=float16", "device=cpu"], tmp_path))
    choices = re.escape("dtype=half is not one of auto | float32 | bfloat16 | float16")
    with pytest.raises(ValueError, match=choices):
        evaluate(compose_eval_cfg([missing, "dtype=half"], tmp_path))
    with pytest.raises(ValueError, match=r"decode\.graphs=true: CUDA graphs need a GPU"):
        evaluate(compose_eval_cfg([missing, "decode.graphs=true", "device=cpu"], tmp_path))


def test_glob_matching_nothing_is_refused(tmp_path) -> None:
    with pytest.raises(CheckpointError, match=r"ckpt_path=.*nothing/\*.ckpt matches no file"):
        evaluate(compose_eval_cfg([f"ckpt_path='{tmp_path}/nothing/*.ckpt'"], tmp_path / "out"))

    # A run shorter than one epoch: checkpoints/epochs/ is empty, checkpoints/last.ckpt exists.
    (tmp_path / "checkpoints" / "epochs").mkdir(parents=True)
    (tmp_path / "checkpoints" / "last.ckpt").touch()
    pattern = f"{tmp_path}/checkpoints/epochs/*.ckpt"
    last = tmp_path / "checkpoints" / "last.ckpt"
    with pytest.raises(CheckpointError) as err:
        evaluate(compose_eval_cfg([f"ckpt_path='{pattern}'"], tmp_path / "out"))
    assert str(err.value).startswith(f"ckpt_path={pattern} matches no file; {last} exists")
    assert str(err.value).endswith(f"evaluate it with ckpt_path={last}")


@pytest.mark.slow
def test_tokenizer_of_another_vocabulary_is_refused(trained, tmp_path) -> None:
    ckpt, _ = trained
    other = load_checkpoint(ckpt)
    other["hyper_parameters"]["model"]["tgt_vocab_size"] = 80
    torch.save(other, tmp_path / "other.ckpt")
    (tmp_path / "metrics.json").write_text("{}")  # an earlier run's: must not pass for this one's
    with pytest.raises(CheckpointError, match="has 64 pieces but the model's tgt_vocab_size is 80"):
        evaluate(compose_eval_cfg([f"ckpt_path={tmp_path / 'other.ckpt'}"], tmp_path))
    assert not (tmp_path / "metrics.json").exists()


@pytest.mark.slow
def test_checkpoint_without_tokenizer_models_is_refused(trained, tmp_path) -> None:
    ckpt, _ = trained
    stripped = load_checkpoint(ckpt)
    del stripped["tokenizers"]
    torch.save(stripped, tmp_path / "stripped.ckpt")
    with pytest.raises(CheckpointError, match="stripped.ckpt carries no tokenizer models"):
        evaluate(compose_eval_cfg([f"ckpt_path={tmp_path / 'stripped.ckpt'}"], tmp_path / "out"))
    assert not list((tmp_path / "out").iterdir())  # no hypotheses.txt, no metrics.json


@pytest.mark.slow
def test_truncated_or_missing_checkpoint_is_named(trained, tmp_path) -> None:
    ckpt, _ = trained
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(ckpt.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match=f"checkpoint {truncated} cannot be read"):
        evaluate(compose_eval_cfg([f"ckpt_path={truncated}"], tmp_path))
    with pytest.raises(CheckpointError, match="does not exist"):
        evaluate(compose_eval_cfg([f"ckpt_path={tmp_path / 'nothing.ckpt'}"], tmp_path))


@pytest.mark.slow
def test_evaluate_py_prints_scores_and_reads_stdin(trained, tmp_path) -> None:
    ckpt, corpus = trained
    run = [sys.executable, "evaluate.py", f"ckpt_path={ckpt}", "decode.beam_size=2"]
    done = subprocess.run(
        [*run, f"hydra.run.dir={tmp_path / 'score'}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "BLEU = " in done.stdout and "chrF = " in done.stdout and "nrefs:1" in done.stdout
    assert (
        "\nchrF++ = " in done.stdout and "\nTER = " in done.stdout and "tok:tercom" in done.stdout
    )
    assert "sentences/s" in done.stdout
    assert (tmp_path / "score" / "metrics.json").is_file()
    piped = subprocess.run(
        [*run, "input=-", "decode.nbest=2", "decode.print_scores=true",
         f"hydra.run.dir={tmp_path / 'stdin'}"],
        cwd=REPO, input="a dog runs\nthe man\n", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    scored = [line.split("\t") for line in piped.stdout.splitlines()]
    assert len(scored) == 4  # 2 lines x 2-best, "score<TAB>text" each
    assert all(len(fields) == 2 and float(fields[0]) < 0 for fields in scored)
    assert piped.stdout == (tmp_path / "stdin" / "hypotheses.txt").read_text()
    missing = subprocess.run(
        [sys.executable, "evaluate.py", f"ckpt_path={tmp_path / 'none.ckpt'}",
         f"hydra.run.dir={tmp_path / 'missing'}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert missing.returncode != 0
    assert "error: checkpoint" in missing.stderr and "Traceback" not in missing.stderr


@pytest.mark.slow
def test_evaluate_py_prints_each_translation_of_standard_input_as_its_line_arrives(
    trained, tmp_path
) -> None:
    """input=- with the writer holding the pipe open: a line's translation is on stdout (and
    nothing else is) before the next line is written; the run's file holds them all. A reader
    that stops reading (| head) ends the run quietly."""
    ckpt, corpus = trained
    sources = lines(corpus / "test.en")[:3]
    text = tmp_path / "three.en"
    text.write_text("".join(s + "\n" for s in sources))
    run = [f"ckpt_path={ckpt}", "decode=greedy"]
    evaluate(compose_eval_cfg([*run, f"input={text}"], tmp_path / "file"))
    expected = lines(tmp_path / "file" / "hypotheses.txt")
    with open(tmp_path / "stderr.txt", "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "evaluate.py", *run, "input=-", f"hydra.run.dir={tmp_path / 'pipe'}"],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
        )  # fmt: skip
        pool = ThreadPoolExecutor(1)
        try:
            for source, translation in zip(sources[:2], expected, strict=False):
                process.stdin.write(source.encode() + b"\n")
                process.stdin.flush()
                line = pool.submit(process.stdout.readline).result(timeout=120)
                assert line.decode() == translation + "\n"
            process.stdout.close()  # the reader goes: the next translation has nowhere to go
            process.stdin.write(sources[2].encode() + b"\n")
            process.stdin.close()
            assert process.wait(timeout=60) == 1
        finally:
            process.kill()  # first: a readline still waiting for a line then ends
            pool.shutdown()
    assert (tmp_path / "stderr.txt").read_text().count("Traceback") == 0
    assert lines(tmp_path / "pipe" / "hypotheses.txt") == expected  # the third's chunk too


# evaluate.py with transformer.evaluation.run.evaluate replaced by one that raises the given
# exception.
RAISING_EVALUATE = """
import runpy, sys
import transformer.evaluation.run
from transformer.errors import ConfigError

def evaluate(cfg, stdout=None):
    raise {}

transformer.evaluation.run.evaluate = evaluate
sys.argv = ["evaluate.py", *sys.argv[1:]]
runpy.run_path("evaluate.py", run_name="__main__")
"""


@pytest.mark.slow
def test_evaluate_py_prints_a_user_error_in_one_line_and_a_bug_with_its_traceback(tmp_path):
    def run(exception: str) -> subprocess.CompletedProcess:
        script = RAISING_EVALUATE.format(exception)
        args = ["ckpt_path=x.ckpt", f"hydra.run.dir={tmp_path}"]
        return subprocess.run([sys.executable, "-c", script, *args],
                              cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip

    user = run('ConfigError("dtype=half is not one of float32 | bfloat16 | float16")')
    assert user.returncode == 1
    assert user.stderr.strip() == "error: dtype=half is not one of float32 | bfloat16 | float16"
    bug = run('ValueError("a bug")')  # a ValueError from torch, say: not the user's to fix
    assert bug.returncode != 0
    assert "Traceback" in bug.stderr and "ValueError: a bug" in bug.stderr
    assert "error: a bug" not in bug.stderr


@pytest.mark.slow
def test_user_mistakes_on_the_evaluation_path_are_user_errors(trained, tmp_path) -> None:
    """What evaluate.py printed as one line while it caught every ValueError still does."""
    ckpt, _ = trained
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("groß\n".encode("latin-1"))
    cases = [
        (["input=none.txt"], ConfigError, "input=none.txt: no such file"),
        ([f"input={latin1}"], DataError, "latin1.txt, line 1: bytes that are not UTF-8"),
        (["decode.beam_size=0"], ConfigError, "decode.beam_size must be >= 1"),
        (["+data.max_len=0"], ConfigError, r"invalid data option \(data\.\*\): max_len must be"),
        (["analysis=maps", "analysis_options.probes=two"], ConfigError,
         "analysis_options.probes='two' is not a whole number"),
    ]  # fmt: skip
    for overrides, error, message in cases:
        with pytest.raises(error, match=message):
            evaluate(compose_eval_cfg([f"ckpt_path={ckpt}", *overrides], tmp_path / "out"))
    edited = load_checkpoint(ckpt)
    edited["hyper_parameters"]["model"]["num_heads"] = 3  # does not divide d_model
    with pytest.raises(CheckpointError, match="edited.ckpt: its model config is invalid"):
        model_from_checkpoint(edited, "edited.ckpt")


@pytest.mark.slow
def test_bench_translate_times_the_checkpoint_and_hashes_its_output(trained, tmp_path) -> None:
    ckpt, corpus = trained
    script = REPO / "bench" / "bench_translate.py"
    run = [sys.executable, str(script), str(ckpt), "--source", str(corpus / "test.en")]
    done = subprocess.run(
        [*run, "--beam", "2", "--repeat", "1"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    row = done.stdout.splitlines()[-1].split(" | ")
    assert row[0] == f"| {REPO}" and float(row[1]) > 0 and float(row[2]) > 0
    assert len(row[3].rstrip(" |")) == 32  # one md5: the same translations every run
    halves = tmp_path / "halves.de"  # each reference's first half as its translation's start
    halves.write_text("".join(" ".join(x.split()[: len(x.split()) // 2]) + "\n"
                              for x in lines(corpus / "test.de")))  # fmt: skip
    forced = [*run, "--beam", "2", "--repeat", "1", "--prefixes", str(halves), "--max-tokens", "1"]
    done = subprocess.run(forced, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].split(" | ")[3].rstrip(" |") != row[3].rstrip(" |")
    halves.write_text("ein\n")
    done = subprocess.run(forced, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and f"--prefixes {halves}: 1 lines for" in done.stderr


def test_length_batches_fill_the_token_budget_longest_first() -> None:
    """evaluate.py's batches (bench_decode --max-tokens uses the same): sorted by length, each
    within max_tokens counting padding, a sentence longer than the budget alone."""
    lengths = {0: 3, 1: 10, 2: 5, 3: 10, 4: 30}
    assert length_batches(lengths, 20) == [[4], [1, 3], [2, 0]]
    assert length_batches(lengths, 1000) == [[4, 1, 3, 2, 0]]
    assert length_batches({}, 20) == []


# Files of any size: chunks, resume, nbest, scores, alignments; forced scoring; ensembles.


def source_file(corpus: Path, path: Path) -> Path:
    """The test split's sources with two blank lines among them: 34 lines."""
    sources = lines(corpus / "test.en")
    path.write_text("\n".join([*sources[:10], "", *sources[10:20], "", *sources[20:]]) + "\n")
    return path


@pytest.mark.parametrize(
    "decode",
    [
        ["decode=greedy"],
        ["decode.beam_size=3", "decode.nbest=2", "decode.print_scores=true"],
        ["decode=sample", "decode.nbest=3", "decode.top_k=5", "decode.seed=1"],
    ],
    ids=["greedy", "beam_nbest_scores", "sample_nbest"],
)
@pytest.mark.slow
def test_a_file_translated_in_chunks_and_resumed_after_a_kill_equals_one_run(
    trained, tmp_path, decode
) -> None:
    """A kill mid-write leaves whole chunks and part of one: the run resumed on that output
    writes the file one uninterrupted run writes, with any chunk size (sampling included: a
    line's draws follow its line number, not its batch)."""
    ckpt, corpus = trained
    source = source_file(corpus, tmp_path / "source.en")
    run = [f"ckpt_path={ckpt}", f"input={source}", *decode]
    whole = tmp_path / "whole.txt"
    out = evaluate(compose_eval_cfg([*run, f"output={whole}", "input_chunk=100"], tmp_path / "a"))
    per_line = 1 if decode == ["decode=greedy"] else int(decode[1].split("=")[1])
    assert out == {"output": str(whole), "lines": 34, "resumed_at": 0, "decode": out["decode"],
                   "checkpoints": [str(ckpt)]}  # fmt: skip
    expected = whole.read_bytes()
    assert len(lines(whole)) == 34 * per_line
    assert not (tmp_path / "a" / "hypotheses.txt").exists()  # output= took its place
    for chunk, cut in [(7, 3), (5, 7 * per_line + 1)]:
        killed = tmp_path / f"killed{chunk}.txt"
        kept = b"".join(expected.splitlines(keepends=True)[:cut])
        killed.write_bytes(kept + b"half a transl")  # a line cut short, no line end
        resumed = evaluate(
            compose_eval_cfg([*run, f"output={killed}", f"input_chunk={chunk}"], tmp_path)
        )
        assert resumed["resumed_at"] == cut // per_line and resumed["lines"] == 34
        assert killed.read_bytes() == expected
    again = evaluate(
        compose_eval_cfg([*run, f"output={whole}"], tmp_path / "b")
    )  # nothing left to do
    assert again["resumed_at"] == 34 and whole.read_bytes() == expected


@pytest.mark.slow
def test_an_output_of_another_input_and_misplaced_options_are_refused(trained, tmp_path):
    ckpt, corpus = trained
    source = source_file(corpus, tmp_path / "source.en")
    longer = tmp_path / "longer.txt"
    longer.write_text("x\n" * 40)
    run = [f"ckpt_path={ckpt}", "decode=greedy"]
    with pytest.raises(ConfigError, match=r"holds results for 40 lines but input=.* has 34"):
        evaluate(compose_eval_cfg([*run, f"input={source}", f"output={longer}"], tmp_path))
    cases = [
        (["output=x.txt"], "output=x.txt is where input=FILE's translations or score=true's"),
        ([f"input={source}", "input_chunk=0"], r"input_chunk must be an integer >= 1"),
        (["engine=ctranslate2", "ensemble=true"], "ensemble=true runs our decoder; use engine"),
        (["engine=ctranslate2", "decode=sample"], "decode.strategy=sample runs our decoder"),
        (["analysis=maps", "score=true"], "analysis=maps reads one model's attention"),
        (["score=maybe"], "score must be true or false"),
        (["scoring.len_penalty=x"], "scoring.len_penalty must be a number"),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigError, match=message):
            evaluate(compose_eval_cfg([*run, *overrides], tmp_path / "out"))
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("a dog\tein hund\na cat\n")
    with pytest.raises(DataError, match=r"pairs.tsv, line 2: 1 tab-separated fields; score=true"):
        evaluate(compose_eval_cfg([*run, "score=true", f"input={tsv}"], tmp_path / "out"))


@torch.no_grad()
def teacher_forced(ckpt: Path, source: str, target: str) -> list[float]:
    """One unbatched model call: the log-probability of each target piece and of eos."""
    loaded = load_checkpoint(ckpt)
    model = model_from_checkpoint(loaded).eval()
    src_tok, tgt_tok = tokenizers_from_checkpoint(loaded, ckpt)
    y = tgt_tok.encode(target)
    src = torch.tensor([[*src_tok.encode(source), EOS_ID]])
    lprobs = model(src, torch.tensor([[BOS_ID, *y]]))[0].log_softmax(-1)  # (len(y) + 1, V)
    return lprobs.gather(1, torch.tensor([[*y, EOS_ID]]).T).squeeze(1).tolist()


@pytest.mark.slow
def test_scores_of_the_split_or_a_tsv_are_teacher_forced_log_probabilities(trained, tmp_path):
    ckpt, corpus = trained
    sources, references = lines(corpus / "test.en"), lines(corpus / "test.de")
    run = [f"ckpt_path={ckpt}", "score=true", "scoring.per_token=true", "decode.max_tokens=64"]
    out = evaluate(compose_eval_cfg([*run, "scoring.len_penalty=1.0"], tmp_path / "split"))
    assert out["lines"] == 32 and out["output"] == str(tmp_path / "split" / "scores.txt")
    rows = [line.split("\t") for line in lines(tmp_path / "split" / "scores.txt")]
    for i in (0, 7, 31):
        tokens = [float(x) for x in rows[i][1].split()]
        exact = teacher_forced(ckpt, sources[i], references[i])
        assert tokens == pytest.approx(exact, abs=1e-3)
        assert float(rows[i][0]) == pytest.approx(sum(exact) / len(exact), abs=1e-3)  # per token
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{s}\t{r}\n" for s, r in zip(sources, references, strict=True)))
    summed = tmp_path / "summed.txt"
    evaluate(
        compose_eval_cfg([*run, f"input={tsv}", f"output={summed}", "input_chunk=5"], tmp_path)
    )
    for row, line in zip(rows, lines(summed), strict=True):
        total, tokens = line.split("\t")
        chunked = [float(x) for x in tokens.split()]
        # written to 4 decimals: chunks of 5 pad otherwise than the whole split, so float32 noise
        # can round a score the other way (one unit in the last place), and no more
        assert chunked == pytest.approx([float(x) for x in row[1].split()], abs=1.5e-4)
        assert float(total) == pytest.approx(sum(chunked), abs=1e-3)


@pytest.mark.slow
def test_an_ensemble_of_copies_translates_as_the_model_and_averaging_stays_the_default(
    trained, tmp_path
):
    ckpt, corpus = trained
    tripled = load_checkpoint(ckpt)
    tripled["state_dict"] = {k: v * 3 for k, v in tripled["state_dict"].items()}
    torch.save(tripled, tmp_path / "tripled.ckpt")
    one = evaluate(compose_eval_cfg([f"ckpt_path={ckpt}", "decode.beam_size=3"], tmp_path / "one"))
    both = f"ckpt_path=[{ckpt},{ckpt}]"
    copies = evaluate(
        compose_eval_cfg([both, "ensemble=true", "decode.beam_size=3"], tmp_path / "two")
    )
    assert lines(tmp_path / "two" / "hypotheses.txt") == lines(tmp_path / "one" / "hypotheses.txt")
    assert copies["ensemble"] and not one["ensemble"] and copies["bleu"] == one["bleu"]
    other = f"ckpt_path=[{ckpt},{tmp_path / 'tripled.ckpt'}]"
    evaluate(compose_eval_cfg([other, "ensemble=true", "decode=greedy"], tmp_path / "ensemble"))
    evaluate(compose_eval_cfg([other, "decode=greedy"], tmp_path / "average"))
    ensembled, averaged = (lines(tmp_path / d / "hypotheses.txt") for d in ("ensemble", "average"))
    assert ensembled != averaged  # the mean of probabilities, not of weights


@pytest.mark.slow
def test_alignments_pair_every_target_word_with_a_source_word(trained, tmp_path) -> None:
    ckpt, corpus = trained
    source = source_file(corpus, tmp_path / "source.en")
    run = [f"ckpt_path={ckpt}", f"input={source}", "decode=greedy", "decode.alignment=true"]
    evaluate(
        compose_eval_cfg([*run, "decode.alignment_head=1", "decode.print_scores=true"], tmp_path)
    )
    for src, line in zip(lines(source), lines(tmp_path / "hypotheses.txt"), strict=True):
        score, text, alignment = line.split("\t")
        if not src:
            assert (score, text, alignment) == ("", "", "")
            continue
        pairs = [tuple(map(int, pair.split("-"))) for pair in alignment.split()]
        assert [t for _, t in pairs] == list(range(len(text.split())))
        assert all(0 <= s < len(src.split()) for s, _ in pairs)
    with pytest.raises(ConfigError, match=r"decode\.alignment_layer=5, but the model has 2"):
        evaluate(compose_eval_cfg([*run, "decode.alignment_layer=5"], tmp_path / "bad"))


# prefixes=FILE: target prefixes beside input= or the split.


def prefix_file(corpus: Path, path: Path, n: int) -> Path:
    """``n`` prefixes: the first 1-2 words of a test reference on every third line, else none."""
    refs = lines(corpus / "test.de")
    given = [
        " ".join(refs[i % len(refs)].split()[: 1 + i % 2]) if i % 3 == 0 else "" for i in range(n)
    ]
    path.write_text("\n".join(given) + "\n")
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    "decode", [["decode=greedy"], ["decode.beam_size=3"]], ids=["greedy", "beam"]
)
def test_prefixes_file_starts_each_translation_read_in_chunks_and_resumed(
    trained, tmp_path, decode
):
    """prefixes=FILE is read in input='s chunks, line for line (blank sources stay blank), and
    resumed with it: each translation starts with its prefix, the others are as without."""
    ckpt, corpus = trained
    source = source_file(corpus, tmp_path / "source.en")
    prefixes = prefix_file(corpus, tmp_path / "prefixes.de", 34)
    run = [f"ckpt_path={ckpt}", f"input={source}", *decode]
    free, whole = tmp_path / "free.txt", tmp_path / "whole.txt"
    evaluate(compose_eval_cfg([*run, f"output={free}"], tmp_path / "a"))
    evaluate(compose_eval_cfg([*run, f"output={whole}", f"prefixes={prefixes}"], tmp_path / "b"))
    out, given = lines(whole), lines(prefixes)
    for translation, unconstrained, prefix, src in zip(
        out, lines(free), given, lines(source), strict=True
    ):
        if not src:
            assert translation == ""
        elif prefix:
            assert translation.startswith(prefix)
        else:
            assert translation == unconstrained
    assert sum(t != f for t, f in zip(out, lines(free), strict=True)) >= 5
    killed = tmp_path / "killed.txt"
    killed.write_text("\n".join(out[:9]) + "\nhalf a tr")
    evaluate(compose_eval_cfg(
        [*run, f"output={killed}", f"prefixes={prefixes}", "input_chunk=4"], tmp_path / "c"
    ))  # fmt: skip
    assert killed.read_text() == whole.read_text()


@pytest.mark.slow
def test_prefixes_file_of_a_split_is_scored_whole(trained, tmp_path) -> None:
    ckpt, corpus = trained
    n = len(lines(corpus / "test.en"))
    prefixes = prefix_file(corpus, tmp_path / "prefixes.de", n)
    run = [f"ckpt_path={ckpt}", "decode=greedy", f"prefixes={prefixes}"]
    metrics = evaluate(compose_eval_cfg(run, tmp_path / "split"))
    hypotheses = lines(tmp_path / "split" / "hypotheses.txt")
    assert all(h.startswith(p) for h, p in zip(hypotheses, lines(prefixes), strict=True))
    bleu = sacrebleu.corpus_bleu(hypotheses, [lines(corpus / "test.de")]).score
    assert metrics["bleu"] == pytest.approx(bleu) and metrics["prefixes"] == str(prefixes)
    short = prefix_file(corpus, tmp_path / "short.de", n - 1)
    with pytest.raises(DataError, match=rf"prefixes=.*short.de has {n - 1} lines but split=test "
                                        rf"has {n}: give one prefix a line"):  # fmt: skip
        evaluate(compose_eval_cfg([*run[:2], f"prefixes={short}"], tmp_path / "out"))


@pytest.mark.slow
def test_a_prefixes_file_of_another_length_or_mode_is_refused(trained, tmp_path, monkeypatch):
    """A line-count difference is an error naming both files and their counts, before any
    translation for a file, as the lines come for standard input; never a misalignment."""
    ckpt, corpus = trained
    source = source_file(corpus, tmp_path / "source.en")  # 34 lines
    run = [f"ckpt_path={ckpt}", "decode=greedy"]
    for n in (33, 35):
        prefixes = prefix_file(corpus, tmp_path / f"prefixes{n}.de", n)
        output = tmp_path / f"out{n}.txt"
        with pytest.raises(DataError, match=rf"prefixes=.*prefixes{n}.de has {n} lines but "
                                            rf"input=.*source.en has 34"):  # fmt: skip
            evaluate(compose_eval_cfg(
                [*run, f"input={source}", f"prefixes={prefixes}", f"output={output}",
                 "input_chunk=4"], tmp_path / "out",
            ))  # fmt: skip
        assert not output.exists()  # nothing translated
    for n, seen in ((33, "34 or more"), (35, "34")):
        data = source.read_bytes()
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(data))))
        prefixes = tmp_path / f"prefixes{n}.de"
        with pytest.raises(DataError, match=rf"has {n} lines but input=- has {seen}"):
            evaluate(compose_eval_cfg(
                [*run, "input=-", f"prefixes={prefixes}", "input_chunk=5"], tmp_path / "stdin"
            ))  # fmt: skip
    for overrides, message in [
        (["prefixes=none.txt"], "prefixes=none.txt: no such file"),
        ([f"prefixes={source}", "score=true"], "guides translations; score=true makes none"),
        ([f"prefixes={source}", "analysis=maps"], "analysis=maps makes none"),
    ]:
        with pytest.raises(ConfigError, match=message):
            evaluate(compose_eval_cfg([*run, *overrides], tmp_path / "out"))
