"""The allocator tuning applies on glibc and can be switched off."""
import platform as stdlib_platform

import pytest

from attnlab.cli.runtime import tune_allocator


@pytest.mark.skipif(stdlib_platform.system() != "Linux" or stdlib_platform.libc_ver()[0] != "glibc",
                    reason="mallopt thresholds exist only in glibc")
def test_allocator_tuning_applies_on_glibc_and_respects_the_opt_out(monkeypatch):
    monkeypatch.delenv("ATTNLAB_KEEP_MALLOC", raising=False)
    assert tune_allocator() is True
    monkeypatch.setenv("ATTNLAB_KEEP_MALLOC", "1")
    assert tune_allocator() is False
