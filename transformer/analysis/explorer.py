"""The attention explorer: one self-contained HTML page (``explorer.html``) holding the probe
maps and head statistics of every map validation, drawn in the browser by the vanilla JS and SVG
of the template ``explorer.html`` beside this module (nothing loaded from the network).

A validation's record holds, per probe and target (reference, hypothesis), the pieces of each
axis with the word each piece belongs to, and every layer's and head's weights of each attention
type as bytes: rounded to 1/``LEVELS``, zlib-compressed and base64-encoded, one blob per
validation (the page inflates it with the browser's ``DecompressionStream``). The callback saves
each record as ``step<N>/explorer.json`` and rebuilds the page from all of them. File sizes:
docs/benchmarks.md#attention-explorer-page-size.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from transformer.analysis.maps import Probes, SentenceMaps
from transformer.analysis.roles import head_roles
from transformer.atomic import atomic_write
from transformer.data.tokenizer import Tokenizer, word_index

LEVELS = 100  # weights are stored rounded to 0.01, one byte each
RECORD = "explorer.json"
TEMPLATE = Path(__file__).with_name("explorer.html")
PLACEHOLDER = "/*EXPLORER_DATA*/null"


def _axis(ids: list[int], tokenizer: Tokenizer) -> dict:
    pieces = tokenizer.pieces(ids)
    return {"pieces": pieces, "words": word_index(ids, pieces)}


def quantize(weights: Tensor) -> bytes:
    """Weights in [0, 1] -> one byte each, ``round(w * LEVELS)``, in row-major order."""
    return (weights * LEVELS).round().to("cpu", torch.uint8).contiguous().numpy().tobytes()


def validation_record(
    step: int | None,
    probes: Probes | None,
    captured: dict[str, list[SentenceMaps]],
    stats: dict[str, dict[str, Tensor]],
    src_tok: Tokenizer,
    tgt_tok: Tokenizer,
    types: Sequence[str],
    max_pieces: int = 40,
) -> dict:
    """One validation for the page (``step`` None: a checkpoint outside training): the probes'
    maps (``captured``: target -> one :class:`SentenceMaps` per probe; axes cut to
    ``max_pieces``), the head statistics ({type: {stat: (L, H)}}) and the heads' roles."""
    chunks: list[bytes] = []
    maps: list[dict] = []
    offset = 0
    entries = []
    texts = {}
    if probes is not None:
        texts = {"reference": probes.references, "hypothesis": probes.hypotheses}
    for i, source in enumerate([] if probes is None else probes.sources):
        targets, src_ids = {}, []
        for target, sentences in captured.items():
            sentence = sentences[i]
            src_ids, tgt_ids = sentence.src[:max_pieces], sentence.tgt_in[:max_pieces]
            targets[target] = {"text": texts[target][i], **_axis(tgt_ids, tgt_tok)}
            for kind in types:
                q, k = (min(len(ids), max_pieces) for ids in sentence.axes(kind))
                data = quantize(sentence.weights[kind][:, :, :q, :k])
                shape = [*sentence.weights[kind].shape[:2], q, k]
                maps.append({"probe": i, "target": target, "type": kind, "shape": shape,
                             "offset": offset})  # fmt: skip
                chunks.append(data)
                offset += len(data)
        entries.append({"source": source, "src": _axis(src_ids, src_tok), "targets": targets})
    rounded = {
        kind: {name: [[round(float(v), 4) for v in row] for row in value.tolist()]
               for name, value in values.items()}
        for kind, values in stats.items()
    }  # fmt: skip
    blob = base64.b64encode(zlib.compress(b"".join(chunks), 9)).decode("ascii")
    return {"step": step, "levels": LEVELS, "types": list(types), "probes": entries, "maps": maps,
            "weights": blob, "stats": rounded, "roles": head_roles(stats)}  # fmt: skip


def save_record(record: dict, step_dir: Path) -> Path:
    """Written whole or not at all: the figure worker may read the records meanwhile."""
    path = step_dir / RECORD
    data = json.dumps(record, separators=(",", ":")).encode("utf-8")
    atomic_write(path, lambda f: f.write(data))
    return path


def load_records(out_dir: Path) -> list[dict]:
    """The records saved under ``out_dir/step*/``, by step."""
    records = [json.loads(p.read_text(encoding="utf-8")) for p in out_dir.glob(f"step*/{RECORD}")]
    return sorted(records, key=lambda r: r["step"])


def render_page(records: list[dict]) -> str:
    """The template with ``records`` embedded in its script, every ``<`` written ``\\u003c`` (the
    same string to JSON): no text of the corpus can end the script or open a comment in it."""
    data = json.dumps({"records": records}, separators=(",", ":")).replace("<", "\\u003c")
    return TEMPLATE.read_text(encoding="utf-8").replace(PLACEHOLDER, data)


def write_page(records: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_page(records), encoding="utf-8")
    return path
