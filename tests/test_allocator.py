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
