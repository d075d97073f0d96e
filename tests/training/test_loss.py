"""The fused projection + label-smoothed loss against torch's cross entropy on full logits: the
loss function alone (float32, bf16 autocast on CPU and CUDA) and the Lightning module's loss; the
fused R-Drop loss against cross entropy and KL divergence on full logits, and by hand; each
loss.kernel (the compiled chunks traced on CPU, every kernel on CUDA) and where each may run."""

from __future__ import annotations

import itertools
import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from tests.tiny import compose_cfg, logged, padded_batch, tiny_model_config, tiny_overrides
from transformer.training import TranslationModule, train
from transformer.training import loss as loss_module
from transformer.training.loss import label_smoothed_loss
from transformer.training.rdrop import rdrop_loss

PAD = 0


def inputs(seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """States (3, 7, 16), an output projection (50, 16), labels with right padding."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(3, 7, 16, generator=g)
    weight = torch.randn(50, 16, generator=g) / 4
    labels = torch.randint(1, 50, (3, 7), generator=g)
    labels[0, 5:] = PAD
    labels[2, 2:] = PAD
    return hidden, weight, labels


def reference(hidden, weight, labels, epsilon) -> tuple[Tensor, Tensor, Tensor]:
    logits = (hidden @ weight.T).flatten(0, 1).float()
    ce = lambda eps: F.cross_entropy(  # noqa: E731
        logits, labels.flatten(), ignore_index=PAD, label_smoothing=eps, reduction="sum"
    )
    return ce(epsilon), ce(0.0).detach(), labels.ne(PAD).sum()


def loss_and_grads(fn, hidden, weight, labels, epsilon):
    hidden = hidden.clone().requires_grad_()
    weight = weight.clone().requires_grad_()
    loss, nll, n = fn(hidden, weight, labels, epsilon)
    (loss / n).backward()
    return (loss, nll, n), (hidden.grad, weight.grad)


@pytest.mark.parametrize("chunk", [1 << 22, 150])  # one chunk; 3 rows a chunk (14 labels: 5)
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_equals_cross_entropy_on_full_logits(monkeypatch, chunk, epsilon):
    monkeypatch.setitem(loss_module.CHUNK_ELEMENTS, "cpu", chunk)
    args = (*inputs(), epsilon)
    got, got_grads = loss_and_grads(label_smoothed_loss_pad, *args)
    want, want_grads = loss_and_grads(reference, *args)
    assert int(got[2]) == 14
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    if epsilon == 0.0:
        torch.testing.assert_close(got[0], got[1])


def label_smoothed_loss_pad(hidden, weight, labels, epsilon, num_labels=None):
    return label_smoothed_loss(hidden, weight, labels, epsilon, PAD, num_labels)


def test_host_count_gives_the_same_result():
    hidden, weight, labels = inputs(1)
    a = label_smoothed_loss_pad(hidden, weight, labels, 0.1)
    b = label_smoothed_loss_pad(hidden, weight, labels, 0.1, num_labels=int(labels.ne(PAD).sum()))
    torch.testing.assert_close(a, b, rtol=0, atol=0)


CUDA = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("chunk", [1 << 26, 150])  # one chunk; 3 rows a chunk (vocabulary 50)
def test_bf16_autocast_within_bf16_rounding_of_float32(monkeypatch, device, chunk):
    monkeypatch.setitem(loss_module.CHUNK_ELEMENTS, device, chunk)
    hidden, weight, labels = inputs(2)
    want, want_grads = loss_and_grads(reference, hidden, weight, labels, 0.1)  # float32, CPU

    def under_autocast(*args):
        with torch.autocast(device, dtype=torch.bfloat16):
            return label_smoothed_loss_pad(*args)

    on_device = (t.to(device) for t in (hidden, weight, labels))
    got, got_grads = loss_and_grads(under_autocast, *on_device, 0.1)
    assert got[0].dtype == torch.float32 and got_grads[1].dtype == torch.float32
    torch.testing.assert_close(tuple(t.cpu() for t in got), want, rtol=2e-2, atol=0.1)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g.cpu(), w, rtol=5e-2, atol=5e-3)


def test_no_gradient_work_without_autograd():
    hidden, weight, labels = inputs(3)
    weight.requires_grad_()
    with torch.no_grad():
        loss, nll, n = label_smoothed_loss_pad(hidden, weight, labels, 0.1)
    assert not loss.requires_grad
    want = reference(hidden, weight.detach(), labels, 0.1)
    torch.testing.assert_close((loss, nll, n), want, rtol=1e-6, atol=1e-5)


def test_nll_carries_no_gradient_and_loss_scales_its_gradients():
    hidden, weight, labels = inputs(4)
    weight.requires_grad_()
    loss, nll, _ = label_smoothed_loss_pad(hidden, weight, labels, 0.1)
    assert not nll.requires_grad
    (3.0 * loss).backward()
    once = weight.grad.clone()
    weight.grad = None
    label_smoothed_loss_pad(hidden, weight, labels, 0.1)[0].backward()
    torch.testing.assert_close(once, 3.0 * weight.grad)


@pytest.mark.parametrize("options", [{}, {"output_bias": True}], ids=["no bias", "output bias"])
def test_training_loss_equals_cross_entropy_on_the_full_logits(options):
    """The module's loss (non-pad positions only, projection fused with the loss) gives the
    loss, NLL, count and every parameter's gradient of torch's cross entropy on (B, T, V)
    logits, tied embedding and the output projection's bias (``model.output_bias``) included."""
    module = TranslationModule(tiny_model_config(20, dropout=0.0, **options), label_smoothing=0.1)
    if module.model.output.bias is not None:
        torch.nn.init.normal_(module.model.output.bias)
    batch = padded_batch([(5, 2), (3, 9), (8, 4), (2, 6)])  # 25 labels in (4, 10): 15 are pad

    def loss_and_grads(loss_fn) -> tuple[list[Tensor], list[Tensor]]:
        module.zero_grad()
        loss, nll, n = loss_fn()
        (loss / n).backward()
        return [loss / n, nll / n, n.float()], [p.grad.clone() for p in module.parameters()]

    def full_logits():  # (B, T, V)
        logits = module(batch.src, batch.tgt_in, batch.src_pad_mask).flatten(0, 1)
        labels = batch.labels.flatten()
        ce = partial(F.cross_entropy, logits, labels, ignore_index=0, reduction="sum")
        return ce(label_smoothing=0.1), ce().detach(), labels.ne(0).sum()

    got, got_grads = loss_and_grads(lambda: module._loss(batch))
    want, want_grads = loss_and_grads(full_logits)
    assert batch.num_tgt_tokens == 25 and int(got[2]) == 25
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)


def rdrop_reference(hidden, weight, labels, epsilon, alpha):
    """R-Drop on full logits with torch's cross entropy and KL divergence: the two passes' mean
    cross entropy plus alpha / 2 times the mean of KL(p1 || p2) and KL(p2 || p1)."""
    logits = (hidden @ weight.T).flatten(1, 2).float()  # (2, B*T, V)
    flat, keep = labels.flatten(), labels.flatten().ne(PAD)
    ce = lambda k, eps: F.cross_entropy(  # noqa: E731
        logits[k], flat, ignore_index=PAD, label_smoothing=eps, reduction="sum"
    )
    lp = F.log_softmax(logits[:, keep], dim=-1)  # (2, N, V)
    kl = lambda a, b: F.kl_div(lp[b], lp[a], log_target=True, reduction="sum")  # noqa: E731
    loss = (ce(0, epsilon) + ce(1, epsilon)) / 2 + alpha / 2 * (kl(0, 1) + kl(1, 0)) / 2
    return loss, ((ce(0, 0.0) + ce(1, 0.0)) / 2).detach(), keep.sum()


@pytest.mark.parametrize("chunk", [1 << 22, 200])  # one chunk; 2 rows a chunk
@pytest.mark.parametrize("epsilon, alpha", [(0.0, 5.0), (0.1, 0.7)])
def test_rdrop_equals_cross_entropy_and_kl_on_full_logits(monkeypatch, chunk, epsilon, alpha):
    monkeypatch.setitem(loss_module.CHUNK_ELEMENTS, "cpu", chunk)
    hidden, weight, labels = inputs(5)
    hidden = torch.stack([hidden, hidden + 0.3 * torch.randn_like(hidden)])  # (2, 3, 7, 16)
    fused = partial(rdrop_loss, alpha=alpha, pad_id=PAD)
    got, got_grads = loss_and_grads(fused, hidden, weight, labels, epsilon)
    ref = partial(rdrop_reference, alpha=alpha)
    want, want_grads = loss_and_grads(ref, hidden, weight, labels, epsilon)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(got_grads, want_grads, rtol=1e-5, atol=1e-6)


def test_a_bias_adds_to_the_logits_of_both_losses_and_takes_their_gradient():
    """``bias`` (the output projection's, ``model.output_bias``): the losses of ``hidden @
    weight.T + bias`` against torch's on full logits, and the bias's gradient."""
    hidden, weight, labels = inputs(7)
    bias = torch.randn(50)
    # hidden @ [weight | bias].T over states with a 1 appended: the logits plus the bias
    ones = lambda x: torch.cat([x, torch.ones(*x.shape[:-1], 1)], -1)  # noqa: E731
    wide = torch.cat([weight, bias[:, None]], 1)
    for fused, ref, states in (
        (label_smoothed_loss, reference, hidden),
        (partial(rdrop_loss, alpha=0.7), partial(rdrop_reference, alpha=0.7),
         torch.stack([hidden, hidden / 2])),
    ):  # fmt: skip
        b = bias.clone().requires_grad_()
        got = fused(states, weight, labels, 0.1, pad_id=PAD, bias=b)
        got[0].backward()
        w = wide.clone().requires_grad_()
        want = ref(ones(states), w, labels, 0.1)
        want[0].backward()
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(b.grad, w.grad[:, -1], rtol=1e-5, atol=1e-6)


def test_rdrop_kl_term_by_hand():
    """Logits = states (identity projection): pass 1 uniform over 3 words, pass 2 (1/2, 1/4, 1/4);
    label 1 (0 is padding), no smoothing."""
    hidden = torch.tensor([[[[0.0, 0.0, 0.0]]], [[[math.log(2.0), 0.0, 0.0]]]])  # (2, 1, 1, 3)
    loss, nll, n = rdrop_loss(hidden, torch.eye(3), torch.tensor([[1]]), 0.0, 2.0, pad_id=PAD)
    kl_12 = (math.log(2 / 3) + 2 * math.log(4 / 3)) / 3  # sum p1 log(p1 / p2)
    kl_21 = 0.5 * math.log(3 / 2) + 0.5 * math.log(3 / 4)  # sum p2 log(p2 / p1)
    ce = (math.log(3) + math.log(4)) / 2  # -log p1(1), -log p2(1)
    assert float(nll) == pytest.approx(ce) and int(n) == 1
    assert float(loss) == pytest.approx(ce + 2.0 / 4 * (kl_12 + kl_21))


def test_rdrop_without_dropout_is_the_plain_loss():
    """Dropout 0: both passes are the same, their KL is zero, and the module's R-Drop loss and
    gradients are those of the plain loss."""
    module = TranslationModule(tiny_model_config(20, dropout=0.0), rdrop_alpha=5.0)
    batch = padded_batch([(5, 2), (3, 9), (8, 4)])

    def loss_and_grads(rdrop: bool):
        module.zero_grad()
        loss, nll, n = module._loss(batch, rdrop=rdrop)
        (loss / n).backward()
        return [loss, nll, n.float()], [p.grad.clone() for p in module.parameters()]

    got, got_grads = loss_and_grads(True)
    want, want_grads = loss_and_grads(False)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(got_grads, want_grads, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_training_with_rdrop_learns(corpus, tmp_path):
    """40 steps with R-Drop (alpha 5, dropout 0.1) against 40 without: its validation loss falls
    at every validation, and over the run by at least half as much as without R-Drop (a
    regulariser slows the fit of a tiny model; a wrong gradient would stop it)."""
    falls = {}
    for alpha in (0, 5):
        overrides = [
            *tiny_overrides(corpus),
            f"loss.rdrop_alpha={alpha}",
            "model.dropout=0.1",
            "trainer.max_steps=40",
            "trainer.val_check_interval=10",
            "trainer.check_val_every_n_epoch=null",
            "validation.bleu_sentences=0",
            "~callbacks.best_checkpoint",
        ]
        train(compose_cfg(overrides, tmp_path / str(alpha)))
        losses = logged(tmp_path / str(alpha), "val/loss")
        assert len(losses) == 4
        falls[alpha] = losses[0] - losses[-1]
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert falls[5] > 0.5 * falls[0] > 0, falls


def with_kernel(kernel: str):
    def loss(hidden, weight, labels, epsilon):
        return label_smoothed_loss(hidden, weight, labels, epsilon, PAD, kernel=kernel)

    return loss


def test_auto_runs_the_chunked_loss_on_cpu_and_compiles_nothing():
    """A CPU training step with the default loss.kernel (auto) runs this module's chunked loss,
    eagerly: the same operators, and no graph compiled."""
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    module = TranslationModule(tiny_model_config(20, dropout=0.0), label_smoothing=0.1)
    assert module.loss_kernel == "chunked"
    batch = padded_batch([(5, 2), (3, 9), (8, 4)])
    with Operators() as step:
        module._loss(batch)
    hidden = module.model(batch.src, batch.tgt_in, batch.src_pad_mask, return_hidden=True)
    with Operators() as chunked:
        weight = module.model.output.weight
        label_smoothed_loss(hidden, weight, batch.labels, 0.1, PAD, batch.num_tgt_tokens)
    assert step.names[-len(chunked.names) :] == chunked.names
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


class Operators(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_compiled_chunks_equal_cross_entropy_on_full_logits(monkeypatch, epsilon):
    """loss.kernel=compiled: the chunks' log-softmax, loss and gradient traced by torch.compile
    (here its aot_eager backend, which runs the traced graphs eagerly: on CUDA inductor turns the
    same graphs into kernels) give the reference loss and gradients, chunks of two lengths
    sharing one graph."""
    torch._dynamo.reset()
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    traced = torch.compile(loss_module._chunk_terms, dynamic=True, backend="aot_eager")
    monkeypatch.setattr(loss_module, "_compiled_terms", lambda: traced)
    monkeypatch.setitem(loss_module.CHUNK_ELEMENTS, "cpu", 150)  # 3 rows a chunk; 14 labels
    args = (*inputs(), epsilon)
    got, got_grads = loss_and_grads(with_kernel("compiled"), *args)
    want, want_grads = loss_and_grads(reference, *args)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - before
    assert graphs == 1, graphs  # one graph for the chunks of 3 rows and of 2


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kernel", ["chunked", "compiled", "liger"])
def test_cuda_kernels_equal_float32_cross_entropy_in_bf16(kernel):
    """Each loss.kernel on CUDA under bf16 autocast, against cross entropy on full float32
    logits (CPU): the loss, NLL (liger gives none), label count and gradients within bf16
    rounding, at a 6k vocabulary with padding and label smoothing."""
    if kernel == "liger":
        pytest.importorskip("liger_kernel", reason='Liger-Kernel: pip install -e ".[gpu]"')
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(8, 40, 64, generator=g)
    weight = torch.randn(6000, 64, generator=g) / 8
    labels = torch.randint(1, 6000, (8, 40), generator=g)
    labels[:, 30:] = PAD
    want, want_grads = loss_and_grads(reference, hidden, weight, labels, 0.1)

    def fused(*args):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return label_smoothed_loss(*args, PAD, kernel=kernel)

    on_gpu = (t.cuda() for t in (hidden, weight, labels))
    (loss, nll, n), grads = loss_and_grads(fused, *on_gpu, 0.1)
    assert int(n) == 240 and loss.dtype == torch.float32
    torch.testing.assert_close(loss.cpu(), want[0], rtol=1e-2, atol=0.5)
    if kernel == "liger":
        assert nll is None
    else:
        torch.testing.assert_close(nll.cpu(), want[1], rtol=1e-2, atol=0.5)
    for got, w in zip(grads, want_grads, strict=True):
        assert got.dtype == torch.float32  # the parameters' dtype
        assert (got.cpu() - w).norm() / w.norm() < 2e-2


def test_fused_kernels_are_refused_where_they_cannot_run(monkeypatch):
    from transformer.errors import ConfigError
    from transformer.training.config_checks import groups, validate_config

    cpu = compose_cfg(["trainer.accelerator=cpu", "loss.kernel=liger"])
    with pytest.raises(ConfigError, match=r"loss\.kernel=liger runs Liger-Kernel's Triton kernel"):
        validate_config(cpu)
    validate_config(compose_cfg(["trainer.accelerator=cpu", "loss.kernel=compiled"]))
    rdrop = compose_cfg(["loss.kernel=compiled", "loss.rdrop_alpha=5"])
    with pytest.raises(ConfigError, match=r"runs the chunked loss, not loss\.kernel=compiled"):
        validate_config(rdrop)
    monkeypatch.setattr(groups, "on_gpu", lambda trainer: True)
    monkeypatch.setattr(groups.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r'needs Liger-Kernel: pip install -e "\.\[gpu\]"'):
        validate_config(compose_cfg(["loss.kernel=liger"]))
    with pytest.raises(ValueError, match="R-Drop runs the chunked loss"):
        TranslationModule(tiny_model_config(20), rdrop_alpha=5.0, loss_kernel="compiled")
