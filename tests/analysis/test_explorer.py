"""The attention explorer's page: its data decodes back to the captured weights, it loads nothing
from the network, a real browser draws it (merging pieces into words as the page says), and the
head trends' rows."""

from __future__ import annotations

import base64
import copy
import html
import json
import re
import shutil
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.tiny import tiny_model
from transformer.analysis import explorer
from transformer.analysis.maps import capture_probes, translate_probes
from transformer.analysis.roles import head_roles
from transformer.analysis.stats import STATS, head_stats
from transformer.analysis.trends import TREND_COLUMNS, trend_charts, trend_rows
from transformer.data.tokenizer import BOS_ID, EOS_ID
from transformer.data.tokenizer_training import train_tokenizer
from transformer.model import ATTENTION_TYPES

SOURCES, REFERENCES = ["a dog runs in the park", "the red car"], ["ein hund läuft", "das auto"]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def tokenizer(corpus):
    texts = [*(corpus / "train.en").read_text().splitlines(), *(corpus / "train.de").read_text()
             .splitlines()]  # fmt: skip
    return train_tokenizer(texts, corpus / "joint.model", 64)


@pytest.fixture(scope="module")
def run(tokenizer):
    """Two validations' records of a 2+2-layer, 4-head model: (probes, captured, records)."""
    model = tiny_model(64)
    probes = translate_probes(model, tokenizer, tokenizer, SOURCES, REFERENCES)
    captured = capture_probes(model, probes)
    records = []
    for step in (3, 6):
        stats = run_stats(captured)
        record = explorer.validation_record(
            step, probes, captured, stats, tokenizer, tokenizer, ATTENTION_TYPES
        )
        records.append(record)
    return probes, captured, records


def run_stats(captured) -> dict:
    return {kind: head_stats(captured["reference"], kind) for kind in ATTENTION_TYPES}


def embedded(page: str) -> dict:
    return json.loads(re.search(r"const DATA = (\{.*\});\n", page).group(1))


def test_word_index_starts_words_at_spaces_and_specials() -> None:
    ids = [BOS_ID, 10, 11, 12, 13, 14, EOS_ID]
    pieces = ["<s>", "\u2581d", "o", "g", "\u2581run", "s", "</s>"]
    assert explorer.word_index(ids, pieces) == [0, 1, 1, 1, 2, 2, 3]
    assert explorer.word_index([11, 12], ["o", "g"]) == [0, 0]  # no space before the first


def test_page_data_decodes_to_the_captured_weights_within_rounding(run, tokenizer) -> None:
    probes, captured, records = run
    data = embedded(explorer.render_page(records))
    assert [r["step"] for r in data["records"]] == [3, 6]
    record = data["records"][1]
    raw = np.frombuffer(zlib.decompress(base64.b64decode(record["weights"])), np.uint8)
    assert len(record["maps"]) == len(SOURCES) * 2 * len(ATTENTION_TYPES)  # probes x targets x
    for entry in record["maps"]:
        sentence = captured[entry["target"]][entry["probe"]]
        expected = sentence.weights[entry["type"]]
        assert entry["shape"] == list(expected.shape)
        count = int(np.prod(entry["shape"]))
        got = raw[entry["offset"] : entry["offset"] + count].reshape(entry["shape"]) / 100
        torch.testing.assert_close(torch.from_numpy(got).float(), expected, atol=0.005, rtol=0)
    first = record["probes"][0]
    assert first["source"] == SOURCES[0]
    assert first["targets"]["reference"]["text"] == REFERENCES[0]
    assert first["targets"]["hypothesis"]["text"] == probes.hypotheses[0]
    assert first["src"]["pieces"] == tokenizer.pieces(probes.src_ids[0])
    assert record["stats"]["cross"]["entropy"][1][2] == pytest.approx(
        float(head_stats(captured["reference"], "cross")["entropy"][1, 2]), abs=1e-4
    )


def test_axes_are_cut_to_max_pieces(run, tokenizer) -> None:
    probes, captured, _ = run
    record = explorer.validation_record(1, probes, captured, {}, tokenizer, tokenizer, ["cross"], 5)
    shapes = {m["target"]: m["shape"] for m in record["maps"] if m["probe"] == 0}
    assert len(probes.src_ids[0]) > 5 and len(probes.ref_ids[0]) > 5
    assert shapes["reference"] == [2, 4, 5, 5]
    assert len(record["probes"][0]["src"]["pieces"]) == 5
    assert len(record["probes"][0]["targets"]["reference"]["words"]) == 5


# corpus text that, raw in the page's script, would end it or open a comment there
HOSTILE = "a dog <!--<script> runs </script><b>"


def with_source(records: list[dict], source: str) -> list[dict]:
    """The records with their first probe's source text replaced."""
    records = copy.deepcopy(records)
    for record in records:
        record["probes"][0]["source"] = source
    return records


def test_no_corpus_text_can_end_the_pages_script_or_open_a_comment(run) -> None:
    """The embedded data holds no ``<`` (a parser's view: nothing in it can end the script, or
    open a comment or a script inside it, whatever the corpus says) and decodes to the text."""
    records = with_source(run[2], HOSTILE)
    page = explorer.render_page(records)
    data = re.search(r"const DATA = (\{.*\});\n", page).group(1)
    assert "<" not in data
    assert json.loads(data) == {"records": records}


def test_page_loads_nothing_from_the_network(run) -> None:
    page = explorer.render_page(run[2]).lower()
    for reference in ("http://", "https://", "<link", " src=", "@import", "url("):
        assert reference not in page


def test_records_are_saved_and_loaded_by_step(run, tmp_path) -> None:
    records = run[2]
    for record in reversed(records):
        explorer.save_record(record, tmp_path / f"step{record['step']:07d}")
    assert [r["step"] for r in explorer.load_records(tmp_path)] == [3, 6]


def test_trend_rows_hold_every_step_type_layer_head_and_statistic(run) -> None:
    rows = trend_rows(run[2])
    assert len(TREND_COLUMNS) == len(rows[0])
    keys = {tuple(row[:5]) for row in rows}
    expected = {
        (step, kind, layer, head, stat)
        for step in (3, 6) for kind in ATTENTION_TYPES for stat in STATS
        for layer in range(2) for head in range(4)
    }  # fmt: skip
    assert len(rows) == len(keys) and keys == expected
    charts = {f"attn_trends/{k}/{s}" for k in ATTENTION_TYPES for s in STATS}
    assert set(trend_charts(rows)) == charts


def browse(page: Path, view: str) -> str:
    """The DOM of ``page#view`` once drawn, from headless Chromium."""
    out = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
         "--dump-dom", f"{page.as_uri()}#{view}"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return out.stdout


def drawn(dom: str) -> tuple[str, list[float]]:
    error = re.search(r'<div id="error">(.*?)</div>', dom, flags=re.S).group(1)
    assert error == "", error
    state = re.search(r'data-drawn="([^"]*)"', dom).group(1)
    return state, [float(w) for w in re.findall(r'data-w="([0-9.]+)"', dom)]


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (apt-get install chromium)")
def test_browser_draws_the_chosen_view_and_merges_words_as_stated(run, tmp_path) -> None:
    _, captured, records = run
    page = explorer.write_page(records, tmp_path / "explorer.html")
    dom = browse(page, "type=cross&layer=1&head=2&target=reference&units=words")
    state, cells = drawn(dom)
    assert state == "step 6|a dog runs in the park|cross|reference|words|1|2"
    record = records[1]
    src_words, tgt_words = (
        np.array(axis["words"])
        for axis in (record["probes"][0]["src"], record["probes"][0]["targets"]["reference"])
    )
    pieces = captured["reference"][0].weights["cross"][1, 2].numpy()
    pieces = np.round(pieces * 100) / 100  # as stored
    brute = np.array([  # a word's row: the mean of its pieces' rows, summed over key pieces
        [pieces[tgt_words == a][:, src_words == b].sum(1).mean() for b in sorted(set(src_words))]
        for a in sorted(set(tgt_words))
    ])  # fmt: skip
    assert len(set(src_words)) < len(src_words)  # some words have several pieces
    np.testing.assert_allclose(np.array(cells).reshape(brute.shape), brute, atol=1e-4)
    role = record["roles"]["cross"][1][2]  # shown in the panel's title and the head choices
    assert record["roles"] == head_roles(run_stats(captured))
    assert f"layer 1, head 2 ({role})" in dom and f">2: {role}</option>" in dom
    state, cells = drawn(browse(page, "type=decoder_self&layer=0&head=all&step=0&probe=1"))
    assert state == "step 3|the red car|decoder_self|reference|pieces|0|all"
    (tgt_len,) = {len(r["targets"]["reference"]["pieces"]) for r in record["probes"][1:]}
    assert len(cells) == 4 * tgt_len * tgt_len  # every head of the layer


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (apt-get install chromium)")
def test_browser_draws_a_page_whose_corpus_text_would_open_a_comment(run, tmp_path) -> None:
    page = explorer.write_page(with_source(run[2], HOSTILE), tmp_path / "explorer.html")
    state, cells = drawn(browse(page, "type=cross&layer=0&head=0"))
    assert html.unescape(state).split("|")[1] == HOSTILE and cells


@pytest.mark.slow
def test_bench_page_grows_with_the_validations() -> None:
    from argparse import Namespace

    from bench.bench_explorer import page_bytes

    shape = dict(layers=1, heads=2, probes=1)
    one, two = (page_bytes(Namespace(**shape, validations=n), 6, 3.0) for n in (1, 2))
    assert 0 < one < two
