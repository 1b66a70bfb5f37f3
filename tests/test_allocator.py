"""glibc is asked to keep freed blocks for reuse while training, and to return them after, or at once where the heap
cannot reuse them; elsewhere nothing changes."""

import platform

import pytest
import torch

from decode import allocator

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_glibc_takes_the_thresholds_and_other_platforms_are_left_alone(monkeypatch):
    with allocator.freed_memory_reused() as taken:
        assert taken is GLIBC
    monkeypatch.setattr(allocator.platform, "system", lambda: "Darwin")
    with allocator.freed_memory_reused() as taken:
        assert taken is False


@pytest.mark.skipif(not GLIBC, reason="glibc's allocator")
def test_a_block_freed_within_stays_resident_until_the_end_and_is_returned_then():
    with allocator.freed_memory_reused():
        before = resident_bytes()
        block = torch.ones(50_000_000)  # 200 MB from the heap, not a mapping of its own
        del block
        kept = resident_bytes()
    assert kept - before > 150e6  # kept for the next step's tensors
    assert kept - resident_bytes() > 150e6


@pytest.mark.skipif(not GLIBC, reason="glibc's allocator")
def test_free_blocks_inside_the_heap_are_given_back_to_the_kernel():
    with allocator.freed_memory_reused():  # the 200 MB block comes from the heap
        before = resident_bytes()
        block = torch.ones(50_000_000)
        pinned = torch.ones(1000)  # allocated after it: the heap cannot shrink past it
        del block
        held = resident_bytes()
        allocator.return_freed_memory()
        returned = resident_bytes()
        del pinned
    assert held - before > 150e6
    assert held - returned > 150e6


@pytest.mark.skipif(platform.system() != "Linux", reason="Linux's madvise")
def test_the_pages_of_mapped_weights_are_given_back_and_read_again_unchanged(tmp_path):
    from safetensors.torch import load_file, save_file

    save_file({"weight": torch.arange(50_000_000, dtype=torch.float32)}, tmp_path / "model.safetensors")
    weight = load_file(tmp_path / "model.safetensors")["weight"]  # mapped, not copied
    before = resident_bytes()
    checksum = float(weight.sum())  # every page read
    touched = resident_bytes()
    advised = allocator.page_out_mapped_weights()
    after = resident_bytes()
    assert touched - before > 150e6 and advised >= 200e6
    assert touched - after > 150e6
    assert float(weight.sum()) == checksum
