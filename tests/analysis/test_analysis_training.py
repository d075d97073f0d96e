"""The attention-maps callback in tiny trainings (csv logger, wandb offline) and
``evaluate.py analysis=heads|maps`` on the checkpoint."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from lightning.pytorch.loggers import WandbLogger
from matplotlib.backends.backend_agg import FigureCanvasAgg

import transformer.analysis.maps as maps_module
import transformer.attend as attend
from tests.tiny import ATTENTION_MAPS_OFF, compose_cfg, compose_eval_cfg, tiny_overrides
from transformer.analysis import explorer
from transformer.analysis.stats import STATS
from transformer.analysis.trends import TREND_COLUMNS
from transformer.evaluation import evaluate
from transformer.training import train

PNG = b"\x89PNG\r\n\x1a\n"
ANALYSIS = [  # one layer each side, two heads, one probe: few figures to draw
    "model.num_encoder_layers=1",
    "model.num_decoder_layers=1",
    "model.num_heads=2",
    "callbacks.attention_maps.num_probes=1",
    "callbacks.attention_maps.stats_sentences=8",
    "callbacks.attention_maps.num_samples=3",
]


def overrides_with_maps(corpus: Path) -> list[str]:
    return [o for o in tiny_overrides(corpus) if o != ATTENTION_MAPS_OFF]


DRAWN_HERE: list[str] = []  # figures the csv run drew in the training process


@pytest.fixture(scope="module")
def csv_run(corpus, tmp_path_factory) -> Path:
    """Validation at steps 3, 6 and 9, the analysis (of cross-attention) every second one:
    steps 3 and 9; the per-head scalars on."""
    out = tmp_path_factory.mktemp("run")
    overrides = [
        *overrides_with_maps(corpus), *ANALYSIS, "trainer.max_steps=9",
        "trainer.val_check_interval=3", "callbacks.attention_maps.every_n_validations=2",
        "callbacks.attention_maps.types=[cross]", "callbacks.attention_maps.head_scalars=true",
    ]  # fmt: skip
    draw = FigureCanvasAgg.draw

    def tracked_draw(canvas, *args, **kwargs):
        DRAWN_HERE.append(repr(canvas.figure))
        return draw(canvas, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FigureCanvasAgg, "draw", tracked_draw)
        train(compose_cfg(overrides, out))
    return out


@pytest.mark.slow
def test_callback_writes_maps_stats_and_samples_at_its_cadence(csv_run) -> None:
    root = csv_run / "attention"
    assert sorted(p.name for p in root.iterdir()) == ["explorer.html", "step0000003", "step0000009"]
    step = root / "step0000009"
    assert (step / "explorer.json").is_file()
    pngs = sorted(str(p.relative_to(step)) for p in step.rglob("*.png"))
    maps = [f"cross/layer0/probe0_{target}.png" for target in ("hypothesis", "reference")]
    assert pngs == sorted([*maps, "stats_cross.png"])
    for png in step.rglob("*.png"):
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 5000
    written = json.loads((step / "stats.json").read_text())
    assert len(written["cross"]["entropy"]) == 1 and len(written["cross"]["entropy"][0]) == 2
    samples = json.loads((step / "samples.json").read_text())
    assert len(samples) == 3 and set(samples[0]) == {
        "source", "reference", "hypothesis", "sentence_bleu"
    }  # fmt: skip


@pytest.mark.slow
def test_figures_are_drawn_outside_the_training_process(csv_run) -> None:
    """The training thread only captures the data; the PNGs of both map validations (checked
    above) come from the worker process, done by the end of fit."""
    assert DRAWN_HERE == []


@pytest.mark.slow
def test_explorer_page_holds_every_map_validation(csv_run) -> None:
    root = csv_run / "attention"
    assert [r["step"] for r in explorer.load_records(root)] == [3, 9]
    page = (root / "explorer.html").read_text()
    assert '"step":9' in page and explorer.PLACEHOLDER not in page
    (entry, *_) = explorer.load_records(root)[1]["maps"]
    assert entry["type"] == "cross" and entry["shape"][:2] == [1, 2]


@pytest.mark.slow
def test_csv_logger_gets_the_head_statistics_as_scalars_when_asked(csv_run) -> None:
    (path,) = csv_run.glob("csv/version_*/metrics.csv")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    logged = [r for r in rows if r.get("attn_stats/cross/entropy/l0h1")]
    assert [int(r["step"]) for r in logged] == [3, 9]


@pytest.mark.slow
def test_wandb_offline_run_gets_images_tables_trends_and_the_explorer(
    corpus, tmp_path, monkeypatch, caplog
) -> None:
    # The explicit attention path runs only inside the callback's capture, never in training
    # or validation steps.
    inside_capture, explicit_calls = [False], []
    capture, explicit = maps_module.capture, attend.explicit_attention

    def tracked_capture(*args, **kwargs):
        inside_capture[0] = True
        try:
            return capture(*args, **kwargs)
        finally:
            inside_capture[0] = False

    def tracked_explicit(*args, **kwargs):
        explicit_calls.append(inside_capture[0])
        return explicit(*args, **kwargs)

    monkeypatch.setattr(maps_module, "capture", tracked_capture)
    monkeypatch.setattr(attend, "explicit_attention", tracked_explicit)
    logged: list[str] = []
    log_metrics = WandbLogger.log_metrics

    def tracked_log_metrics(self, metrics, step=None):
        logged.extend(metrics)
        return log_metrics(self, metrics, step)

    monkeypatch.setattr(WandbLogger, "log_metrics", tracked_log_metrics)
    overrides = [
        *overrides_with_maps(corpus), *ANALYSIS, "logger=wandb", "trainer.max_steps=3",
        "trainer.val_check_interval=3",
    ]  # fmt: skip
    train(compose_cfg(overrides, tmp_path))
    (run,) = tmp_path.glob("wandb/offline-run-*")
    images = {
        (p.parent.name, p.name.split("_")[0]) for p in run.glob("files/media/images/attn/*/*")
    }
    kinds = ("encoder_self", "decoder_self", "cross")
    assert images == {(kind, "layer0") for kind in kinds}
    assert list(run.glob("files/media/images/attn_stats/*.png"))
    assert list(run.glob("files/media/table/samples_*.table.json"))
    (table,) = run.glob("files/media/table/attn_stats/table_*.table.json")
    trends = json.loads(table.read_text())
    assert trends["columns"] == TREND_COLUMNS
    assert len(trends["data"]) == 3 * len(STATS) * 1 * 2  # types x statistics x layers x heads
    assert {(row[1], row[4]) for row in trends["data"]} == {(k, s) for k in kinds for s in STATS}
    assert {f"attn_trends/{k}/{s}" for k in kinds for s in STATS} <= set(logged)
    assert not [key for key in logged if re.search(r"/l\d+h\d+$", key)]  # head_scalars is off
    (html,) = run.glob("files/media/html/attn/explorer_*.html")
    assert html.read_text() == (tmp_path / "attention" / "explorer.html").read_text()
    assert (tmp_path / "attention" / "step0000003" / "cross" / "layer0").is_dir()
    assert explicit_calls and all(explicit_calls)
    assert not [r for r in caplog.records if "sizes do not match" in r.getMessage()]  # wandb's


@pytest.mark.slow
def test_a_failed_drawing_is_reported_and_training_goes_on(corpus, tmp_path, caplog) -> None:
    """The worker cannot write the explorer page (a directory stands in its way): the error is
    logged with its step, the run finishes, and the step's data and head grids are there."""
    (tmp_path / "attention" / "explorer.html").mkdir(parents=True)
    overrides = [
        *overrides_with_maps(corpus), *ANALYSIS, "trainer.max_steps=3",
        "trainer.val_check_interval=3", "callbacks.attention_maps.types=[cross]",
    ]  # fmt: skip
    with caplog.at_level("ERROR", logger="transformer.analysis.callback"):
        train(compose_cfg(overrides, tmp_path))
    (error,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert error.startswith("attention figures of step 3 failed in the worker process: IsADir")
    step = tmp_path / "attention" / "step0000003"
    assert (step / "explorer.json").is_file() and (step / "cross" / "layer0").is_dir()
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_evaluate_analysis_heads_and_maps(csv_run, tmp_path) -> None:
    ckpt = csv_run / "checkpoints" / "last.ckpt"
    common = [f"ckpt_path={ckpt}", "split=val", "analysis_options.sentences=4"]
    heads = [*common, "analysis=heads", "analysis_options.prune_step=0.5"]
    result = evaluate(compose_eval_cfg(heads, tmp_path / "heads"))
    assert len(result["heads"]) == 3 * 1 * 2  # types x layers x heads
    assert result["importance"] == "both" and all(h["gradient"] > 0 for h in result["heads"])
    assert [p["heads_left"] for p in result["pruning"]] == [6, 3, 1]
    written = json.loads((tmp_path / "heads" / "heads.json").read_text())
    assert written["baseline"] == result["baseline"]
    for name in ("heads_importance.png", "heads_pruning.png"):
        assert (tmp_path / "heads" / name).read_bytes()[:8] == PNG
    evaluate(
        compose_eval_cfg([*common, "analysis=maps", "analysis_options.probes=1"], tmp_path / "maps")
    )
    maps = tmp_path / "maps" / "attention"
    assert (maps / "cross" / "layer0" / "probe0_reference.png").is_file()
    assert (maps / "stats_encoder_self.png").is_file() and (maps / "samples.md").is_file()
    with pytest.raises(ValueError, match="analysis=head: choose one of heads, maps, or null"):
        evaluate(compose_eval_cfg([*common, "analysis=head"], tmp_path / "bad"))
    with pytest.raises(ValueError, match="importance=grad: choose one of mask, gradient, both"):
        evaluate(compose_eval_cfg([*common, "analysis=heads", "analysis_options.importance=grad"],
                          tmp_path / "bad"))  # fmt: skip
