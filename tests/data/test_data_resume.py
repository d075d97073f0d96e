"""An interrupted Lightning run resumed from a mid-epoch checkpoint sees exactly the batches of an
uninterrupted one (with subword sampling, the same segmentations too)."""

from __future__ import annotations

import warnings

import lightning as L
import pytest
import torch

from transformer.data.datamodule import TranslationDataModule


class RecordBatches(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[tuple[int, tuple[int, ...], list, list]] = []

    def training_step(self, batch, batch_idx):
        tokens = batch.src.tolist(), batch.labels.tolist()
        self.seen.append((self.current_epoch, tuple(batch.ids.tolist()), *tokens))
        return (self.w * batch.src.float().mean()).sum()

    def validation_step(self, batch, batch_idx):
        return None

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def segmentations(seen: list[tuple]) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each pair's source and labels in the batches ``seen``, without padding (id 0)."""
    rows = [zip(ids, src, labels, strict=True) for _, ids, src, labels in seen]
    return {i: (tuple(filter(None, s)), tuple(filter(None, t))) for r in rows for i, s, t in r}


def fit(dm_kwargs, root_dir, ckpt_path=None, **trainer_kwargs) -> RecordBatches:
    model = RecordBatches()
    trainer_kwargs = {"limit_val_batches": 0, **trainer_kwargs}
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=2, logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=root_dir, **trainer_kwargs,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and logging
        trainer.fit(model, datamodule=TranslationDataModule(**dm_kwargs), ckpt_path=ckpt_path)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [None, {"alpha": 0.1}], ids=["cached", "spm_sampling"])
def test_mid_epoch_resume_is_exact(corpus_dir, dm_kwargs, tmp_path, sampling):
    dm_kwargs = dict(dm_kwargs, source="local", root=str(corpus_dir), spm_sampling=sampling)
    full = fit(dm_kwargs, tmp_path)
    per_epoch = sum(1 for seen in full.seen if seen[0] == 0)
    assert len(full.seen) == 2 * per_epoch  # Lightning starts the second epoch afresh
    assert full.seen[0][1] != full.seen[per_epoch][1]  # reshuffled
    if sampling:  # pairs segmented anew in the second epoch
        first, second = segmentations(full.seen[:per_epoch]), segmentations(full.seen[per_epoch:])
        assert sum(first[i] != second[i] for i in first) > 30

    stop = per_epoch + 5  # a checkpoint in the middle of the second epoch
    ckpt = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=stop, save_top_k=-1
    )
    interrupted = fit(dm_kwargs, tmp_path, max_steps=stop + 3, callbacks=[ckpt])
    (path,) = (tmp_path / "ckpt").glob("*.ckpt")
    state = torch.load(path, weights_only=False)["TranslationDataModule"]
    assert state == {"train_sampler": {"epoch": 1, "position": 5, "seed": 7}}

    resumed = fit(dm_kwargs, tmp_path, ckpt_path=path)
    assert interrupted.seen[:stop] + resumed.seen == full.seen


class SaveAfterValidation(L.Callback):
    def __init__(self, step: int, path) -> None:
        self.step, self.path = step, path

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


@pytest.mark.slow
def test_resume_from_a_checkpoint_saved_after_mid_epoch_validation(corpus_dir, dm_kwargs, tmp_path):
    # with workers, the sampler runs ahead of training by the batches they have prefetched
    dm_kwargs = dict(dm_kwargs, source="local", root=str(corpus_dir), num_workers=2)
    val = {"limit_val_batches": 1, "val_check_interval": 5}
    full = fit(dm_kwargs, tmp_path, **val)
    path = tmp_path / "after-val.ckpt"
    interrupted = fit(
        dm_kwargs, tmp_path, max_steps=12, callbacks=[SaveAfterValidation(10, path)], **val
    )
    state = torch.load(path, weights_only=False)["TranslationDataModule"]
    assert state["train_sampler"]["position"] == 10
    resumed = fit(dm_kwargs, tmp_path, ckpt_path=path, **val)
    assert interrupted.seen[:10] + resumed.seen == full.seen
