"""The bundled digits (`--data digits`): real data, shipped pickle-free with its licence; a fixed
split; batches a function of (seed, step). NumPy only."""

from __future__ import annotations

import hashlib
import tomllib
import zipfile
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from convprobe.errors import InvalidArgument
from convprobe.training.config import IMAGE_SIZES, validate_config
from convprobe.training.data import DIGITS_EVAL_PER_CLASS, DigitsData, load_digits, make_data

DATA = resources.files("convprobe.data")
REPO = Path(__file__).resolve().parents[2]

#: SHA-256 of the images' and labels' bytes as vendored (scikit-learn 1.9.1's digits.csv.gz).
DIGITS_SHA256 = "87ff0c9e40dc7e2c0e34e7257799c2e3f3aec1a016363bb11cad869ec428a826"


def test_the_bundle_is_the_1797_digits_as_uint8_without_pickles():
    with zipfile.ZipFile(DATA / "digits.npz") as archive:
        assert sorted(archive.namelist()) == ["images.npy", "labels.npy"]
    with np.load(DATA / "digits.npz", allow_pickle=False) as raw:  # an object array would raise here
        assert {k: (raw[k].dtype, raw[k].shape) for k in raw.files} == {
            "images": (np.dtype(np.uint8), (1797, 8, 8)), "labels": (np.dtype(np.uint8), (1797,))}
    images, labels = load_digits()
    assert hashlib.sha256(images.tobytes() + labels.tobytes()).hexdigest() == DIGITS_SHA256
    assert images.max() == 16 and images.min() == 0
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


def test_its_licence_and_source_travel_with_it():
    licence = (DATA / "DIGITS_LICENCE").read_text(encoding="utf-8")
    assert "CC BY 4.0" in licence and "Alpaydin" in licence and "Kaynak" in licence
    assert "BSD 3-Clause License" in licence and "The scikit-learn developers" in licence
    readme = (DATA / "DIGITS.md").read_text(encoding="utf-8")
    assert "https://doi.org/10.24432/C50P49" in readme and "allow_pickle=False" in readme
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = patterns["convprobe.data"]
    for name in ("digits.npz", "DIGITS.md", "DIGITS_LICENCE"):
        assert any(Path(name).match(p) for p in shipped), (name, shipped)


def test_the_split_is_fixed_stratified_and_disjoint():
    a, b = DigitsData(seed=0), DigitsData(seed=5)
    assert a.train_images.shape == (1297, 8, 8, 3) and a.eval_images.shape == (500, 8, 8, 3)
    assert np.bincount(a.eval_labels).tolist() == [DIGITS_EVAL_PER_CLASS] * 10
    assert np.array_equal(a.eval_images, b.eval_images) and np.array_equal(a.train_labels, b.train_labels)
    train = {x.tobytes() for x in a.train_images[..., 0]}
    held = {x.tobytes() for x in a.eval_images[..., 0]}
    assert len(train) == 1297 and len(held) == 500 and not train & held  # the 1797 images are all distinct
    assert np.array_equal(a.train_images[..., 0], a.train_images[..., 2])  # grey in every channel
    assert abs(float(a.train_images.mean())) < 1e-6 and abs(float(a.train_images.std()) - 1) < 1e-5


def test_batches_are_a_function_of_seed_and_step():
    data = DigitsData(seed=3)
    x, y = data.batch(7, 64)
    assert x.dtype == np.float32 and x.shape == (64, 8, 8, 3) and y.dtype == np.int32 and y.shape == (64,)
    x2, y2 = DigitsData(seed=3).batch(7, 64)
    assert np.array_equal(x.view(np.uint32), x2.view(np.uint32)) and np.array_equal(y, y2)
    assert not np.array_equal(DigitsData(seed=4).batch(7, 64)[1], y)
    assert not np.array_equal(data.batch(8, 64)[1], y)
    epoch = np.concatenate([data.batch(step, 100)[1] for step in range(13)])[:1297]
    assert np.array_equal(np.sort(epoch), np.sort(data.train_labels))  # one epoch: every image once


def test_evaluation_cycles_through_its_500_images():
    data = DigitsData()
    labels = np.concatenate([data.eval_batch(i, 128)[1] for i in range(8)])
    assert len(labels) == 1024
    assert np.array_equal(labels[:500], data.eval_labels) and np.array_equal(labels[500:1000], data.eval_labels)
    assert np.array_equal(labels[1000:], data.eval_labels[:24])


def test_digits_default_to_their_image_size_and_refuse_another():
    config = validate_config(data="digits")
    assert config.image_size == IMAGE_SIZES["digits"] == 8 and isinstance(make_data(config), DigitsData)
    assert validate_config().image_size == 32 and validate_config(image_size=16).image_size == 16
    with pytest.raises(InvalidArgument, match=r"^--image-size must be 8 with --data digits \(its images are 8x8; "
                                              r"leave --image-size out\); received 32$"):
        validate_config(data="digits", image_size=32)
    with pytest.raises(InvalidArgument, match="--data must be one of synthetic, cifar10, digits; received 'mnist'"):
        validate_config(data="mnist")
