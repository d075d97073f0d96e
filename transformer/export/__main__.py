"""``python -m transformer.export ct2 CKPT [CKPT ...] OUT_DIR [--quantization TYPE] [--force]``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from transformer.errors import UserError
from transformer.export.ct2 import QUANTIZATIONS, export_ct2


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.export",
        description="Export a trained model to an inference engine.",
    )
    engines = parser.add_subparsers(dest="engine", required=True)
    ct2 = engines.add_parser(
        "ct2",
        help='a CTranslate2 model directory (pip install -e ".[export]")',
        description="Convert one checkpoint, or the average of several (as evaluate.py averages "
        "them), to a CTranslate2 model directory with its vocabulary, SentencePiece models and a "
        "README on translating with it.",
    )
    ct2.add_argument("checkpoints", nargs="+", metavar="CKPT", help="checkpoints of one run")
    ct2.add_argument("out_dir", metavar="OUT_DIR", help="the model directory to write")
    ct2.add_argument(
        "--quantization", choices=QUANTIZATIONS, default="float32",
        help="the weights' type in the model (default: float32)",
    )  # fmt: skip
    ct2.add_argument(
        "--force", action="store_true", help="replace an OUT_DIR that an earlier export wrote"
    )
    args = parser.parse_args(argv)
    try:
        out = export_ct2(args.checkpoints, args.out_dir, args.quantization, args.force)
    except UserError as err:
        sys.exit(f"error: {err}")
    print(f"wrote {out} ({args.quantization}); see {out}/README.md", file=sys.stderr)


if __name__ == "__main__":
    main()
