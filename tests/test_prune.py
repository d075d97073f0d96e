"""Pruning heads for real: the pruned model computes what the head-masked model computes (logits,
cached decoding, greedy translations), with fewer parameters; checkpoints keep their training
state; bad requests are refused by name."""

from __future__ import annotations

import copy
import io
import json
from functools import partial

import pytest
import torch

from tests.tiny import compose_cfg, compose_eval_cfg, tiny_model, tiny_overrides
from transformer.checkpoints import (
    load_checkpoint,
    model_from_checkpoint,
    tokenizers_from_checkpoint,
)
from transformer.config import TransformerConfig
from transformer.data.tokenizer import BOS_ID, EOS_ID
from transformer.decoding import DecodeOptions, beam_search, greedy_decode
from transformer.errors import ConfigError
from transformer.evaluation import evaluate
from transformer.model import ATTENTION_TYPES, Transformer
from transformer.prune import least_important, main, parse_heads, prune_checkpoint
from transformer.surgery import prune_model, restore_heads
from transformer.training import train
from transformer.training.muon import MuonAdamW
from transformer.training.optim import build_optimizer
from transformer.translate import Translator

PAD, V = 0, 50
# every type; modules left with no heads (decoder_self layer 0, cross layer 0); whole key/value
# groups of 2
HEADS = [
    ("encoder_self", 0, 2), ("encoder_self", 0, 3), ("encoder_self", 1, 0), ("encoder_self", 1, 1),
    *(("decoder_self", 0, h) for h in range(4)), *(("cross", 0, h) for h in range(4)),
    ("cross", 1, 0), ("cross", 1, 1),
]  # fmt: skip


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.randint(4, V, (3, 7))
    src[0, 5:], src[1, 3:] = PAD, PAD
    return src, torch.randint(4, V, (3, 5))


def masked_model(model: Transformer, heads) -> Transformer:
    for kind in ATTENTION_TYPES:
        for layer in range(2):
            mask = torch.tensor([0.0 if (kind, layer, h) in heads else 1.0 for h in range(4)])
            model.set_head_mask(kind, layer, mask)
    return model


@pytest.mark.parametrize(
    "options",
    [{}, {"num_kv_heads": 2}, {"norm_first": False, "bias": False}, {"positions": "relative"},
     {"positions": "rope", "num_kv_heads": 2}],
    ids=["multi-head", "grouped-query", "post-norm-no-bias", "relative", "rope"],
)  # fmt: skip
def test_the_pruned_model_computes_what_the_masked_model_computes(options) -> None:
    full, (src, tgt) = tiny_model(V, **options), batch()
    with torch.no_grad():
        for p in full.parameters():  # biases and norms off their initial values
            p.add_(0.05 * torch.randn_like(p))
    pruned = prune_model(full, HEADS)
    assert pruned.cfg.heads_per_layer == {
        "encoder_self": [2, 2], "decoder_self": [0, 4], "cross": [0, 2]
    }  # fmt: skip
    removed = sum(p.numel() for p in full.parameters()) - pruned.num_parameters()
    per_head = {None: 4 * 8 * 32 + 3 * 8, 2: (1 + 2 / 2 + 1) * 8 * 32 + 2 * 8}  # Q,K,V,out; biases
    if options.get("bias", True):
        assert removed == len(HEADS) * per_head[options.get("num_kv_heads")]
    reference = masked_model(full, HEADS)
    torch.testing.assert_close(pruned(src, tgt), reference(src, tgt), atol=1e-5, rtol=1e-5)
    memory = pruned.encode(src)
    cache = pruned.init_cache(memory, src.eq(PAD))
    steps = [pruned.decode(tgt[:, t : t + 1], cache=cache) for t in range(tgt.size(1))]
    torch.testing.assert_close(torch.cat(steps, 1), pruned(src, tgt), atol=1e-5, rtol=1e-5)
    greedy = DecodeOptions(strategy="greedy", max_len_b=12)
    ours, theirs = (
        greedy_decode(m, src, greedy, bos_id=BOS_ID, eos_id=EOS_ID) for m in (pruned, reference)
    )
    assert [h[0].tokens for h in ours] == [h[0].tokens for h in theirs]
    beam = DecodeOptions(beam_size=3, max_len_b=12)
    ours, theirs = (
        beam_search(m, src, beam, bos_id=BOS_ID, eos_id=EOS_ID) for m in (pruned, reference)
    )
    assert [h[0].tokens for h in ours] == [h[0].tokens for h in theirs]


@pytest.mark.parametrize("positions", ["sinusoidal", "relative"])
def test_restored_heads_compute_the_same_with_every_layer_whole(positions) -> None:
    full, (src, tgt) = tiny_model(V, num_kv_heads=2, positions=positions), batch()
    pruned = prune_model(full, HEADS)
    restored = restore_heads(pruned)
    assert restored.cfg.heads_per_layer is None
    assert restored.num_parameters() == full.num_parameters()
    torch.testing.assert_close(restored(src, tgt), pruned(src, tgt), atol=1e-5, rtol=1e-5)


def test_pruning_twice_is_pruning_the_union() -> None:
    full, (src, tgt) = tiny_model(V), batch()
    once = prune_model(full, [("cross", 0, 1), ("cross", 0, 3), ("encoder_self", 1, 2)])
    twice = prune_model(once, [("cross", 0, 1)])  # heads 0, 2 are left, now numbered 0, 1
    both = [("cross", 0, 1), ("cross", 0, 3), ("encoder_self", 1, 2), ("cross", 0, 2)]
    torch.testing.assert_close(
        twice(src, tgt), masked_model(full, both)(src, tgt), atol=1e-5, rtol=0
    )


def checkpoint(model: Transformer, optimizer: torch.optim.Optimizer) -> dict:
    """What train.py's checkpoint holds of the model and optimizer (Lightning's keys), as read
    back from a file (no tensor shared with the model or optimizer)."""
    ckpt = {
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "hyper_parameters": {"model": model.cfg.to_dict()},
        "optimizer_states": [optimizer.state_dict()],
        "global_step": 1,
    }
    buffer = io.BytesIO()
    torch.save(ckpt, buffer)
    return torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)


def step(model: Transformer, optimizer: torch.optim.Optimizer, src, tgt) -> None:
    optimizer.zero_grad()
    model(src, tgt).logsumexp(-1).mean().backward()
    optimizer.step()


@pytest.mark.slow
def test_a_pruned_checkpoint_trains_on_as_the_masked_model_would() -> None:
    """AdamW's moments are cut with their weights: a step of the pruned checkpoint's model and
    optimizer equals the pruned result of the masked model's step (masked heads get no
    gradient; weight decay 0 leaves them be). Adam's eps is raised so that gradients which are
    zero but for rounding (keys' biases: softmax ignores a shift) do not become whole steps."""
    full, (src, tgt) = tiny_model(V, num_kv_heads=2).train(), batch()
    full.dropout = 0.0
    make = torch.optim.AdamW
    optimizer = build_optimizer(full, lambda groups: make(groups, lr=1e-2, eps=1e-4), 0.0)
    step(full.eval(), optimizer, src, tgt)
    ckpt = prune_checkpoint(checkpoint(full, optimizer), HEADS)
    assert ckpt["global_step"] == 1 and ckpt["pruned_heads"] == [[list(h) for h in sorted(HEADS)]]
    pruned = model_from_checkpoint(ckpt).eval()
    pruned_optimizer = build_optimizer(pruned, lambda groups: make(groups, lr=1e-2, eps=1e-4), 0.0)
    pruned_optimizer.load_state_dict(ckpt["optimizer_states"][0])
    step(pruned, pruned_optimizer, src, tgt)
    step(masked_model(full, HEADS), optimizer, src, tgt)
    full.clear_head_masks()
    expected = prune_model(full, HEADS)
    theirs = expected.state_dict()
    for name, ours in pruned.state_dict().items():
        torch.testing.assert_close(ours, theirs[name], atol=1e-6, rtol=1e-5)


def test_muon_moments_are_cut_as_their_weights_are() -> None:
    """optim=muon_wsd's state (Muon's momentum on the matrices, AdamW's moments on the rest) comes
    out of pruning as the pruned model's optimizer numbers it, each moment cut as its weight."""
    full, (src, tgt) = tiny_model(V, num_kv_heads=2).train(), batch()
    optimizer = build_optimizer(full, partial(MuonAdamW, lr=1e-2), 0.0)
    step(full, optimizer, src, tgt)
    ckpt = prune_checkpoint(checkpoint(full, optimizer), HEADS)
    pruned = model_from_checkpoint(ckpt)
    pruned_optimizer = build_optimizer(pruned, partial(MuonAdamW, lr=1e-2), 0.0)
    pruned_optimizer.load_state_dict(ckpt["optimizer_states"][0])
    names = {id(p): name for name, p in pruned.named_parameters()}
    for key in ("momentum_buffer", "exp_avg"):  # Muon's, AdamW's
        moments = copy.deepcopy(full)  # a model whose weights are the moments
        with torch.no_grad():
            for p, m in zip(full.parameters(), moments.parameters(), strict=True):
                m.copy_(optimizer.state[p].get(key, torch.zeros_like(m)))
        want = prune_model(moments, HEADS).state_dict()
        cut = {names[id(p)]: s[key] for p, s in pruned_optimizer.state.items() if key in s}
        assert cut and all(torch.equal(m, want[name]) for name, m in cut.items())


def test_whole_groups_by_share_and_bad_requests_refused_by_name() -> None:
    model = tiny_model(V, num_kv_heads=2)
    scores = {(k, i, h): float(100 * t + 10 * i + h) for t, k in enumerate(ATTENTION_TYPES)
              for i in range(2) for h in range(4)}  # fmt: skip
    scores[("cross", 1, 0)] = -1000.0  # its group (heads 0, 1 of cross layer 1) is least important
    chosen = least_important(model, scores, 0.25)  # 3 of 12 groups: then encoder_self layer 0's
    assert chosen == [("cross", 1, 0), ("cross", 1, 1), *(("encoder_self", 0, h) for h in range(4))]
    with pytest.raises(ConfigError, match=r"cross:1:1 shares its keys and values with heads 0-1"):
        prune_model(model, [("cross", 1, 1)])
    with pytest.raises(ConfigError, match=r"cross:2:0 does not exist; cross has 2 layers"):
        prune_model(model, [("cross", 2, 0)])
    with pytest.raises(ConfigError, match=r"'cross:0' is not TYPE:LAYER:HEAD"):
        parse_heads("cross:0")
    assert parse_heads("cross:0:1, encoder_self:1:0") == [("cross", 0, 1), ("encoder_self", 1, 0)]
    with pytest.raises(ConfigError, match=r"--share=1.0 must be in \[0, 1\)"):
        least_important(model, scores, 1.0)


def test_heads_per_layer_is_checked_by_the_config() -> None:
    sizes = dict(src_vocab_size=V, tgt_vocab_size=V, d_model=32, num_heads=4, num_kv_heads=2,
                 num_encoder_layers=2, num_decoder_layers=1)  # fmt: skip
    good = {"encoder_self": [4, 2], "decoder_self": [0], "cross": [4]}
    assert TransformerConfig(**sizes, heads_per_layer=good).layer_heads("encoder_self") == [4, 2]
    with pytest.raises(ValueError, match=r"heads_per_layer.encoder_self\[1\]=3 must be a multiple"):
        TransformerConfig(**sizes, heads_per_layer={**good, "encoder_self": [4, 3]})
    with pytest.raises(ValueError, match=r"heads_per_layer.cross has 2 entries for 1 layers"):
        TransformerConfig(**sizes, heads_per_layer={**good, "cross": [4, 4]})
    with pytest.raises(ValueError, match=r"it needs exactly encoder_self, decoder_self, cross"):
        TransformerConfig(**sizes, heads_per_layer={"cross": [4]})


@pytest.mark.slow
def test_a_pruned_checkpoint_evaluates_and_trains_on_like_any_other(corpus, tmp_path) -> None:
    common = [*tiny_overrides(corpus), "validation.bleu_sentences=0", "~callbacks.best_checkpoint"]
    train(compose_cfg([*common, "trainer.max_steps=2"], tmp_path / "run"))
    ckpt, pruned = tmp_path / "run" / "checkpoints" / "last.ckpt", tmp_path / "pruned.ckpt"
    main([str(ckpt), str(pruned), "--heads", "cross:1:0,cross:1:3,decoder_self:0:2"])
    assert model_from_checkpoint(load_checkpoint(pruned)).cfg.heads_per_layer == {
        "encoder_self": [4, 4], "decoder_self": [3, 4], "cross": [4, 2]
    }  # fmt: skip
    result = evaluate(compose_eval_cfg([f"ckpt_path={pruned}", "split=val", "decode=greedy"],
                               tmp_path / "eval"))  # fmt: skip
    masked = masked_model(model_from_checkpoint(load_checkpoint(ckpt)), [("cross", 1, 0),
                          ("cross", 1, 3), ("decoder_self", 0, 2)])  # fmt: skip
    translator = Translator(masked, *tokenizers_from_checkpoint(load_checkpoint(ckpt), ckpt))
    sources = (corpus / "val.en").read_text().splitlines()
    expected = [t[0].text for t in translator.translate(sources, DecodeOptions(strategy="greedy"))]
    assert (tmp_path / "eval" / "hypotheses.txt").read_text().splitlines() == expected
    assert result["num_sentences"] == len(sources)
    evaluate(compose_eval_cfg([f"ckpt_path={pruned}", "split=val", "analysis=maps",
                       "analysis_options.sentences=4", "analysis_options.probes=1"],
                      tmp_path / "maps"))  # fmt: skip
    assert (tmp_path / "maps" / "attention" / "cross" / "layer1" / "probe0_reference.png").is_file()
    train(compose_cfg([*common, "trainer.max_steps=4", f"ckpt_path={pruned}"], tmp_path / "more"))
    resumed = load_checkpoint(tmp_path / "more" / "checkpoints" / "last.ckpt")
    assert resumed["global_step"] == 4
    assert resumed["hyper_parameters"]["model"]["heads_per_layer"]["cross"] == [4, 2]
    unpruned = ckpt
    for resumed_from, given in ((pruned, "[4,4]"), (unpruned, "[4,3]")):
        heads = f"model.heads_per_layer={{encoder_self:[4,4],decoder_self:[4,4],cross:{given}}}"
        with pytest.raises(ConfigError, match=r"model.heads_per_layer=.* differs from the heads"):
            train(compose_cfg([*common, "trainer.max_steps=4", f"ckpt_path={resumed_from}", heads],
                              tmp_path / "conflict"))  # fmt: skip


@pytest.mark.slow
def test_share_removes_the_heads_that_analysis_ranks_least_important(corpus, tmp_path) -> None:
    """``--share 0.25 --by gradient`` removes the quarter of all heads (6 of the tiny model's 24)
    with the lowest gradient importance that ``evaluate.py analysis=heads`` reports on the same
    sentences."""
    common = [*tiny_overrides(corpus), "validation.bleu_sentences=0", "~callbacks.best_checkpoint"]
    train(compose_cfg([*common, "trainer.max_steps=4"], tmp_path / "run"))
    ckpt, pruned = tmp_path / "run" / "checkpoints" / "last.ckpt", tmp_path / "pruned.ckpt"
    evaluate(compose_eval_cfg([f"ckpt_path={ckpt}", "split=val", "analysis=heads",
                       "analysis_options.importance=gradient", "analysis_options.sentences=8"],
                      tmp_path / "heads"))  # fmt: skip
    reported = json.loads((tmp_path / "heads" / "heads.json").read_text())["heads"]
    ranked = sorted(reported, key=lambda h: h["gradient"])
    expected = {(h["kind"], h["layer"], h["head"]) for h in ranked[:6]}
    main([str(ckpt), str(pruned), "--share", "0.25", "--by", "gradient", "--sentences", "8",
          "--data-root", str(corpus)])  # fmt: skip
    removed = {tuple(h) for h in load_checkpoint(pruned)["pruned_heads"][-1]}
    assert removed == expected
    counts = load_checkpoint(pruned)["hyper_parameters"]["model"]["heads_per_layer"]
    assert sum(map(sum, counts.values())) == 24 - 6
