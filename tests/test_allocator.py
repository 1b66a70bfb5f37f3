"""glibc is asked to keep freed blocks for reuse; elsewhere nothing changes."""

import platform

from decode import allocator


def test_glibc_takes_the_thresholds_and_other_platforms_are_left_alone(monkeypatch):
    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert allocator.reuse_freed_memory() is glibc
    monkeypatch.setattr(allocator.platform, "system", lambda: "Darwin")
    assert allocator.reuse_freed_memory() is False
