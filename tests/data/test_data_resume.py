"""An interrupted Lightning run resumed from a mid-epoch checkpoint sees exactly the batches of an
uninterrupted one."""

from __future__ import annotations

import warnings

import lightning as L
import torch

from transformer.data.datamodule import TranslationDataModule


class RecordBatches(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[tuple[int, tuple[int, ...]]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append((self.current_epoch, tuple(batch.ids.tolist())))
        return (self.w * batch.src.float().mean()).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(dm_kwargs, root_dir, ckpt_path=None, **trainer_kwargs) -> RecordBatches:
    model = RecordBatches()
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=2, logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, default_root_dir=root_dir,
        **trainer_kwargs,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and logging
        trainer.fit(model, datamodule=TranslationDataModule(**dm_kwargs), ckpt_path=ckpt_path)
    return model


def test_mid_epoch_resume_is_exact(corpus_dir, dm_kwargs, tmp_path):
    dm_kwargs = dict(dm_kwargs, source="local", root=str(corpus_dir))
    full = fit(dm_kwargs, tmp_path)
    per_epoch = sum(1 for epoch, _ in full.seen if epoch == 0)
    assert len(full.seen) == 2 * per_epoch  # Lightning starts the second epoch afresh
    assert full.seen[0][1] != full.seen[per_epoch][1]  # reshuffled

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
