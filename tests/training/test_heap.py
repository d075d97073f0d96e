"""glibc's heap in a CPU training process: what a step frees stays for the next step."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.tiny import GLIBC_HEAP_PROBE, script_env, tiny_overrides

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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_cpu_training_process_keeps_the_blocks_its_steps_free(corpus, tmp_path):
    """After train() on CPU, blocks of 30 MiB come from the heap and stay there when freed
    (transformer/allocator.py): with glibc's defaults the loss's chunks of logits were given
    back to the kernel and faulted in again many times a step."""
    train_tiny = f"""
from hydra import compose, initialize_config_dir
from tests.tiny import CONFIGS
from transformer.training.run import train
with initialize_config_dir(str(CONFIGS), version_base="1.3"):
    cfg = compose("train", overrides=["paths.output_dir={tmp_path / "run"}",
                  *{tiny_overrides(corpus)!r}, "trainer.max_steps=2",
                  "trainer.limit_val_batches=0"])
train(cfg)
"""
    env = script_env(tmp_path)
    trained = subprocess.run(
        [sys.executable, "-c", TAKE_AND_FREE_THREE_30_MIB.format(train=train_tiny)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert trained.stdout.split() == ["0", "0"]  # none mapped, nothing given back
    plain = subprocess.run(
        [sys.executable, "-c", TAKE_AND_FREE_THREE_30_MIB.format(train="")],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert plain.stdout.split() != ["0", "0"]  # glibc's defaults: the comparison above can fail
