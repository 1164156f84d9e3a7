"""The harness on a tiny ResNet (ResNet-8, 8x8 images, batch 4, eager, no XLA):
loss scaling against underflow, skipping, records, resume, comparison.

Eager execution runs the same ops as the graph without XLA and saves seconds of
tracing per trainer; the graph and XLA paths are exercised in
test_jit_agreement.py and test_mirrored.py."""

from __future__ import annotations

import csv
import json
from dataclasses import replace

import numpy as np
import pytest

from convprobe.errors import InvalidArgument
from convprobe.training.config import LossScaleMode, LossScaleSpec, validate_config
from convprobe.training.telemetry import COUNT_FIELDS

pytestmark = pytest.mark.tensorflow


def first_step_counts(loss_scale, tiny, **extra):
    from convprobe.training.trainer import Trainer

    config = validate_config(loss_scale=loss_scale, steps=1, record_every=1, **{**tiny, **extra})
    trainer = Trainer(config, eager=True)
    result = trainer.step(0, telemetry=True)
    names = [("weight", n) for n in trainer.weight_names] + [("activation", n) for n in trainer.tap_names]
    return {key: dict(zip(COUNT_FIELDS, map(int, row))) for key, row in zip(names, result["counts"])}, result


def total(counts, field, kind=None):
    return sum(c[field] for (k, _), c in counts.items() if kind in (None, k))


def test_loss_scaling_reduces_flush_to_zero(tiny):
    # A static scale of 2^-10 stands in for a 1024x smaller loss: the activation
    # gradient of the first convolution flushes. Scaling by 128 / dynamically
    # lifts those values into fp16's range.
    tiny_loss, _ = first_step_counts(str(2.0**-10), tiny)
    none, _ = first_step_counts("none", tiny)
    static, _ = first_step_counts("128", tiny)
    dynamic, result = first_step_counts("dynamic", tiny)
    assert result["loss_scale"] == 2.0**15
    layer = ("activation", "initial_conv")
    assert tiny_loss[layer]["flushed"] > 0
    assert tiny_loss[layer]["flushed"] > none[layer]["flushed"] >= static[layer]["flushed"]
    assert static[layer]["flushed"] == 0 and dynamic[layer]["flushed"] == 0
    assert total(tiny_loss, "flushed") > total(none, "flushed") >= total(static, "flushed")
    assert total(none, "subnormal") > total(static, "subnormal") > total(dynamic, "subnormal")
    # Routing zeros are made by the network (ReLU masks), not by underflow:
    # identical at every scale, because the forward pass is identical.
    for key in none:
        assert tiny_loss[key]["routing_zero"] == none[key]["routing_zero"] == dynamic[key]["routing_zero"]
    assert total(none, "routing_zero", "activation") > 0


def test_fp32_run_matches_its_shadow_exactly(tiny):
    counts, result = first_step_counts(None, tiny, dtype="fp32")
    assert result["loss_scale"] == 1.0  # fp32's default: no scaling
    for c in counts.values():
        assert c["flushed"] == c["lost"] == c["class_mismatch"] == 0
        assert c["subnormal"] == c["shadow_subnormal"]
    assert np.array_equal(result["hist_low"], result["hist_shadow"])


def _trainable(trainer):
    return [v.numpy().copy() for v in trainer.model.trainable_variables]


@pytest.mark.parametrize("mode", ["static", "static-no-skip", "dynamic"])
def test_step_with_inf_gradients(tiny, mode):
    # S = 2^24 drives the logits' gradient past fp16's maximum (65504): inf.
    from convprobe.training.trainer import Trainer

    config = validate_config(steps=2, **tiny)
    config = replace(config, loss_scale=LossScaleSpec(LossScaleMode(mode), 2.0**24))
    trainer = Trainer(config, eager=True)
    before = _trainable(trainer)
    result = trainer.step(0, telemetry=True)
    after = _trainable(trainer)
    assert result["finite"] is False
    assert result["counts"][:, COUNT_FIELDS.index("inf")].sum() > 0
    if mode == "static-no-skip":  # the reference ResNet's behaviour: the step is applied
        assert result["skipped"] is False
        assert not all(np.isfinite(a).all() for a in after)
    else:
        assert result["skipped"] is True
        assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(before, after))
    # The record names the overflowing tensors, the first in the backward pass first: the
    # dense layer's output gradient (the logits' fp16 input), before any weight gradient.
    named = result["nonfinite_tensors"].split(";")
    assert result["first_nonfinite"] == named[0] == "activation:" + trainer.tap_names[-1]
    inf = COUNT_FIELDS.index("inf")
    n_weights = len(trainer.weight_names)
    expected = {f"weight:{name}" for name, c in zip(trainer.weight_names, result["counts"][:n_weights, inf]) if c}
    assert expected and expected <= set(named)
    assert named.index("weight:dense/kernel") < named.index(f"weight:{trainer.weight_names[0]}")
    second = trainer.step(1, telemetry=False)
    expected_scale = 2.0**23 if mode == "dynamic" else 2.0**24
    assert second["loss_scale"] == expected_scale
    if not second["finite"]:  # no activation is measured on a plain step: weights only
        assert second["first_nonfinite"].startswith("weight:")


def _rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_records_stream_and_resume_reproduces_uninterrupted_run(tmp_path, tiny):
    from convprobe.training.run_loop import train

    base = validate_config(loss_scale="dynamic", steps=4, record_every=2, checkpoint_every=2,
                           seed=7, **tiny)
    straight = replace(base, output=str(tmp_path / "straight"))
    train(straight, eager=True)
    interrupted = replace(base, output=str(tmp_path / "interrupted"))
    partial = train(interrupted, stop_after=3, eager=True)  # as if killed during step 3
    assert partial.final_step == 3 and not (tmp_path / "interrupted" / "summary.json").exists()
    assert [r["step"] for r in _rows(tmp_path / "interrupted" / "steps.csv")] == ["0", "1", "2"]
    resumed = train(interrupted, eager=True)  # resumes from the checkpoint after step 1
    assert resumed.steps_run == 2
    a = _rows(tmp_path / "straight" / "steps.csv")
    b = _rows(tmp_path / "interrupted" / "steps.csv")
    assert [r["step"] for r in b] == ["0", "1", "2", "3"]
    assert [(r["loss"], r["accuracy"], r["loss_scale"]) for r in a] == \
           [(r["loss"], r["accuracy"], r["loss_scale"]) for r in b]
    ta = _rows(tmp_path / "straight" / "telemetry.csv")
    tb = _rows(tmp_path / "interrupted" / "telemetry.csv")
    assert {r["step"] for r in ta} == {"0", "2"}
    strip = ("step", "kind", "layer", *COUNT_FIELDS, "hist_low", "hist_shadow")
    assert [tuple(r[k] for k in strip) for r in ta] == [tuple(r[k] for k in strip) for r in tb]
    header = json.loads((tmp_path / "interrupted" / "header.json").read_text())
    assert header["resumed_at_steps"] == [2]
    prov = header["provenance"]
    assert prov["seed"] == 7 and prov["schema_version"] >= 1
    assert "--xla_allow_excess_precision=false" in prov["environment"]["XLA_FLAGS"]
    assert "--xla_cpu_max_isa=AVX2" in prov["runtime"]["xla_flags"]
    assert (header["kind"], header["params"]["loss_scale"]["mode"]) == ("train", "dynamic")
    assert len(header["layers"]["activation"]) == len({r["layer"] for r in ta if r["kind"] == "activation"})
    document = json.loads((tmp_path / "interrupted" / "summary.json").read_text())
    summary = document["summary"]
    assert document["kind"] == "train-summary" and summary["finished"] is True and summary["final_step"] == 4
    again = train(interrupted, eager=True)  # a finished run is reported, not rerun or overwritten
    assert again.steps_run == 0 and again.final_loss == resumed.final_loss
    assert json.loads((tmp_path / "interrupted" / "summary.json").read_text()) == document
    assert len(_rows(tmp_path / "interrupted" / "steps.csv")) == 4
    with pytest.raises(InvalidArgument, match="holds a run with a different seed"):
        train(replace(interrupted, seed=8), eager=True)


@pytest.mark.slow
def test_compare_loss_scaling_writes_table_and_figures(tmp_path, tiny):
    """The library call behind --compare-loss-scaling: three arms, each run in its own process
    (tests/training/test_comparison.py runs the command)."""
    from convprobe.training.compare import overview, run_comparison

    config = validate_config(steps=2, record_every=1, **tiny)
    runs, table = run_comparison(config, tmp_path / "cmp")
    labels = ["fp16-none_seed0", "fp16-128_seed0", "fp16-dynamic_seed0"]
    assert list(runs) == labels and all(run["status"] == "ok" for run in runs.values())
    assert set(table["scale"]) == set(labels)
    assert set(table["kind"]) == {"weight", "activation"}
    assert (table["recorded_steps"] == 2).all()
    for name in ("comparison.json", "comparison.txt", "underflow.csv", "underflow.txt", "underflow_per_layer.png",
                 "gradient_histogram.png", "scale_trajectory.png"):
        assert (tmp_path / "cmp" / name).stat().st_size > 0
    text = (tmp_path / "cmp" / "underflow.txt").read_text()
    assert "routing0" in text and "initial_conv" in text and "flush|lost:fp16-none_seed0" in text and "(fp32)" in text
    view = overview(table)
    assert list(view["gradients"]) == ["activation"] * 3 + ["weight"] * 3
    none, static = table[table["scale"] == labels[0]], table[table["scale"] == labels[1]]
    counted = none[(none["kind"] == "weight") & (none["precision"] == "fp16")]
    assert view.iloc[3]["tensors"] == len(counted) < (none[none["kind"] == "weight"]).shape[0]
    taps = none[none["kind"] == "activation"]
    assert view.iloc[0]["tensors"] == (taps["same_gradient_as"] == "").sum() < len(taps)
    assert (view["flushed_or_lost_mean"] >= view["flushed_mean"]).all()
    assert none["subnormal_fraction"].sum() > static["subnormal_fraction"].sum()


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_taps_measured_once_have_identical_gradients(tiny, dtype):
    # Telemetry measures a block output's gradient through its conv2 tap (the Add passes
    # the gradient through unchanged); check that the two tensors are bitwise equal.
    import tensorflow as tf

    from convprobe.training.model import build_resnet

    model = build_resnet(8, image_size=8, dtype=dtype)
    assert model.tap_same_gradient  # one per block
    images = tf.constant(np.random.default_rng(0).standard_normal((4, 8, 8, 3)).astype(np.float32))
    with tf.GradientTape() as tape:
        outs = model(images, training=True)
        loss = tf.reduce_sum(tf.square(outs[0])) * 2.0**-20  # small: some values go subnormal
    grads = tape.gradient(loss, list(outs[1:]))
    for alias, source in model.tap_same_gradient.items():
        assert model.tap_names[alias].endswith("_add") and model.tap_names[source].endswith("_conv2")
        a, b = grads[alias].numpy(), grads[source].numpy()
        assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def test_graph_steps_trace_once(tiny):
    # Telemetry steps alternate with plain steps without retracing (or recompiling) anything.
    from convprobe.training.trainer import Trainer

    trainer = Trainer(validate_config(steps=4, **tiny))
    for step, telemetry in enumerate((True, False, True, False)):
        trainer.step(step, telemetry)
    for fn in (trainer._plain, trainer._telem, trainer._stats, trainer._copy):
        assert fn.experimental_get_tracing_count() == 1
