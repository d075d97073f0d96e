"""Attention capture per sentence, head statistics, figures and head importance (no training)."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import struct
import time

import pytest
import torch
import torch.nn.functional as F

from tests.tiny import tiny_model
from transformer.analysis import plots
from transformer.analysis.callback import AttentionMapsCallback
from transformer.analysis.figures import Drawing, Drawn, FigureWorker
from transformer.analysis.heads import (
    HeadEvaluator,
    gradient_importance,
    head_importance,
    prune_greedily,
)
from transformer.analysis.heads_report import write_report
from transformer.analysis.maps import SentenceMaps, capture, capture_probes, translate_probes
from transformer.analysis.ranks import average_ranks, spearman
from transformer.analysis.report import (
    MapFigure,
    draw_maps,
    map_figures,
    write_samples,
    write_stats,
)
from transformer.analysis.roles import ROLES, head_roles
from transformer.analysis.stats import head_stats
from transformer.data.tokenizer import BOS_ID, EOS_ID
from transformer.data.tokenizer_training import train_tokenizer
from transformer.decoding import DecodeOptions
from transformer.model import ATTENTION_TYPES
from transformer.translate import Translator

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tokenizers(corpus):
    texts = [*(corpus / "train.en").read_text().splitlines(), *(corpus / "train.de").read_text()
             .splitlines()]  # fmt: skip
    joint = train_tokenizer(texts, corpus / "joint.model", 64)
    return joint, joint


def sentences() -> tuple[list[list[int]], list[list[int]]]:
    srcs = [[5, 6, 7, 8, 9, EOS_ID], [10, 11, EOS_ID]]
    tgts = [[BOS_ID, 12, 13, 14], [BOS_ID, 15, 16, 17, 18, 19, 20]]
    return srcs, tgts


def test_maps_have_one_layer_and_head_per_module_and_rows_summing_to_one() -> None:
    srcs, tgts = sentences()
    maps = capture(tiny_model(64, num_decoder_layers=3, num_kv_heads=2), srcs, tgts)
    for sentence, src, tgt in zip(maps, srcs, tgts, strict=True):
        S, T = len(src), len(tgt)
        assert sentence.weights["encoder_self"].shape == (2, 4, S, S)
        assert sentence.weights["decoder_self"].shape == (3, 4, T, T)
        assert sentence.weights["cross"].shape == (3, 4, T, S)
        for weights in sentence.weights.values():
            torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
        causal = sentence.weights["decoder_self"]
        assert torch.equal(causal, causal.tril()) and bool((causal.diagonal(0, -2, -1) > 0).all())


def test_a_sentence_has_the_same_maps_alone_and_in_a_padded_batch() -> None:
    model, (srcs, tgts) = tiny_model(64, num_decoder_layers=3), sentences()
    batched = capture(model, srcs, tgts)
    for i in range(2):
        (alone,) = capture(model, srcs[i : i + 1], tgts[i : i + 1])
        for kind in ATTENTION_TYPES:
            torch.testing.assert_close(batched[i].weights[kind], alone.weights[kind])


def test_statistics_of_known_heads() -> None:
    T = 4
    identity, uniform = torch.eye(T), torch.full((T, T), 1 / T)
    previous = torch.zeros(T, T)
    previous[0, 0] = 1.0
    previous[torch.arange(1, T), torch.arange(T - 1)] = 1.0
    weights = torch.stack([identity, uniform, previous])[None]  # (1, 3, T, T)
    src = [5, 6, 7, EOS_ID]
    sentence = SentenceMaps(src, [BOS_ID], {"encoder_self": weights})
    stats = head_stats([sentence, sentence], "encoder_self")
    assert stats["entropy"][0].tolist() == pytest.approx([0.0, math.log(T), 0.0])
    assert stats["confidence"][0].tolist() == pytest.approx([1.0, 1 / T, 1.0])
    assert stats["same"][0].tolist() == pytest.approx([1.0, 1 / T, 1 / T])
    assert stats["previous"][0].tolist() == pytest.approx([0.0, (T - 1) / T**2, (T - 1) / T])
    assert stats["next"][0].tolist() == pytest.approx([0.0, (T - 1) / T**2, 0.0])
    assert stats["eos"][0].tolist() == pytest.approx([1 / T, 1 / T, 0.0])


@pytest.mark.slow
def test_figures_are_written_for_every_type_layer_and_probe(tokenizers, tmp_path) -> None:
    src_tok, tgt_tok = tokenizers
    model = tiny_model(64, num_encoder_layers=1)
    probes = translate_probes(
        model, src_tok, tgt_tok, ["a dog runs in the park", "the red car"], ["ein hund", "das auto"]
    )
    captured = capture_probes(model, probes.first(1))
    images = draw_maps(map_figures(captured, src_tok, tgt_tok, tmp_path, ATTENTION_TYPES))
    expected = {"attn/encoder_self/layer0"} | {
        f"attn/{kind}/layer{n}" for kind in ("decoder_self", "cross") for n in range(2)
    }
    assert set(images) == expected
    for shots in images.values():
        assert [caption for _, caption in shots] == ["probe 0 (reference)", "probe 0 (hypothesis)"]
        for path, _ in shots:
            assert path.read_bytes()[:8] == PNG and path.stat().st_size > 5000
    assert (tmp_path / "cross" / "layer1" / "probe0_hypothesis.png").is_file()
    stats, stat_images = write_stats(model, probes.src_ids, probes.ref_ids, tmp_path, ["cross"])
    assert stats["cross"]["entropy"].shape == (2, 4)
    assert set(stat_images) == {"attn_stats/cross"}
    assert (tmp_path / "stats_cross.png").read_bytes()[:8] == PNG
    rows = write_samples(probes, tmp_path, 1)
    assert rows[0][:3] == ["a dog runs in the park", "ein hund", probes.hypotheses[0]]
    assert "| a dog runs in the park | ein hund |" in (tmp_path / "samples.md").read_text()


def test_pieces_name_the_axes(tokenizers) -> None:
    src_tok, _ = tokenizers
    ids = src_tok.encode("a dog")
    assert "".join(src_tok.pieces(ids)).replace("\u2581", " ").strip() == "a dog"
    assert src_tok.pieces([BOS_ID, EOS_ID]) == ["<s>", "</s>"]


def test_head_grid_figure_holds_one_panel_per_head() -> None:
    fig = plots.head_grid(torch.rand(6, 3, 5).softmax(-1), list("abc"), list("vwxyz"), "title")
    heads = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in heads] == [f"head {h}" for h in range(6)]
    fig.canvas.draw()

    def shown(labels) -> list[str]:
        return [t.get_text() for t in labels if t.get_visible() and t.get_text()]

    # 4 columns: heads 0-3, then 4-5 beside two empty panels. The key pieces under the lowest
    # head of each column, the query pieces left of the first column, nowhere else.
    keys = [shown(ax.get_xticklabels()) for ax in heads]
    assert keys == [[], [], list("vwxyz"), list("vwxyz"), list("vwxyz"), list("vwxyz")]
    queries = [shown(ax.get_yticklabels()) for ax in heads]
    assert queries == [list("abc"), [], [], [], list("abc"), []]


def test_the_figures_of_one_key_share_the_largest_size_unstretched(tmp_path) -> None:
    """wandb lays out a key's images at one size: a short probe's grid is drawn at its own size
    on the canvas of the key's largest, not stretched to it; another key keeps its own size."""

    def figure(name: str, key: str, tq: int, tk: int) -> MapFigure:
        weights = torch.rand(2, tq, tk).softmax(-1)
        return MapFigure(tmp_path / f"{name}.png", key, name, name, weights, ["q"] * tq, ["k"] * tk)

    short, long, other = (
        figure("short", "attn/a", 3, 4),
        figure("long", "attn/a", 12, 20),
        figure("other", "attn/b", 3, 4),
    )
    images = draw_maps([short, long, other])
    assert [caption for _, caption in images["attn/a"]] == ["short", "long"]

    def pixels(f: MapFigure) -> tuple[int, int]:  # a PNG's IHDR: width, height
        return struct.unpack(">II", f.path.read_bytes()[16:24])

    assert pixels(short) == pixels(long)
    assert pixels(other)[0] < pixels(long)[0] and pixels(other)[1] < pixels(long)[1]

    def first_panel_inches(canvas: tuple[float, float] | None) -> tuple[float, float]:
        fig = plots.head_grid(
            short.weights, short.query_pieces, short.key_pieces, "t", canvas=canvas
        )
        box, (width, height) = fig.axes[0].get_position(), fig.get_size_inches()
        return round(box.width * width, 6), round(box.height * height, 6)

    big = plots.grid_inches(2, long.query_pieces, long.key_pieces)
    assert first_panel_inches(big) == first_panel_inches(None)


@pytest.mark.slow
def test_head_importance_masks_one_head_at_a_time_then_prunes(tokenizers, tmp_path) -> None:
    src_tok, tgt_tok = tokenizers
    model = tiny_model(64, num_decoder_layers=1, num_encoder_layers=1, num_heads=2)
    translator = Translator(model, src_tok, tgt_tok)
    sources, refs = ["a dog runs", "the man sits"], ["ein hund läuft", "der mann sitzt"]
    evaluator = HeadEvaluator(translator, sources, refs, DecodeOptions(strategy="greedy"))
    baseline, scores = head_importance(evaluator)
    assert [(s.kind, s.layer, s.head) for s in scores] == [
        (k, 0, h) for k in ATTENTION_TYPES for h in range(2)
    ]
    assert all(s.delta_loss != 0.0 for s in scores)  # every head matters a little
    assert all(m.head_mask is None for k in ATTENTION_TYPES for m in model.attention_modules(k))
    assert all(s.gradient is None for s in scores)
    points = prune_greedily(evaluator, scores, step=0.5)
    assert [p.heads_left for p in points] == [6, 3, 1]
    assert points[0].loss == pytest.approx(baseline[0])
    result = write_report(tmp_path, baseline, scores, points, len(sources))
    assert len(result["heads"]) == 6 and result["spearman_mask_gradient"] is None
    for name in ("heads_importance.png", "heads_pruning.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG
    assert "| heads left | share | loss | BLEU |" in (tmp_path / "heads.md").read_text()
    _, both = head_importance(evaluator, "both")
    gradients = gradient_importance(evaluator)
    assert [s.delta_loss for s in both] == [s.delta_loss for s in scores]
    assert [s.gradient for s in both] == [gradients[(s.kind, s.layer, s.head)] for s in both]
    result = write_report(tmp_path, baseline, both, points, len(sources))
    rho = spearman(
        *(torch.tensor([getattr(s, m) for s in both]) for m in ("delta_loss", "gradient"))
    )
    assert result["spearman_mask_gradient"] == pytest.approx(rho)
    assert f"gradient importance: {rho:+.3f} over 6 heads" in (tmp_path / "heads.md").read_text()
    _, by_gradient = head_importance(evaluator, "gradient")
    assert all(s.delta_loss is None and s.gradient is not None for s in by_gradient)


def test_callback_options_are_checked(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"attention types \['crosss'\] unknown"):
        AttentionMapsCallback(tmp_path, types=["crosss"])
    with pytest.raises(ValueError, match="2 sentences but 1 references"):
        AttentionMapsCallback(tmp_path, sentences=["a", "b"], references=["x"])
    with pytest.raises(ValueError, match="every_n_validations must be >= 1"):
        AttentionMapsCallback(tmp_path, every_n_validations=0)


def test_gradient_importance_is_the_finite_difference_derivative_per_sentence(tokenizers) -> None:
    src_tok, tgt_tok = tokenizers
    model = tiny_model(64, num_kv_heads=2).double()
    sources = ["a dog runs in the park", "the man sits", "a red car"]
    refs = ["ein hund läuft im park", "der mann sitzt", "ein rotes auto"]
    evaluator = HeadEvaluator(Translator(model, src_tok, tgt_tok), sources, refs, DecodeOptions())
    scores = gradient_importance(evaluator)
    pairs = []  # (source + eos, bos + target, target + eos), one sentence each, unpadded
    for source, ref in zip(sources, refs, strict=True):
        tgt = [BOS_ID, *tgt_tok.encode(ref), EOS_ID]
        src = [*src_tok.encode(source), EOS_ID]
        pairs.append((torch.tensor([src]), torch.tensor([tgt[:-1]]), torch.tensor([tgt[1:]])))

    def sentence_loss(kind: str, layer: int, head: int, gate: float, pair) -> float:
        mask = torch.ones(4, dtype=torch.float64)
        mask[head] = gate
        model.clear_head_masks()
        model.attention_modules(kind)[layer].head_mask = mask  # float64 (set_head_mask: float32)
        src, tgt_in, labels = pair
        with torch.no_grad():
            return float(F.cross_entropy(model(src, tgt_in)[0], labels[0]))

    eps = 1e-5
    for (kind, layer, head), value in scores.items():
        derivatives = [
            (sentence_loss(kind, layer, head, 1 + eps, pair)
             - sentence_loss(kind, layer, head, 1 - eps, pair)) / (2 * eps)
            for pair in pairs
        ]  # fmt: skip
        assert value == pytest.approx(sum(map(abs, derivatives)) / len(pairs), rel=1e-6, abs=1e-10)
    model.clear_head_masks()
    normalized = gradient_importance(evaluator, normalize=True)
    for kind in ATTENTION_TYPES:
        for layer in range(2):
            raw = torch.tensor([scores[(kind, layer, h)] for h in range(4)])
            torch.testing.assert_close(
                torch.tensor([normalized[(kind, layer, h)] for h in range(4)]), raw / raw.norm()
            )
    assert all(m.head_mask is None for k in ATTENTION_TYPES for m in model.attention_modules(k))


def brute_force_spearman(x: list[float], y: list[float]) -> float:
    """Average ranks by counting, then Pearson's formula."""

    def ranks(v: list[float]) -> list[float]:
        return [1 + sum(w < a for w in v) + (sum(w == a for w in v) - 1) / 2 for a in v]

    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))


def test_spearman_with_ties_equals_a_brute_force_computation() -> None:
    assert average_ranks(torch.tensor([3.0, 1.0, 3.0, 2.0, 3.0])).tolist() == [4, 1, 4, 2, 4]
    x = torch.tensor([0.1, 0.5, 0.2, 0.9])
    assert spearman(x, x * 10) == pytest.approx(1.0)
    assert spearman(x, -x) == pytest.approx(-1.0)
    assert spearman(x, torch.ones(4)) is None
    generator = torch.Generator().manual_seed(0)
    for n in (2, 5, 12, 40):
        for _ in range(5):
            a, b = (torch.randint(0, 4, (n,), generator=generator).double() for _ in range(2))
            if len(set(a.tolist())) < 2 or len(set(b.tolist())) < 2:
                continue
            assert spearman(a, b) == pytest.approx(brute_force_spearman(a.tolist(), b.tolist()))


def one_hot_rows(keys: list[int], width: int) -> torch.Tensor:
    """Rows that put all weight on one key each: (len(keys), width)."""
    return torch.eye(width)[keys]


def test_roles_of_constructed_heads() -> None:
    T = 6  # source: 5 pieces + eos; decoder input: bos + 3 pieces
    src, tgt_in = [5, 6, 7, 8, 9, EOS_ID], [BOS_ID, 10, 11, 12]
    other = 0.7 * one_hot_rows([(i + 3) % T for i in range(T)], T)
    other += 0.3 * one_hot_rows([(i + 2) % T for i in range(T)], T)
    encoder = torch.stack([
        torch.eye(T),  # same
        one_hot_rows([0, *range(T - 1)], T),  # previous
        one_hot_rows([*range(1, T), T - 1], T),  # next
        one_hot_rows([T - 1] * T, T),  # boundary: eos
        torch.full((T, T), 1 / T),  # broad: entropy log 6 = 1.79 nats
        torch.zeros(T, T),  # removed
        other,  # 0.7 and 0.3 on two keys, none of the above
    ])[None]  # fmt: skip
    aligned = one_hot_rows([2, 4, 0, 1], T)  # the consensus: off the diagonal everywhere
    cross = torch.stack(
        [aligned, aligned, aligned, one_hot_rows([0, 1, 2, 3], T), one_hot_rows([T - 1] * 4, T)]
    )[None]
    sentence = SentenceMaps(src, tgt_in, {"encoder_self": encoder, "cross": cross})
    stats = {kind: head_stats([sentence], kind) for kind in ("encoder_self", "cross")}
    assert stats["cross"]["agreement"][0].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
    roles = head_roles(stats)
    assert roles["encoder_self"] == [
        ["same", "previous", "next", "boundary", "broad", "removed", "other"]
    ]
    assert roles["cross"] == [["alignment", "alignment", "alignment", "diagonal", "boundary"]]
    assert {r for layer in [*roles["encoder_self"], *roles["cross"]] for r in layer} == set(ROLES)


@pytest.mark.slow
def test_roles_are_written_beside_the_statistics(tmp_path) -> None:
    model = tiny_model(64)
    srcs, tgts = sentences()
    stats, _ = write_stats(model, srcs, tgts, tmp_path, ATTENTION_TYPES)
    roles = json.loads((tmp_path / "roles.json").read_text())
    assert roles == head_roles(stats)
    table = (tmp_path / "roles.md").read_text()
    role = roles["cross"][1][2]
    assert f"| cross | 1 | 2 | {role} | " in table


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="Linux's scheduling policies")
@pytest.mark.parametrize("idle", [True, False])
def test_the_figure_worker_draws_in_idle_cpu_time_unless_told(idle, tmp_path) -> None:
    """With ``idle`` the worker process runs under SCHED_IDLE, so it takes no CPU time that
    training could use; without, it competes as any process does."""
    before = {p.pid for p in multiprocessing.active_children()}
    worker = FigureWorker(idle=idle)
    worker.submit(Drawing(7, tmp_path / "step0000007", tmp_path))
    deadline, done = time.monotonic() + 120, []
    while not done and time.monotonic() < deadline:
        done = worker.finished()
        time.sleep(0.1)
    try:
        ((job, drawn),) = done
        assert job.step == 7 and isinstance(drawn, Drawn)
        (pid,) = {p.pid for p in multiprocessing.active_children()} - before
        assert os.sched_getscheduler(pid) == (os.SCHED_IDLE if idle else os.SCHED_OTHER)
    finally:
        worker.close()
