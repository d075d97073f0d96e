"""Score a checkpoint: ``python evaluate.py ckpt_path=PATH [split=...] [decode.beam_size=5]``, the
``transformer-evaluate`` command of an installed package (:func:`transformer.cli.evaluate_main`).

``input=FILE`` (or ``input=-`` for stdin) translates lines of text instead (``reference=FILE``:
and scores them), ``score=true`` scores given translations, ``hypotheses=FILE reference=FILE``
scores translations made elsewhere. See the README's Evaluation section.
"""

from transformer.cli import evaluate_main

if __name__ == "__main__":
    evaluate_main()
