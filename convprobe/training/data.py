"""Training data as a pure function of (seed, step): synthetic, digits and CIFAR-10.

A batch depends only on the seed and the step number, never on iterator state,
so a resumed run sees exactly the batches it would have seen, and an fp32 run
and an fp16 run with the same seed see the same images. NumPy only.

The CIFAR-10 loader reads the *binary* distribution (`data_batch_N.bin`,
`test_batch.bin`: records of 1 label byte + 3072 pixel bytes, channel-major
R, G, B planes of 32x32; https://www.cs.toronto.edu/~kriz/cifar.html). It never
unpickles anything, and it rejects a truncated or corrupt file naming it.

The digits are real data that ship with convprobe (`convprobe/data/digits.npz`,
uint8 arrays read with `allow_pickle=False`; source and licences in DIGITS.md and
DIGITS_LICENCE beside it): the 1797 8x8 handwritten digits scikit-learn distributes
(UCI "Optical Recognition of Handwritten Digits", Alpaydin & Kaynak 1998), pixels 0..16.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from convprobe import files
from convprobe.errors import InvalidArgument

__all__ = [
    "CIFAR_RECORD_BYTES",
    "CIFAR_IMAGE_SIZE",
    "Batches",
    "SyntheticData",
    "CifarData",
    "DigitsData",
    "DIGITS_IMAGE_SIZE",
    "DIGITS_EVAL_PER_CLASS",
    "load_digits",
    "load_cifar10_file",
    "load_cifar10_dir",
    "write_cifar10_file",
    "make_data",
]

CIFAR_IMAGE_SIZE = 32
CIFAR_RECORD_BYTES = 1 + 3 * CIFAR_IMAGE_SIZE * CIFAR_IMAGE_SIZE  # 3073
# Per-channel statistics of the CIFAR-10 training set (commonly quoted values).
_CIFAR_MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)
_CIFAR_STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)

DIGITS_IMAGE_SIZE = 8
DIGITS_FILE = "digits.npz"
#: Images per class held out for evaluation (500 of 1797; the other 1297 train).
DIGITS_EVAL_PER_CLASS = 50
#: The split's own seed, derived from its name so that it never changes with --seed.
_DIGITS_SPLIT_SEED = int.from_bytes(hashlib.sha256(b"convprobe digits split").digest()[:8], "little")

# Streams of the seeded generator: (seed, stream, step).
_TRAIN, _EVAL, _PROTOTYPES = 0, 1, 2


class Batches:
    """Interface: `batch(step, size)` -> (images NHWC float32, labels int32)."""

    num_classes: int = 10
    image_size: int = 32

    def batch(self, step: int, size: int) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover
        raise NotImplementedError

    def eval_batch(self, index: int, size: int) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover
        raise NotImplementedError


@dataclass
class SyntheticData(Batches):
    """A learnable synthetic task: one smooth random prototype image per class
    plus Gaussian pixel noise of standard deviation `noise` (prototypes have unit
    standard deviation). Nearest-prototype is the Bayes classifier, so accuracy
    well above chance means the network learned something; the noise makes the
    task not trivial.
    """

    seed: int = 0
    image_size: int = 32
    num_classes: int = 10
    noise: float = 1.0

    def __post_init__(self) -> None:
        rng = np.random.default_rng([self.seed, _PROTOTYPES])
        coarse = max(2, self.image_size // 4)
        low = rng.standard_normal((self.num_classes, coarse, coarse, 3))
        reps = -(-self.image_size // coarse)
        up = np.repeat(np.repeat(low, reps, axis=1), reps, axis=2)[:, : self.image_size, : self.image_size]
        up = up - up.mean(axis=(1, 2, 3), keepdims=True)
        up /= up.std(axis=(1, 2, 3), keepdims=True)
        self.prototypes = up.astype(np.float32)

    def _draw(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        labels = rng.integers(0, self.num_classes, size=size)
        noise = rng.standard_normal((size, self.image_size, self.image_size, 3), dtype=np.float32)
        images = self.prototypes[labels] + np.float32(self.noise) * noise
        return images.astype(np.float32), labels.astype(np.int32)

    def batch(self, step: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        return self._draw(np.random.default_rng([self.seed, _TRAIN, step]), size)

    def eval_batch(self, index: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        return self._draw(np.random.default_rng([self.seed, _EVAL, index]), size)


def write_cifar10_file(path: str | Path, images: np.ndarray, labels: np.ndarray) -> None:
    """Write uint8 NHWC 32x32x3 images and labels in CIFAR-10 binary format (for tests)."""
    images = np.asarray(images, dtype=np.uint8)
    labels = np.asarray(labels, dtype=np.uint8)
    planes = images.transpose(0, 3, 1, 2).reshape(len(images), -1)  # R plane, G plane, B plane
    records = np.concatenate([labels[:, None], planes], axis=1)
    Path(path).write_bytes(records.tobytes())


def load_cifar10_file(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 binary file -> (uint8 images N x 32 x 32 x 3, int32 labels)."""
    path = files.check_input_file(path, f"CIFAR-10 file '{path}'")  # a FIFO would block the read
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except OSError as error:
        raise InvalidArgument(f"CIFAR-10 file '{path}' cannot be read: {error.strerror}") from None
    if raw.size % CIFAR_RECORD_BYTES:
        raise InvalidArgument(
            f"CIFAR-10 file '{path}' is truncated or not CIFAR-10 binary: {raw.size} bytes is not "
            f"a multiple of the {CIFAR_RECORD_BYTES}-byte record"
        )
    records = raw.reshape(-1, CIFAR_RECORD_BYTES)
    labels = records[:, 0].astype(np.int32)
    if labels.max() >= 10:
        bad = int(np.argmax(labels >= 10))
        raise InvalidArgument(
            f"CIFAR-10 file '{path}' is corrupt: record {bad} has label {labels[bad]}, labels must be 0..9"
        )
    images = records[:, 1:].reshape(-1, 3, CIFAR_IMAGE_SIZE, CIFAR_IMAGE_SIZE).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels


def load_cifar10_dir(directory: str | Path) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray] | None]:
    """Train (`data_batch_*.bin`) and test (`test_batch.bin`, if present) splits.

    Accepts the directory itself or its parent holding `cifar-10-batches-bin/`.
    """
    directory = Path(directory)
    if (directory / "cifar-10-batches-bin").is_dir():
        directory = directory / "cifar-10-batches-bin"
    if not directory.is_dir():
        raise InvalidArgument(f"data_dir must be a directory of CIFAR-10 .bin files; received '{directory}'")
    train_files = sorted(directory.glob("data_batch_*.bin"))
    if not train_files:
        raise InvalidArgument(
            f"data_dir must contain CIFAR-10 binary files data_batch_1.bin ... data_batch_5.bin; "
            f"none found in '{directory}'"
        )
    parts = [load_cifar10_file(f) for f in train_files]
    train = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    test_file = directory / "test_batch.bin"
    test = load_cifar10_file(test_file) if test_file.exists() else None
    return train, test


class CifarData(Batches):
    """CIFAR-10 batches: a seeded permutation per epoch, random 4-pixel-padded crops
    and horizontal flips (the reference ResNet's augmentation), per-channel
    standardisation. Batch `step` depends only on (seed, step)."""

    num_classes = 10
    image_size = CIFAR_IMAGE_SIZE

    def __init__(self, directory: str | Path, seed: int = 0):
        (self.images, self.labels), test = load_cifar10_dir(directory)
        self.test = test if test is not None else (self.images, self.labels)
        self.seed = seed

    @staticmethod
    def _standardise(images: np.ndarray) -> np.ndarray:
        return ((images.astype(np.float32) / 255.0) - _CIFAR_MEAN) / _CIFAR_STD

    def batch(self, step: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        n = len(self.labels)
        start = step * size
        idx = np.empty(size, dtype=np.int64)
        for k in range(size):  # batches may straddle an epoch boundary
            epoch, pos = divmod(start + k, n)
            if k == 0 or pos == 0:
                perm = np.random.default_rng([self.seed, _TRAIN, epoch]).permutation(n)
            idx[k] = perm[pos]
        rng = np.random.default_rng([self.seed, _TRAIN, step, 1])
        padded = np.pad(self.images[idx], ((0, 0), (4, 4), (4, 4), (0, 0)), mode="constant")
        dy, dx = rng.integers(0, 9, size=(2, size))
        flip = rng.random(size) < 0.5
        out = np.empty((size, 32, 32, 3), dtype=np.uint8)
        for k in range(size):
            crop = padded[k, dy[k]: dy[k] + 32, dx[k]: dx[k] + 32]
            out[k] = crop[:, ::-1] if flip[k] else crop
        return self._standardise(out), self.labels[idx]

    def eval_batch(self, index: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        images, labels = self.test
        idx = (np.arange(size) + index * size) % len(labels)
        return self._standardise(images[idx]), labels[idx]


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """The bundled digits: (uint8 images 1797 x 8 x 8, pixels 0..16; uint8 labels 0..9)."""
    with resources.as_file(resources.files("convprobe.data") / DIGITS_FILE) as path:
        with np.load(path, allow_pickle=False) as archive:
            return archive["images"], archive["labels"]


def _epoch_order(n: int, seed: int, start: int, size: int) -> np.ndarray:
    """Indices start .. start+size-1 of the concatenated per-epoch permutations of range(n),
    epoch e's permutation seeded by (seed, e): a pure function of its arguments."""
    idx = np.empty(size, dtype=np.int64)
    for k in range(size):  # batches may straddle an epoch boundary
        epoch, pos = divmod(start + k, n)
        if k == 0 or pos == 0:
            perm = np.random.default_rng([seed, _TRAIN, epoch]).permutation(n)
        idx[k] = perm[pos]
    return idx


class DigitsData(Batches):
    """The bundled 8x8 handwritten digits, 10 classes.

    Split (fixed, the same for every seed): per class, a permutation seeded by the
    split's name puts `DIGITS_EVAL_PER_CLASS` (50) images into the evaluation split,
    500 in all, in one fixed order; the other 1297 train. Training batch `step` is
    images step*size ... of the concatenated per-epoch permutations seeded by
    (seed, epoch), so it depends only on (seed, step); no augmentation. Evaluation
    batch i is images i*size ... of the evaluation split, cycling: 8 batches of 128
    read 1024 images, each of the 500 twice and the first 24 a third time.

    Pixels (0..16) are divided by 16 and standardised with the training split's mean
    and standard deviation; the grey image is replicated into 3 channels (the ResNet's
    input is RGB).
    """

    num_classes = 10
    image_size = DIGITS_IMAGE_SIZE

    def __init__(self, seed: int = 0):
        images, labels = load_digits()
        rng = np.random.default_rng(_DIGITS_SPLIT_SEED)
        held = np.zeros(len(labels), dtype=bool)
        for digit in range(self.num_classes):
            members = np.flatnonzero(labels == digit)
            held[rng.permutation(members)[:DIGITS_EVAL_PER_CLASS]] = True
        eval_order = rng.permutation(np.flatnonzero(held))
        train = np.flatnonzero(~held)
        scaled = images.astype(np.float32) / np.float32(16)
        mean, std = scaled[train].mean(dtype=np.float64), scaled[train].std(dtype=np.float64)
        standard = ((scaled - np.float32(mean)) / np.float32(std)).astype(np.float32)
        rgb = np.repeat(standard[..., None], 3, axis=-1)
        self.train_images, self.train_labels = rgb[train], labels[train].astype(np.int32)
        self.eval_images, self.eval_labels = rgb[eval_order], labels[eval_order].astype(np.int32)
        self.seed = seed

    def batch(self, step: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        idx = _epoch_order(len(self.train_labels), self.seed, step * size, size)
        return self.train_images[idx], self.train_labels[idx]

    def eval_batch(self, index: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        idx = (np.arange(size) + index * size) % len(self.eval_labels)
        return self.eval_images[idx], self.eval_labels[idx]


#: The arrays of a user's data file: training pairs, and optionally test pairs.
ARRAY_KEYS = ("x_train", "y_train", "x_test", "y_test")


class ArrayData(Batches):
    """A user's arrays (`--data FILE.npz`): ``x_train``, ``y_train`` and optionally ``x_test``,
    ``y_test``, read without pickles. Training batch `step` is samples step*size ... of the
    per-epoch permutations seeded by (seed, epoch), as `DigitsData`'s; evaluation batch i is
    test samples i*size ..., cycling. The inputs are given to the model as they are."""

    def __init__(self, path: str | Path, seed: int = 0):
        self.arrays = read_arrays(path)
        self.seed = seed
        self.x_train, self.y_train = self.arrays["x_train"], self.arrays["y_train"]

    @property
    def has_test(self) -> bool:
        return "x_test" in self.arrays

    def batch(self, step: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        idx = _epoch_order(len(self.y_train), self.seed, step * size, size)
        return self.x_train[idx], self.y_train[idx]

    def eval_batch(self, index: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.arrays["x_test"], self.arrays["y_test"]
        idx = (np.arange(size) + index * size) % len(y)
        return x[idx], y[idx]


def has_test_set(path: str | Path) -> bool:
    """Whether a user's data file holds x_test (read from its index, not its arrays); False
    where it cannot be read (the run's own checks then say why)."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            return "x_test" in archive.files
    except (OSError, ValueError, EOFError):
        return False


def read_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """A user's data file, checked: an .npz of numeric arrays holding x_train and y_train of
    one length (and x_test with y_test, both or neither); one line naming what is wrong."""
    where = f"--data {str(path)!r}"
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (OSError, ValueError, EOFError) as error:
        raise InvalidArgument(f"{where} must be an .npz file of arrays (numpy.savez) holding x_train and y_train; "
                              f"it could not be read: {error}") from None
    missing = [key for key in ("x_train", "y_train") if key not in arrays]
    extra = sorted(set(arrays) - set(ARRAY_KEYS))
    if missing or extra:
        raise InvalidArgument(f"{where} must hold x_train and y_train, and optionally x_test and y_test; "
                              f"{'it lacks ' + ', '.join(missing) if missing else 'it also holds ' + ', '.join(extra)}")
    if ("x_test" in arrays) != ("y_test" in arrays):
        raise InvalidArgument(f"{where} holds {'x_test' if 'x_test' in arrays else 'y_test'} without "
                              f"{'y_test' if 'x_test' in arrays else 'x_test'}: give both or neither")
    for key, array in arrays.items():
        if array.dtype.kind not in "biuf" or array.ndim == 0 or len(array) == 0:
            raise InvalidArgument(f"{where}: {key} must be a non-empty numeric array; received {array.dtype} of "
                                  f"shape {array.shape}")
    for x, y in (("x_train", "y_train"), ("x_test", "y_test")):
        if x in arrays and len(arrays[x]) != len(arrays[y]):
            raise InvalidArgument(f"{where}: {x} and {y} must hold as many samples; received {len(arrays[x])} "
                                  f"and {len(arrays[y])}")
    return arrays


def make_data(config) -> Batches:
    """The dataset a `TrainConfig` asks for."""
    if config.keras_model is not None:
        return ArrayData(config.data, seed=config.seed)
    if config.data == "cifar10":
        return CifarData(config.data_dir, seed=config.seed)
    if config.data == "digits":
        return DigitsData(seed=config.seed)
    return SyntheticData(seed=config.seed, image_size=config.image_size, noise=config.synthetic_noise)
