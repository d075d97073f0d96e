"""A CPU training process's memory: what a step frees stays for the next step (glibc's heap), and
the kernels of shapes gone by do not pile up (oneDNN's kernel caches)."""

from __future__ import annotations

import sys

import pytest

from tests.tiny import (
    GLIBC_HEAP_PROBE,
    heap_held_by_new_shapes,
    run_python,
    script_env,
    tiny_overrides,
)
from transformer.linear import ONEDNN

pytestmark = pytest.mark.slow  # each test trains in a process of its own

# Three 30 MiB blocks taken and freed: prints how many of them glibc mapped for themselves (the
# kernel's pages, faulted in again at every use) and how many bytes the heap gave back when they
# were freed. glibc's defaults do one or the other to blocks of this size: below its mmap
# threshold (at most 32 MiB) they come from the heap, whose top is given back once more than
# twice that threshold lies free.
TAKE_AND_FREE_THREE_30_MIB = (
    GLIBC_HEAP_PROBE
    + """
{train}
mapped = libc.mallinfo2().hblks
blocks = [libc.malloc(30 << 20) for _ in range(3)]
taken = libc.mallinfo2()
for block in blocks:
    libc.free(block)
print(taken.hblks - mapped, taken.arena - libc.mallinfo2().arena)
"""
)


def train_tiny(corpus, tmp_path) -> str:
    """A script's lines that train the tiny model for two steps on CPU, as train.py does."""
    return f"""
from hydra import compose, initialize_config_dir
from tests.tiny import CONFIGS
from transformer.training.run import train
with initialize_config_dir(str(CONFIGS), version_base="1.3"):
    cfg = compose("train", overrides=["paths.output_dir={tmp_path / "run"}",
                  *{tiny_overrides(corpus)!r}, "trainer.max_steps=2",
                  "trainer.limit_val_batches=0"])
train(cfg)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_cpu_training_process_keeps_the_blocks_its_steps_free(corpus, tmp_path):
    """After train() on CPU, blocks of 30 MiB come from the heap and stay there when freed
    (transformer/allocator.py): with glibc's defaults the loss's chunks of logits were given
    back to the kernel and faulted in again many times a step."""
    env = script_env(tmp_path)
    script = TAKE_AND_FREE_THREE_30_MIB.format(train=train_tiny(corpus, tmp_path))
    trained = run_python(script, env, timeout=120)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert trained.stdout.split() == ["0", "0"]  # none mapped, nothing given back
    plain = run_python(TAKE_AND_FREE_THREE_30_MIB.format(train=""), env, timeout=60)
    assert plain.stdout.split() != ["0", "0"]  # glibc's defaults: the comparison above can fail


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
@pytest.mark.skipif(not ONEDNN, reason="no oneDNN linear kernel in this PyTorch build")
def test_a_cpu_training_process_keeps_the_kernels_of_few_shapes(corpus, tmp_path):
    """After train(), products of shapes not seen before hold no more memory once the kernel
    caches are full (transformer/allocator.py: 64 kernels each): PyTorch's default of 1024 kept
    about half a MiB for every new shape, which token-budget batches bring at almost every step."""
    trained, plain = heap_held_by_new_shapes(train_tiny(corpus, tmp_path), tmp_path)
    assert trained < 4  # MiB: the caches hold what they held
    assert plain > 40  # PyTorch's caches: the comparison above can fail
