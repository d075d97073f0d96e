"""Score a checkpoint: ``python evaluate.py ckpt_path=PATH [split=...] [decode.beam_size=5]``.

``input=FILE`` (or ``input=-`` for stdin) translates lines of text instead. See the README's
Evaluation section.
"""

import sys

import hydra
from omegaconf import DictConfig

from transformer.errors import UserError
from transformer.evaluation import evaluate


@hydra.main(version_base="1.3", config_path="configs", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    try:
        result = evaluate(cfg)
    except UserError as err:  # bad options, checkpoints or data: the message says what to fix
        sys.exit(f"error: {err}")
    if "analysis" in result:
        print(f"analysis={result['analysis']}: written to {result['out_dir']}")
        return
    if "translations" in result:
        for sentence in result["translations"]:
            for t in sentence:
                print(t.text if t.score is None else f"{t.score:.4f}\t{t.text}")
        return
    decode = result["decode"]
    search = "greedy" if decode["strategy"] == "greedy" else f"beam {decode['beam_size']}"
    print(f"{result['split']} ({result['direction']}, {result['num_sentences']} sentences, "
          f"{search}, len_penalty {decode['len_penalty']})")  # fmt: skip
    print(f"BLEU = {result['bleu']:.2f}  {result['signature']['bleu']}")
    print(f"BLEU lowercased = {result['bleu_lc']:.2f}  {result['signature']['bleu_lc']}")
    print(f"chrF = {result['chrf']:.2f}  {result['signature']['chrf']}")
    seconds = result["translate_seconds"]
    print(f"translated in {seconds:.1f} s by {result['engine']} on {result['device']} "
          f"({result['dtype']}), "
          f"{result['num_sentences'] / max(seconds, 1e-9):.1f} sentences/s")  # fmt: skip


if __name__ == "__main__":
    main()
