"""Fine-tuning (``init_from=``): a model trained on one corpus starts a run on another with its
weights and tokenizers and a fresh optimizer and schedule, learns it faster than from scratch,
resumes exactly, keeps frozen parts fixed; what does not fit is refused by name. Early stopping
stops a run on a plateau."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.tiny import compose_cfg, logged, read_metrics, tiny_overrides
from transformer.checkpoints import load_checkpoint, tokenizer_digests
from transformer.data.synthetic import sentence_pairs, write_corpus
from transformer.errors import CheckpointError, ConfigError
from transformer.training import train

VALIDATE = ["trainer.val_check_interval=5", "trainer.check_val_every_n_epoch=null"]


@pytest.fixture(scope="module")
def pretrained(corpus, tmp_path_factory) -> Path:
    """A tiny model trained 60 steps on corpus A (the conftest's): its run directory."""
    run = tmp_path_factory.mktemp("a")
    train(compose_cfg([*tiny_overrides(corpus), "trainer.max_steps=60"], run))
    return run


@pytest.fixture(scope="module")
def corpus_b(tmp_path_factory) -> Path:
    """Other sentences of the same made-up language pair: a new domain of it."""
    pairs = lambda n, seed: sentence_pairs(n, seed + 100, max_words=6)  # noqa: E731
    return write_corpus(tmp_path_factory.mktemp("b"), pairs=pairs)


def on_b(corpus_b: Path, steps: int) -> list[str]:
    return [*tiny_overrides(corpus_b), f"trainer.max_steps={steps}", *VALIDATE]


@pytest.mark.slow
def test_a_fine_tuned_model_learns_the_new_corpus_faster_with_its_tokenizers(
    pretrained, corpus_b, tmp_path
):
    """On corpus B, 10 steps from A's weights reach a lower validation loss than 10 steps from
    scratch (at every validation); the run keeps A's tokenizers (B never trains its own), and
    its schedule starts afresh (the learning rate warms up again)."""
    last = pretrained / "checkpoints" / "last.ckpt"
    tuned, scratch = tmp_path / "tuned", tmp_path / "scratch"
    train(compose_cfg([*on_b(corpus_b, 10), f"init_from={last}"], tuned))
    train(compose_cfg(on_b(corpus_b, 10), scratch))
    assert all(
        t < s for t, s in zip(*(logged(r, "val/loss") for r in (tuned, scratch)), strict=True)
    )
    assert logged(tuned, "val/loss")[-1] < logged(scratch, "val/loss")[-1] - 0.3
    a, b = (load_checkpoint(r / "checkpoints" / "last.ckpt") for r in (pretrained, tuned))
    assert tokenizer_digests(b, "b") == tokenizer_digests(a, "a")
    assert load_checkpoint(tuned / "checkpoints" / "last.ckpt")["global_step"] == 10
    assert logged(tuned, "lr")[0] < logged(tuned, "lr")[-1]  # warmup from the start


@pytest.mark.slow
def test_weights_only_and_averaged_checkpoints_start_a_run(pretrained, corpus_b, tmp_path):
    """An epoch checkpoint (weights only: no optimizer state to resume) and a glob of them
    (averaged) start a fine-tuning run as last.ckpt does."""
    epochs = sorted((pretrained / "checkpoints" / "epochs").glob("*.ckpt"))
    assert epochs and "optimizer_states" not in load_checkpoint(epochs[0])
    for name, given in (("one", epochs[0]), ("average", f"'{epochs[0].parent}/*.ckpt'")):
        metrics = train(compose_cfg([*on_b(corpus_b, 3), f"init_from={given}"], tmp_path / name))
        assert torch.isfinite(torch.tensor(metrics["train/loss"]))


@pytest.mark.slow
def test_a_fine_tuning_run_resumes_exactly(pretrained, corpus_b, tmp_path):
    """10 fine-tuning steps in one run == 5 steps, then ckpt_path= to 10 (init_from still on the
    command line: the resume reads the run's own checkpoint, not init_from)."""
    start = [f"init_from={pretrained / 'checkpoints' / 'last.ckpt'}", "model.dropout=0.1"]
    full, part, resumed = tmp_path / "full", tmp_path / "part", tmp_path / "resumed"
    train(compose_cfg([*on_b(corpus_b, 10), *start], full))
    train(compose_cfg([*on_b(corpus_b, 5), *start], part))
    ckpt = part / "checkpoints" / "last.ckpt"
    train(compose_cfg([*on_b(corpus_b, 10), *start, f"ckpt_path={ckpt}"], resumed))
    want = [float(r["train/loss"]) for r in read_metrics(full) if r.get("train/loss")]
    rows = read_metrics(part) + read_metrics(resumed)
    assert [float(r["train/loss"]) for r in rows if r.get("train/loss")] == pytest.approx(
        want, abs=1e-6
    )


@pytest.mark.slow
def test_frozen_parts_stay_as_the_checkpoint_has_them(pretrained, corpus_b, tmp_path):
    last = pretrained / "checkpoints" / "last.ckpt"
    freeze = ["freeze=[embeddings,encoder]", "model.dropout=0.0"]
    train(compose_cfg([*on_b(corpus_b, 5), f"init_from={last}", *freeze], tmp_path))
    before = load_checkpoint(last)["state_dict"]
    after = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["state_dict"]
    for name, value in after.items():
        frozen = name.startswith(("model.encoder.", "model.src_embed.", "model.tgt_embed."))
        frozen |= name == "model.output.weight"  # tied to the target embedding
        assert torch.equal(value, before[name]) == frozen, name


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.d_model=32", "model.d_ff=64"],
         r"^init_from=\S+ holds a model with model\.d_model=64 model\.d_ff=128, but this run's has "
         r"model\.d_model=32 model\.d_ff=64; start from it with model\.d_model=64 model\.d_ff=128, "
         r"or train from scratch \(without init_from\)$"),
        (["data.vocab_size=80"], r"model\.src_vocab_size=\d+ model\.tgt_vocab_size=\d+, but this "
         r"run's has model\.src_vocab_size=80 model\.tgt_vocab_size=80; start from it with "
         r"data\.vocab_size=\d+, or train"),
    ],
)  # fmt: skip
@pytest.mark.slow
def test_a_model_that_does_not_fit_is_refused_naming_the_mismatch(
    pretrained, corpus_b, tmp_path, overrides, message
):
    last = pretrained / "checkpoints" / "last.ckpt"
    cfg = compose_cfg([*on_b(corpus_b, 3), f"init_from={last}", *overrides], tmp_path)
    with pytest.raises(ConfigError, match=message):
        train(cfg)


@pytest.mark.slow
def test_a_checkpoint_without_tokenizers_or_a_glob_without_matches_is_refused(
    pretrained, corpus_b, tmp_path
):
    ckpt = load_checkpoint(pretrained / "checkpoints" / "last.ckpt")
    del ckpt["tokenizers"]
    bare = tmp_path / "bare.ckpt"
    torch.save(ckpt, bare)
    with pytest.raises(CheckpointError, match=r"init_from=\S+bare\.ckpt carries no tokenizers"):
        train(compose_cfg([*on_b(corpus_b, 3), f"init_from={bare}"], tmp_path / "run"))
    with pytest.raises(CheckpointError, match=r"init_from=\S+nothing\*\.ckpt matches no file"):
        train(compose_cfg([*on_b(corpus_b, 3), f"init_from='{tmp_path}/nothing*.ckpt'"],
                          tmp_path / "run2"))  # fmt: skip


def test_freeze_names_only_parts_of_the_model(tmp_path):
    from transformer.training.config_checks import validate_config

    with pytest.raises(ConfigError, match=r"'encoders' is not a part of the model; choose from "
                       r"embeddings, encoder, decoder, output"):  # fmt: skip
        validate_config(compose_cfg(["freeze=[encoders]"], tmp_path))


@pytest.mark.slow
def test_early_stopping_stops_on_a_plateau(corpus, tmp_path):
    """callbacks/early_stopping=loss with patience 1 and a min_delta no step can reach: the run
    stops after its second validation, long before trainer.max_steps."""
    overrides = [*tiny_overrides(corpus), "trainer.max_steps=200", *VALIDATE,
                 "callbacks/early_stopping=loss", "callbacks.early_stopping.patience=1",
                 "callbacks.early_stopping.min_delta=100"]  # fmt: skip
    train(compose_cfg(overrides, tmp_path))
    assert len(logged(tmp_path, "val/loss")) == 2
    assert load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["global_step"] == 10
