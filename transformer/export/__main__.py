"""``python -m transformer.export ct2 CKPT [CKPT ...] OUT_DIR [--quantization TYPE] [--force]`` and
``python -m transformer.export hf CKPT [CKPT ...] OUT_DIR [--force]``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from transformer.errors import UserError
from transformer.export.ct2 import QUANTIZATIONS, export_ct2
from transformer.export.hf import export_hf


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
    ct2.add_argument(
        "--quantization", choices=QUANTIZATIONS, default="float32",
        help="the weights' type in the model (default: float32)",
    )  # fmt: skip
    hf = engines.add_parser(
        "hf",
        help='a Hugging Face MarianMT directory (pip install -e ".[hf]")',
        description="Convert one checkpoint, or the average of several, to a MarianMT model "
        "directory that transformers loads (AutoModelForSeq2SeqLM, AutoTokenizer). Post-norm "
        "models with sinusoidal positions map; other options are refused by name.",
    )
    for engine in (ct2, hf):  # what every format takes
        engine.add_argument("checkpoints", nargs="+", metavar="CKPT", help="checkpoints of one run")
        engine.add_argument("out_dir", metavar="OUT_DIR", help="the model directory to write")
        engine.add_argument(
            "--force", action="store_true", help="replace an OUT_DIR that an earlier export wrote"
        )
    args = parser.parse_args(argv)
    try:
        if args.engine == "hf":
            out = export_hf(args.checkpoints, args.out_dir, args.force)
        else:
            out = export_ct2(args.checkpoints, args.out_dir, args.quantization, args.force)
    except UserError as err:
        sys.exit(f"error: {err}")
    what = "MarianMT" if args.engine == "hf" else f"{args.quantization}; see {out}/README.md"
    print(f"wrote {out} ({what})", file=sys.stderr)


if __name__ == "__main__":
    main()
