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


LEVEL_ONE = "/sys/devices/system/cpu/cpu0/cache/index0"


@pytest.mark.skipif(not (sys.platform.startswith("linux") and os.path.isfile(f"{LEVEL_ONE}/size")),
                    reason="Linux's cache directory does not give a first cache's size here")
def test_this_machines_first_cache_is_in_every_record():
    with open(f"{LEVEL_ONE}/size") as size, open(f"{LEVEL_ONE}/level") as level:
        kib, first_level = size.read().strip(), level.read().strip()
    caches = provenance.collect(seed=0)["cpu_caches"]
    assert f"{kib[:-1]}K" == kib and first_level == "1"  # Linux writes "48K"
    assert int(kib[:-1]) * 1024 in {v for k, v in caches.items() if k.startswith("L1")}, caches


X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu sse2 avx avx2 fma f16c avx512f avx512_bf16 avx512_vp2intersect

processor\t: 1
vendor_id\t: GenuineIntel
cpu family\t: 6
model name\t: Other
flags\t\t: avx512_fp16
"""

ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd asimdhp fphp
CPU implementer\t: 0x41
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1
"""


@pytest.mark.parametrize("text,identity,flags,model", [
    (X86, {"vendor": "AuthenticAMD", "family": "26", "model": "2", "stepping": "1"},
     ["avx", "avx2", "fma", "f16c", "avx512f", "avx512_bf16"], "AMD EPYC"),
    (ARM, {"implementer": "0x41", "part": "0xd0c", "variant": "0x3", "revision": "1"}, ["asimdhp", "fphp"], None),
])
def test_the_first_processor_is_read_for_identity_flags_and_name(tmp_path, text, identity, flags, model):
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    assert provenance.cpu_identity(str(path)) == identity  # the second processor's fields are not mixed in
    assert provenance.cpu_flags(str(path)) == flags
    assert provenance.cpu_model(str(path)) == (model or provenance.cpu_model(str(tmp_path / "missing")))
    assert provenance.cpu_identity(str(tmp_path / "missing")) == {} and provenance.cpu_flags(str(tmp_path / "missing")) == []
