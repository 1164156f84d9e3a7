"""Synthetic data and the CIFAR-10 binary loader (NumPy only)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from convprobe.errors import InvalidArgument
from convprobe.training.data import (
    CIFAR_RECORD_BYTES,
    CifarData,
    SyntheticData,
    load_cifar10_dir,
    load_cifar10_file,
    write_cifar10_file,
)


def test_synthetic_batches_are_a_function_of_seed_and_step():
    a, b = SyntheticData(seed=3, image_size=8), SyntheticData(seed=3, image_size=8)
    x1, y1 = a.batch(5, 16)
    x2, y2 = b.batch(5, 16)
    assert x1.dtype == np.float32 and x1.shape == (16, 8, 8, 3) and y1.dtype == np.int32
    assert np.array_equal(x1.view(np.uint32), x2.view(np.uint32)) and np.array_equal(y1, y2)
    x3, _ = a.batch(6, 16)
    assert not np.array_equal(x1, x3)
    x4, _ = SyntheticData(seed=4, image_size=8).batch(5, 16)
    assert not np.array_equal(x1, x4)
    xe, _ = a.eval_batch(5, 16)
    assert not np.array_equal(x1, xe)  # evaluation data is a separate stream


def test_synthetic_task_is_learnable_but_not_trivial():
    data = SyntheticData(seed=0, image_size=16, noise=1.0)
    x, y = data.eval_batch(0, 2000)
    # Nearest prototype (the Bayes rule for equal isotropic noise) is far above chance.
    d = ((x[:, None] - data.prototypes[None]) ** 2).sum(axis=(2, 3, 4))
    accuracy = float(np.mean(np.argmin(d, axis=1) == y))
    assert accuracy > 0.5
    # ... while a single pixel is a poor feature: the task needs spatial pooling.
    pixel = x[:, 0, 0, 0]
    centres = data.prototypes[:, 0, 0, 0]
    single = float(np.mean(np.argmin(np.abs(pixel[:, None] - centres[None]), axis=1) == y))
    assert single < accuracy


def _cifar_dir(tmp_path, n_train=(7, 5), n_test=4, seed=0):
    rng = np.random.default_rng(seed)
    for k, n in enumerate(n_train, start=1):
        write_cifar10_file(tmp_path / f"data_batch_{k}.bin",
                           rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, n))
    write_cifar10_file(tmp_path / "test_batch.bin",
                       rng.integers(0, 256, (n_test, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, n_test))
    return tmp_path


def test_cifar_round_trip_layout(tmp_path):
    images = np.arange(2 * 32 * 32 * 3, dtype=np.int64).reshape(2, 32, 32, 3) % 251
    labels = np.array([3, 9])
    write_cifar10_file(tmp_path / "data_batch_1.bin", images, labels)
    raw = (tmp_path / "data_batch_1.bin").read_bytes()
    assert len(raw) == 2 * CIFAR_RECORD_BYTES
    # Record layout: label byte, then the full R plane, G plane, B plane (row-major).
    assert raw[0] == 3 and raw[1] == images[0, 0, 0, 0] and raw[2] == images[0, 0, 1, 0]
    assert raw[1 + 1024] == images[0, 0, 0, 1]
    got_images, got_labels = load_cifar10_file(tmp_path / "data_batch_1.bin")
    assert np.array_equal(got_images, images.astype(np.uint8)) and list(got_labels) == [3, 9]


def test_cifar_directory_and_batches(tmp_path):
    _cifar_dir(tmp_path)
    (train_x, train_y), test = load_cifar10_dir(tmp_path)
    assert train_x.shape == (12, 32, 32, 3) and len(train_y) == 12 and test[0].shape == (4, 32, 32, 3)
    data = CifarData(tmp_path, seed=1)
    x, y = data.batch(3, 8)  # crosses an epoch boundary (12 examples)
    assert x.shape == (8, 32, 32, 3) and x.dtype == np.float32
    x2, y2 = CifarData(tmp_path, seed=1).batch(3, 8)
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    # Every example of an epoch appears exactly once.
    seen = np.concatenate([data.batch(s, 4)[1] for s in range(3)])
    assert sorted(seen) == sorted(train_y)


def test_cifar_truncated_file_named(tmp_path):
    _cifar_dir(tmp_path)
    bad = tmp_path / "data_batch_2.bin"
    bad.write_bytes(bad.read_bytes()[:-100])
    with pytest.raises(InvalidArgument) as info:
        load_cifar10_dir(tmp_path)
    message = str(info.value)
    assert str(bad) in message and "truncated" in message and "3073-byte record" in message
    assert "\n" not in message


def test_cifar_bad_label_and_empty_and_missing(tmp_path):
    _cifar_dir(tmp_path)
    f = tmp_path / "data_batch_1.bin"
    raw = bytearray(f.read_bytes())
    raw[CIFAR_RECORD_BYTES] = 12  # label of record 1
    f.write_bytes(bytes(raw))
    with pytest.raises(InvalidArgument, match=r"data_batch_1\.bin' is corrupt: record 1 has label 12"):
        load_cifar10_dir(tmp_path)
    f.write_bytes(b"")
    with pytest.raises(InvalidArgument, match=r"data_batch_1\.bin' is empty"):
        load_cifar10_file(f)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InvalidArgument, match="none found in"):
        load_cifar10_dir(empty)
    with pytest.raises(InvalidArgument, match="must be a directory"):
        load_cifar10_dir(tmp_path / "nope")


@pytest.mark.parametrize("special, message", [
    (lambda f: os.mkfifo(f), "is not a regular file (a FIFO, socket or device)"),
    (lambda f: f.symlink_to("/dev/zero"), "is not a regular file (a FIFO, socket or device)"),
    (lambda f: f.mkdir(), "is a directory, not a file"),
])
def test_a_cifar_file_that_is_no_regular_file_is_refused_by_its_type_never_read(tmp_path, special, message):
    _cifar_dir(tmp_path)
    (tmp_path / "test_batch.bin").unlink()
    special(tmp_path / "test_batch.bin")  # a FIFO read would block for ever, /dev/zero never end
    with pytest.raises(InvalidArgument) as info:
        load_cifar10_dir(tmp_path)
    assert str(info.value) == f"CIFAR-10 file '{tmp_path / 'test_batch.bin'}' {message}"


def test_cli_rejects_truncated_cifar_before_training(tmp_path):
    import argparse

    from convprobe.cli import train as command

    _cifar_dir(tmp_path)
    bad = tmp_path / "test_batch.bin"
    bad.write_bytes(bad.read_bytes()[:5000])
    p = argparse.ArgumentParser()
    command.register(p.add_subparsers())
    args = p.parse_args(["train", "--data", "cifar10", "--data-dir", str(tmp_path), "--output", str(tmp_path / "o")])
    with pytest.raises(InvalidArgument, match="test_batch.bin' is truncated"):
        args.handler(args)
    assert not (tmp_path / "o").exists()
