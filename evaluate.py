"""Score a checkpoint: ``python evaluate.py ckpt_path=PATH [split=...] [decode.beam_size=5]``.

``input=FILE`` (or ``input=-`` for stdin) translates lines of text instead, ``score=true`` scores
given translations. See the README's Evaluation section.
"""

import contextlib
import shutil
import sys

import hydra
from omegaconf import DictConfig

from transformer.errors import UserError
from transformer.evaluation import evaluate


def _print_file(path: str) -> None:
    sys.stdout.flush()
    with open(path, "rb") as f:
        shutil.copyfileobj(f, sys.stdout.buffer)


@hydra.main(version_base="1.3", config_path="configs", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    try:  # stdout holds the results alone: what else prints while evaluating goes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            result = evaluate(cfg)
    except UserError as err:  # bad options, checkpoints or data: the message says what to fix
        sys.exit(f"error: {err}")
    if "analysis" in result:
        print(f"analysis={result['analysis']}: written to {result['out_dir']}")
        return
    if "output" in result:  # input=...'s translations or score=true's scores: a file
        if cfg.output is None:  # the run directory's: to stdout
            _print_file(result["output"])
        else:
            done = result["resumed_at"]
            before = f" ({done} before this run)" if done else ""
            print(f"{result['lines']} input lines{before}: {result['output']}")
        return
    decode = result["decode"]
    search = {
        "greedy": "greedy",
        "beam": f"beam {decode['beam_size']}, len_penalty {decode['len_penalty']}",
        "sample": f"sample (temperature {decode['temperature']}, top_k {decode['top_k']}, "
        f"top_p {decode['top_p']}, seed {decode['seed']})",
    }[decode["strategy"]]
    models = f"ensemble of {len(result['checkpoints'])}" if result["ensemble"] else ""
    print(f"{result['split']} ({result['direction']}, {result['num_sentences']} sentences, "
          f"{search}{', ' + models if models else ''})")  # fmt: skip
    print(f"BLEU = {result['bleu']:.2f}  {result['signature']['bleu']}")
    print(f"BLEU lowercased = {result['bleu_lc']:.2f}  {result['signature']['bleu_lc']}")
    print(f"chrF = {result['chrf']:.2f}  {result['signature']['chrf']}")
    if "constraints" in result:
        met, total = result["constraints"]["met"], result["constraints"]["total"]
        print(f"constraints met = {100 * met / max(total, 1):.1f}% ({met} of {total} phrases)")
    seconds = result["translate_seconds"]
    print(f"translated in {seconds:.1f} s by {result['engine']} on {result['device']} "
          f"({result['dtype']}), "
          f"{result['num_sentences'] / max(seconds, 1e-9):.1f} sentences/s")  # fmt: skip


if __name__ == "__main__":
    main()
