"""A tiny model must actually learn: sequence reversal, decoded greedily through the KV cache."""

import pytest
import torch
import torch.nn.functional as F

from tests.tiny import tiny_model
from transformer import Transformer

PAD, BOS, EOS, V = 0, 2, 3, 14  # symbols 4..13


def reversal_batch(n: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Sources of 3-8 random symbols, right-padded; targets are the sources reversed."""
    lengths = torch.randint(3, 9, (n,), generator=generator)
    src = torch.full((n, 8), PAD)
    tgt = torch.full((n, 10), PAD)  # bos + 8 + eos
    for i, length in enumerate(lengths.tolist()):
        seq = torch.randint(4, V, (length,), generator=generator)
        src[i, :length] = seq
        tgt[i, : length + 2] = torch.cat([torch.tensor([BOS]), seq.flip(0), torch.tensor([EOS])])
    return src, tgt[:, :-1], tgt[:, 1:]  # source, decoder input, labels


@torch.no_grad()
def greedy(model: Transformer, src: torch.Tensor, max_len: int) -> torch.Tensor:
    cache = model.init_cache(model.encode(src), src.eq(PAD))
    out = torch.full((src.size(0), 1), BOS)
    for _ in range(max_len):
        logits = model.decode(out[:, -1:], cache=cache)  # (B, 1, V)
        out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], 1)
    return out[:, 1:]


def reversing_model(steps: int) -> Transformer:
    """The tiny model after ``steps`` updates of learning to reverse sequences, in eval mode."""
    torch.manual_seed(0)
    model = tiny_model(V, d_model=64, d_ff=128, dropout=0.0, share_all_embeddings=True).train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        src, tgt_in, labels = reversal_batch(64, gen)
        logits = model(src, tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.mark.slow
def test_tiny_model_learns_to_reverse() -> None:
    model = reversing_model(300)
    src, _, labels = reversal_batch(256, torch.Generator().manual_seed(1))  # unseen sequences
    hyp = greedy(model, src, labels.size(1))
    real = labels.ne(PAD)
    accuracy = (hyp == labels)[real].float().mean().item()
    assert accuracy >= 0.95, f"token accuracy {accuracy:.3f} after 300 steps"
