"""One training run from start (or its last checkpoint) to its summary: the records streamed,
checkpoints saved, the run resumed where a rerun finds one. The model and step are the
trainer's: convprobe's ResNet (`trainer.Trainer`) or the user's own Keras model
(`user_trainer.UserModelTrainer`, for ``--keras-model``)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from convprobe import results
from convprobe.errors import InvalidArgument
from convprobe.training import runtime
from convprobe.training.cluster import read_tf_config
from convprobe.training.config import TrainConfig
from convprobe.training.data import Batches
from convprobe.training.records import (
    IDENTIFY_MAP_NAME,
    STEP_COLUMNS,
    RunFiles,
    read_header,
    read_summary,
    save_checkpoint,
)
from convprobe.training.tensorboard import TensorBoardWriter
from convprobe.training.trainer import Trainer
from convprobe.training.user_trainer import UserModelTrainer

__all__ = ["RunResult", "train"]


@dataclass
class RunResult:
    """What a finished (or resumed and finished) run reports."""

    directory: str | None
    steps_run: int
    final_step: int
    skipped_steps: int
    nonfinite_steps: int
    final_loss_scale: float
    final_loss: float
    eval_accuracy: float | None
    images_per_second: float
    jit: bool
    summary: dict = field(default_factory=dict)


def _number(value) -> float:
    """A summary's number as float; null (no step ran in the call that wrote it) as NaN."""
    return math.nan if value is None else float(value)


def train(config: TrainConfig, *, data: Batches | None = None, trainer: Trainer | None = None,
          stop_after: int | None = None, eager: bool = False, identify_map: dict | None = None) -> RunResult:
    """Run (or resume) a training run, streaming records to `config.output` if set.

    `stop_after` ends the run early after that many steps in this call, leaving
    it as an interrupted run would (records and last checkpoint on disk).
    `eager` runs without graph tracing (see `Trainer`).
    """
    files = RunFiles(config.output) if config.output else None
    run = functools.partial(_run, config, files, data=data, trainer=trainer, stop_after=stop_after, eager=eager,
                            identify_map=identify_map)
    if files is None or not _writes_records(config):
        return run()
    with files.locked():  # a second run on this directory is refused before it changes anything
        return run()


def _writes_records(config: TrainConfig) -> bool:
    """Whether this process writes the run's records: every process but the other workers of
    a cluster (worker 0, the chief, writes them)."""
    return config.distribute != "multi-worker" or read_tf_config().is_chief


def _run(config: TrainConfig, files: RunFiles | None, *, data: Batches | None, trainer: Trainer | None,
         stop_after: int | None, eager: bool, identify_map: dict | None) -> RunResult:
    plan = files.plan(config.to_json()) if files is not None else None  # validates, writes nothing
    start = 0
    counters = {"skipped": 0, "nonfinite": 0}
    if files is not None and plan is not None and plan.start_step >= config.steps and files.summary_path.exists():
        done = read_summary(files.directory)  # already finished: report it, touch nothing
        evaluated = read_header(files.directory)["params"].get("eval_batches", 0)
        if evaluated != config.eval_batches:  # its accuracy would be reported under the wrong setting
            raise InvalidArgument(f"{config.output} finished with --eval-batches {evaluated}; nothing was changed: "
                                  f"rerun it with that value, or train into a new --output")
        return RunResult(
            directory=config.output, steps_run=0, final_step=done["final_step"],
            skipped_steps=done["skipped_steps"], nonfinite_steps=done["nonfinite_steps"],
            final_loss_scale=_number(done["final_loss_scale"]), final_loss=_number(done["final_loss"]),
            eval_accuracy=done["eval_accuracy"], images_per_second=done["median_images_per_second"] or 0.0,
            jit=done["jit"], summary=done)
    if trainer is None:
        kind = UserModelTrainer if config.keras_model is not None else Trainer
        trainer = kind(config, data=data, eager=eager, identify_map=identify_map)
    board: TensorBoardWriter | None = None  # the run's TensorBoard event files, where it writes records
    if files is not None:
        assert plan is not None  # (planned wherever there are files)
        if plan.replicas is not None and plan.replicas != trainer.replicas:
            raise InvalidArgument(f"{config.output} was recorded with {plan.replicas} replicas and this run has "
                                  f"{trainer.replicas} (batch-norm statistics would change mid-run); nothing was "
                                  f"changed: resume with as many workers or devices, or use a new --output")
        if plan.checkpoint is not None:
            _, weights, opt_state, counters = plan.checkpoint
            trainer.restore(weights, opt_state)  # a foreign checkpoint fails here, files untouched
        start = plan.start_step
        if trainer.is_chief:  # other workers of a cluster compute the same steps and write nothing
            facts = runtime.runtime_facts()
            facts.update(jit_effective=trainer.jit, jit_scope=trainer.jit_scope, eager=trainer.eager,
                         replicas=trainer.replicas,
                         cluster=None if trainer.cluster is None else list(trainer.cluster.workers))
            start = files.start(plan, config_json=config.to_json(), seed=config.seed,
                                device=trainer.device_description(), runtime=facts,
                                layer_names={"weight": trainer.weight_names, "activation": trainer.tap_names},
                                arithmetic=trainer.arithmetic_record())
            if identify_map is not None and config.arithmetic_map is None:  # measured for this run: keep it
                results.write(files.directory / IDENTIFY_MAP_NAME, identify_map)
            board = TensorBoardWriter(files.tensorboard_path, trainer.format)
        else:
            files = None
    speeds: list[float] = []
    last: dict = {}
    steps_run = 0
    from convprobe.progress import tracker

    try:
        with tracker(config.steps - start, f"train {config.dtype} steps",
                     enabled=config.progress and trainer.is_chief) as advance:
            for step in range(start, config.steps):
                if stop_after is not None and steps_run >= stop_after:
                    break
                telemetry = step % config.record_every == 0
                last = trainer.step(step, telemetry)
                steps_run += 1
                counters["skipped"] += int(last["skipped"])
                counters["nonfinite"] += int(not last["finite"])
                if step > start:  # the first call compiles
                    speeds.append(last["images_per_second"])
                if files is not None:
                    assert board is not None  # (made wherever files are kept: the chief's)
                    files.write_step({k: last[k] for k in STEP_COLUMNS})
                    board.write_step(step, last["loss_scale"], counters["skipped"])
                    if telemetry:
                        rows = trainer.telemetry_rows(last)
                        files.write_telemetry(rows)
                        board.write_records(step, rows)
                    if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
                        save_checkpoint(files.checkpoint_path, step + 1, *trainer.state(), counters)
                advance(f"loss {last['loss']:.4f}  scale {last['loss_scale']:g}  "
                        f"{last['images_per_second']:.1f} img/s")
        finished = (start + steps_run) >= config.steps
        eval_accuracy = trainer.evaluate(config.eval_batches) if finished else None
        summary: dict[str, Any] = {
            "finished": finished,
            "final_step": start + steps_run,
            "skipped_steps": counters["skipped"],
            "nonfinite_steps": counters["nonfinite"],
            "final_loss_scale": last.get("loss_scale"),
            "final_loss": last.get("loss"),
            "eval_accuracy": eval_accuracy,
            "median_images_per_second": float(np.median(speeds)) if speeds else None,
            "jit": trainer.jit,
            "arithmetic": trainer.arithmetic.text,
            "weights_sha256": trainer.weights_sha256(),
        }
        if files is not None:
            if finished:
                files.finish(summary)
            else:
                files.close()
    finally:
        try:
            if files is not None:
                files.close()
        finally:  # the event files close even when the CSVs could not
            if board is not None:
                board.close()
    return RunResult(
        directory=config.output, steps_run=steps_run, final_step=start + steps_run,
        skipped_steps=counters["skipped"], nonfinite_steps=counters["nonfinite"],
        final_loss_scale=float(last.get("loss_scale", config.loss_scale.scale)),
        final_loss=float(last.get("loss", math.nan)), eval_accuracy=eval_accuracy,
        images_per_second=summary["median_images_per_second"] or 0.0, jit=trainer.jit, summary=summary,
    )
