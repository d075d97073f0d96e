"""Size of the attention explorer's page (``transformer.analysis.explorer``) for a model and a run
of given shapes, on synthetic weights: every head's rows are softmax(``sharpness`` * N(0, 1))
(causal for decoder self-attention), every probe ``pieces`` pieces long on both sides (axes
included: eos, bos), teacher-forced on the reference and on the translation.

    python bench/bench_explorer.py                      # 6+6 layers, 8 heads, 4 probes x 20
    python bench/bench_explorer.py --pieces 16 24 40 --sharpness 2 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout

import torch

from transformer.analysis import explorer
from transformer.analysis.maps import Probes, SentenceMaps
from transformer.analysis.stats import STATS
from transformer.data.tokenizer import BOS_ID, EOS_ID
from transformer.model import ATTENTION_TYPES


class Pieces:
    """A tokenizer's ``pieces`` only: a word of two pieces for every three ids."""

    def pieces(self, ids: list[int]) -> list[str]:
        return [("" if i % 3 == 1 else "\u2581") + f"w{i}" for i in ids]


def weights(layers: int, heads: int, q: int, k: int, sharpness: float, causal: bool):
    logits = torch.randn(layers, heads, q, k) * sharpness
    if causal:
        logits = logits.masked_fill(torch.ones(q, k, dtype=torch.bool).triu(1), float("-inf"))
    return logits.softmax(-1)


def page_bytes(args: argparse.Namespace, pieces: int, sharpness: float) -> int:
    L, H = args.layers, args.heads
    src = [[*range(10, 9 + pieces), EOS_ID] for _ in range(args.probes)]
    tgt = [[BOS_ID, *range(10, 9 + pieces)] for _ in range(args.probes)]
    text = " ".join(["word"] * 12)
    probes = Probes([text] * args.probes, [text] * args.probes, src, tgt, tgt, [text] * args.probes)
    records = []
    for step in range(args.validations):
        captured = {
            target: [
                SentenceMaps(
                    s,
                    t,
                    {
                        "encoder_self": weights(L, H, pieces, pieces, sharpness, False),
                        "decoder_self": weights(L, H, pieces, pieces, sharpness, True),
                        "cross": weights(L, H, pieces, pieces, sharpness, False),
                    },
                )  # fmt: skip
                for s, t in zip(src, tgt, strict=True)
            ]
            for target in ("reference", "hypothesis")
        }
        stats = {kind: {name: torch.rand(L, H) for name in STATS} for kind in ATTENTION_TYPES}
        records.append(
            explorer.validation_record(
                1000 * step, probes, captured, stats, Pieces(), Pieces(), ATTENTION_TYPES, pieces
            )
        )
    return len(explorer.render_page(records).encode("utf-8"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=6, help="per side")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--probes", type=int, default=4)
    parser.add_argument("--validations", type=int, default=20)
    parser.add_argument("--pieces", type=int, nargs="+", default=[16, 24, 40])
    parser.add_argument("--sharpness", type=float, nargs="+", default=[2.0, 3.0])
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"{args.layers}+{args.layers} layers, {args.heads} heads, {args.probes} probes x "
          f"{args.validations} validations\n")  # fmt: skip
    print("| pieces per sentence | sharpness | row entropy (nats) | page |\n|---:|---:|---:|---:|")
    for pieces in args.pieces:
        for sharpness in args.sharpness:
            sample = weights(args.layers, args.heads, pieces, pieces, sharpness, False)
            entropy = float(-torch.xlogy(sample, sample).sum(-1).mean())
            size = page_bytes(args, pieces, sharpness)
            print(f"| {pieces} | {sharpness:g} | {entropy:.2f} | {size / 1e6:.2f} MB |")


if __name__ == "__main__":
    main()
