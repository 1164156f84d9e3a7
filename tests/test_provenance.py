"""Provenance: the machine facts a measured model depends on."""

import os
import sys

import pytest

from convprobe import provenance


def _cache(root, index, level, kind, size):
    entry = root / f"index{index}"
    entry.mkdir()
    for name, value in (("level", level), ("type", kind), ("size", size)):
        (entry / name).write_text(f"{value}\n")


def test_cache_sizes_are_read_as_bytes_by_level_and_kind(tmp_path):
    _cache(tmp_path, 0, 1, "Data", "48K")
    _cache(tmp_path, 1, 1, "Instruction", "32K")
    _cache(tmp_path, 2, 2, "Unified", "1024K")
    _cache(tmp_path, 3, 3, "Unified", "32M")
    assert provenance.cpu_caches(str(tmp_path)) == {"L1d": 48 * 1024, "L1i": 32 * 1024, "L2": 2 ** 20, "L3": 32 * 2 ** 20}


def test_an_entry_the_system_describes_otherwise_is_left_out(tmp_path):
    _cache(tmp_path, 0, 1, "Data", "48K")
    _cache(tmp_path, 1, 2, "Trace", "12K")  # a kind with no name here
    _cache(tmp_path, 2, 3, "Unified", "")  # no size
    (tmp_path / "index3").mkdir()  # no files
    assert provenance.cpu_caches(str(tmp_path)) == {"L1d": 48 * 1024}
    assert provenance.cpu_caches(str(tmp_path / "missing")) == {}


@pytest.mark.skipif(not (sys.platform.startswith("linux") and os.path.isdir("/sys/devices/system/cpu/cpu0/cache")),
                    reason="Linux's cache directory is not here")
def test_this_machines_caches_are_in_every_record():
    record = provenance.collect(seed=0)
    assert record["cpu_caches"] == provenance.cpu_caches() and record["cpu_caches"]
    assert all(size > 0 for size in record["cpu_caches"].values())
