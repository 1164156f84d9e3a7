"""Replay real tensor-core outputs through convprobe's GPU presets, bit for bit.

A data directory holds ``GPU/FORMAT/`` folders in the layout of Khattak & Mikaitis's
model-validation data (see `convprobe/data/TENSOR_CORE_VALIDATION.md`): per vector, the
K inputs a_k and b_k (binary32 hex words), the accumulator input c and the GPU's
output d (binary32 bit strings), d for fp32 output and, in some sets, for fp16 output
(the fp16 result widened to binary32). Each (GPU, input, output) set is run through the
matching preset of `convprobe.emulation.gpus` and compared bit for bit.

The bundled copy (`convprobe/data/tensor_core_validation.npz`, uint32 bit patterns,
read without pickle) holds the same vectors, so `replay` needs no other files.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from importlib import resources

import numpy as np

from convprobe import files
from convprobe.emulation import dot, parse_model
from convprobe.emulation.gpus import GPU_FAMILIES, GPU_PRESETS
from convprobe.emulation.rounding import round_to_format
from convprobe.errors import InvalidArgument, invalid_choice
from convprobe.progress import tracker

__all__ = ["VectorSet", "FORMAT_FOLDERS", "load_directory", "load_bundled", "bundled_path",
           "replay_set", "replay"]

# folder name (case-insensitive) -> convprobe input format
FORMAT_FOLDERS = {"fp16": "fp16", "bf16": "bf16", "tf32": "tf32", "e4m3": "fp8_e4m3",
                  "e5m2": "fp8_e5m2"}
_OUTPUTS = ("fp32", "fp16")
BUNDLED = "tensor_core_validation.npz"


@dataclass(frozen=True)
class VectorSet:
    """One (GPU, input format, output format) set of real MMA vectors, as uint32 bits."""

    gpu: str  # the folder's name, as given
    preset: str  # the GPU preset it maps to
    input: str
    output: str
    a: np.ndarray  # (vectors, K)
    b: np.ndarray
    c: np.ndarray  # (vectors,)
    d: np.ndarray

    @property
    def vectors(self) -> int:
        return int(self.d.shape[0])


def _preset_of(folder: str) -> str:
    key = folder.strip().lower()
    if key not in GPU_PRESETS:
        raise invalid_choice(f"GPU folder {folder!r}", folder, GPU_PRESETS)
    return key


def _format_of(gpu: str, folder: str) -> str:
    key = folder.strip().lower()
    if key not in FORMAT_FOLDERS:
        raise invalid_choice(f"format folder {gpu}/{folder}", folder, list(FORMAT_FOLDERS))
    return FORMAT_FOLDERS[key]


def _hex_word(word: str) -> int:
    if len(word) != 8 or any(ch not in "0123456789abcdefABCDEF" for ch in word):
        raise ValueError(word)
    return int(word, 16)


def _read_hex(path: str) -> np.ndarray:
    try:
        with open(path, encoding="ascii") as handle:
            rows = [[_hex_word(word) for word in line.split()] for line in handle if line.strip()]
        out = np.array(rows, dtype=np.uint32)
    except OSError as exc:
        raise InvalidArgument(f"{path} cannot be read ({exc.strerror})") from None
    except (ValueError, OverflowError, UnicodeDecodeError):
        raise InvalidArgument(f"{path} must hold lines of 8-digit hex words, the same count on "
                              f"every line") from None
    if out.ndim != 2:
        raise InvalidArgument(f"{path} must hold the same number of hex words on every line")
    return out


def _read_bits(path: str) -> np.ndarray:
    try:
        with open(path, encoding="ascii") as handle:
            lines = [line.strip() for line in handle if line.strip()]
        if any(len(line) != 32 or set(line) - {"0", "1"} for line in lines):
            raise ValueError
        return np.array([int(line, 2) for line in lines], dtype=np.uint32)
    except OSError as exc:
        raise InvalidArgument(f"{path} cannot be read ({exc.strerror})") from None
    except (ValueError, UnicodeDecodeError):
        raise InvalidArgument(f"{path} must hold one 32-character 0/1 bit string per line") from None


def _one_set(gpu, preset, fmt, output, a, b, c, d, where) -> VectorSet:
    n = d.shape[0]
    if a.shape != b.shape or a.shape[0] != n or c.shape[0] != n:
        raise InvalidArgument(f"{where}: a, b, c and d must describe the same vectors; received "
                              f"{a.shape[0]}, {b.shape[0]}, {c.shape[0]} and {n} rows, K "
                              f"{a.shape[1:]} and {b.shape[1:]}")
    return VectorSet(gpu, preset, fmt, output, a, b, c, d)


def load_directory(root: str, gpus: list[str] | None = None) -> list[VectorSet]:
    """Every set under `root` (``GPU/FORMAT/{a,b}_GPU_FORMAT.txt``, ``c_GPU_fp32.txt``,
    ``d_GPU_{fp32,fp16}.txt``), optionally only the GPU folders named in `gpus`."""
    if not os.path.isdir(root):
        raise InvalidArgument(f"--data must be a directory of GPU/FORMAT folders; received "
                              f"{root!r}")
    wanted = None if gpus is None else {g.lower() for g in gpus}
    sets = []
    for gpu in sorted(e for e in _listdir(root) if os.path.isdir(os.path.join(root, e))
                      and not e.startswith(".")):
        if wanted is not None and gpu.lower() not in wanted and not (
                gpu.lower() in _presets() and _preset_of(gpu) in wanted):
            continue  # not asked for: neither read nor judged
        preset = _preset_of(gpu)
        for folder in sorted(_listdir(os.path.join(root, gpu))):
            where = os.path.join(root, gpu, folder)
            if not os.path.isdir(where) or folder.startswith("."):
                continue
            fmt = _format_of(gpu, folder)

            def path(stem: str) -> str:
                return os.path.join(where, f"{stem}_{gpu}_{folder}.txt")

            need = [path("a"), path("b"), os.path.join(where, f"c_{gpu}_fp32.txt")]
            missing = [p for p in need if not os.path.isfile(p)]
            if missing:
                raise InvalidArgument(f"{where} lacks {', '.join(os.path.basename(p) for p in missing)}")
            a, b, c = _read_hex(need[0]), _read_hex(need[1]), _read_bits(need[2])
            outputs = [o for o in _OUTPUTS if os.path.isfile(os.path.join(where, f"d_{gpu}_{o}.txt"))]
            if not outputs:
                raise InvalidArgument(f"{where} has no d_{gpu}_fp32.txt or d_{gpu}_fp16.txt")
            for out in outputs:
                d = _read_bits(os.path.join(where, f"d_{gpu}_{out}.txt"))
                sets.append(_one_set(gpu, preset, fmt, out, a, b, c, d, where))
    if not sets:
        raise InvalidArgument(f"no vector sets found under {root!r}" +
                              (f" for --gpu {','.join(gpus)}" if gpus else ""))
    _check_every_name_matched(gpus, sets)
    return sets


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError as exc:
        raise InvalidArgument(f"{path} cannot be listed ({exc.strerror})") from None


def _presets() -> tuple[str, ...]:
    return GPU_PRESETS


def _check_every_name_matched(gpus: list[str] | None, sets: list[VectorSet]) -> None:
    """A --gpu name that selects nothing is a typo: say so rather than replay less."""
    for name in gpus or []:
        key = name.lower()
        if not any(key in (s.gpu.lower(), s.preset) for s in sets):
            raise InvalidArgument(f"--gpu {name!r} matches no GPU folder or preset of this data")


def bundled_path() -> str:
    return str(resources.files("convprobe.data") / BUNDLED)


def save_bundle(sets: list[VectorSet], path: str) -> None:
    """Write `sets` as one compressed .npz of uint32 arrays (no pickled objects)."""
    arrays: dict[str, np.ndarray] = {}
    for s in sets:
        stem = f"{s.gpu}/{s.input}/"
        arrays[stem + "a"], arrays[stem + "b"], arrays[stem + "c"] = s.a, s.b, s.c
        arrays[stem + f"d_{s.output}"] = s.d
    buffer = io.BytesIO()
    # allow_pickle named (its default) so that no key of `arrays` can be taken for it
    np.savez_compressed(buffer, allow_pickle=True, **arrays)
    files.write_atomic(path, buffer.getvalue())


def load_bundled(gpus: list[str] | None = None, path: str | None = None) -> list[VectorSet]:
    """The bundled sets (every vector of the source data's 30 sets)."""
    wanted = None if gpus is None else {g.lower() for g in gpus}
    sets = []
    with np.load(path or bundled_path(), allow_pickle=False) as data:
        names = sorted({k.rsplit("/", 1)[0] for k in data.files})
        for stem in names:
            gpu, fmt = stem.split("/")
            preset = _preset_of(gpu)
            if wanted is not None and gpu.lower() not in wanted and preset not in wanted:
                continue
            for out in _OUTPUTS:
                if f"{stem}/d_{out}" in data.files:
                    sets.append(VectorSet(gpu, preset, fmt, out, data[f"{stem}/a"],
                                          data[f"{stem}/b"], data[f"{stem}/c"],
                                          data[f"{stem}/d_{out}"]))
    if not sets:
        raise InvalidArgument(f"no bundled vector sets for --gpu {','.join(gpus or [])}")
    _check_every_name_matched(gpus, sets)
    return sets


def c_is_zero(s: VectorSet) -> bool:
    """The H100 fp8 sets with fp32 output were captured with wgmma, whose c is zero: the
    data's README says to ignore the c file there."""
    return GPU_FAMILIES[s.preset] == "hopper" and s.input.startswith("fp8") and s.output == "fp32"


def _hex(bits: int) -> str:
    return f"0x{int(bits):08x}"


def replay_set(s: VectorSet) -> dict:
    """Run one set through its preset; a row with the counts and the first mismatch."""
    spec = f"{s.preset}:in={s.input}:out={s.output}"
    model = parse_model(spec)
    a = s.a.view(np.float32).astype(np.float64)
    b = s.b.view(np.float32).astype(np.float64)
    c = np.zeros(s.vectors) if c_is_zero(s) else s.c.view(np.float32).astype(np.float64)
    d = dot(a, b, model, c=c)
    got = np.asarray(d, dtype=np.float32).view(np.uint32)  # fp16 results widen exactly
    same = got == s.d
    row = {"gpu": s.gpu, "input": s.input, "output": s.output, "model": spec,
           "vectors": s.vectors, "matches": int(same.sum()),
           "k": int(s.a.shape[1]), "first_mismatch": None}
    if not same.all():
        i = int(np.flatnonzero(~same)[0])
        row["first_mismatch"] = {"index": i, "model": _hex(got[i]), "hardware": _hex(s.d[i])}
    return row


def check_set(s: VectorSet) -> None:
    """Refuse, before anything runs, inputs that are not numbers of the set's format."""
    for name, bits in (("a", s.a), ("b", s.b)):
        values = bits.view(np.float32).astype(np.float64)
        finite = values[np.isfinite(values)]
        if finite.size and not np.array_equal(round_to_format(finite, s.input), finite):
            raise InvalidArgument(f"{s.gpu}/{s.input}: {name} holds values that are not {s.input} "
                                  f"numbers (the folder names the input format)")


def replay(sets: list[VectorSet]) -> list[dict]:
    """`replay_set` for each set, in order, after every set's inputs are checked."""
    for s in sets:
        check_set(s)
    rows = []
    with tracker(len(sets), "replay: vector sets") as advance:
        for s in sets:
            rows.append(replay_set(s))
            advance(f"{s.gpu} {s.input}->{s.output}")
    return rows
