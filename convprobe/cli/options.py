"""What the command modules share: argparse converters, option groups, checks, rendering.

Converters raise `argparse.ArgumentTypeError`, which the CLI frame turns into one
line naming the option, the value received and what is allowed, with exit code 2;
checks raise `InvalidArgument` (the same line, before any work starts).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from convprobe.backends.configurations import (ACCUMULATE_CHOICES, BACKEND_CHOICES, DEVICE_CHOICES, MATRIX, MATRIX_BACKENDS, TensorFlowConfig, emulated_config,
                                               inherited_switches, matrix_defaults, matrix_rows,
                                               framework_installed, parse_env_assignments, resolve_configs,
                                               resolve_device)
from convprobe.backends.configurations import matrix_configs as named_rows
from convprobe.errors import InvalidArgument
from convprobe.options import comma_integers, names_or_all
from convprobe.render import FORMATS, check_output_path, json_clean, render_csv, render_json, render_table, write_atomic

__all__ = ["positive_int", "bounded_int", "int_list", "seed", "add_running_options",
           "add_output_options", "add_matrix_options", "check_output", "announce_inherited_switches",
           "matrix_configs", "matrix_ops", "list_configs", "emit", "add_classic_options",
           "run_classic_command", "EXPECT_CHOICES", "MAX_TIMEOUT", "MAX_JOBS", "MAX_K", "MAX_ROWS"]

MAX_TIMEOUT = 7 * 24 * 3600  # a week: longer is a typo, and overflows some timers
MAX_JOBS = 256
MAX_K = 65536  # reduction lengths: 4x the battery's longest row
MAX_ROWS = 4096


def _integer(text: str, minimum: int, allowed: str, maximum: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum or (maximum is not None and value > maximum):
        raise argparse.ArgumentTypeError(f"must be {allowed}; received {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (sizes, counts, seconds)."""
    return _integer(text, 1, "a positive integer")


def bounded_int(low: int, high: int):
    """An argparse type: an integer in [low, high], the range named in the error."""
    def convert(text: str) -> int:
        return _integer(text, low, f"an integer from {low} to {high}", high)

    convert.__name__ = f"integer in [{low}, {high}]"
    return convert


def int_list(low: int, high: int):
    """An argparse type: comma-separated integers, each in [low, high], at least one."""
    def convert(text: str) -> list[int]:
        values = list(comma_integers(text) or ())
        if not values or min(values) < low or max(values) > high:
            raise argparse.ArgumentTypeError(
                f"must be comma-separated integers from {low} to {high}; received {text!r}")
        return values

    return convert


def seed(text: str) -> int:
    """A non-negative integer seed below 2**63."""
    return _integer(text, 0, "an integer from 0 to 2**63 - 1", 2**63 - 1)


def add_running_options(parser: argparse.ArgumentParser, *, timeout: int) -> None:
    """The "running" group every probe-style command shares: --seed, --timeout, --jobs."""
    run = parser.add_argument_group("running")
    run.add_argument("--seed", type=seed, default=0, help="seed for random inputs (default: 0)")
    run.add_argument("--timeout", type=bounded_int(1, MAX_TIMEOUT), default=timeout, metavar="SECONDS",
                     help=f"per-configuration time limit, 1 to {MAX_TIMEOUT} (default: {timeout})")
    run.add_argument("--jobs", type=bounded_int(1, MAX_JOBS), default=None, metavar="N",
                     help=f"configurations run at once, 1 to {MAX_JOBS} (default: number of cores)")


def add_output_options(parser: argparse.ArgumentParser, *, format_help: str,
                       output_help: str) -> argparse._ArgumentGroup:
    """The "output" group every probe-style command shares: --format and --output.
    Returns the group, for command-specific output options."""
    out = parser.add_argument_group("output")
    out.add_argument("--format", choices=FORMATS, default="table", help=f"{format_help} (default: table)")
    out.add_argument("--output", metavar="FILE", help=output_help)
    return out


def check_output(path: str | None, file_format: str, allowed: tuple[str, ...] | None = None) -> None:
    """Refuse an --output before any work: unwritable, a directory, or a suffix that contradicts
    `file_format` (or, with `allowed`, a suffix outside it). An empty name is refused, not
    taken as "no output"."""
    if path is None:
        return

    suffix = Path(path).suffix.lower().lstrip(".")
    if allowed is not None and suffix not in allowed:
        raise InvalidArgument(f"--output must end in {' or '.join('.' + a for a in allowed)}; "
                              f"received {path!r}")
    check_output_path(path, suffix if allowed is not None else file_format)


def announce_inherited_switches(command: str) -> None:
    """Name, on stderr, the precision switches of the user's shell that no child will see."""


    found = inherited_switches()
    if found:
        shown = " ".join(f"{k}={v}" for k, v in found.items())
        print(f"convprobe {command}: note: ignoring {shown} from your environment: each configuration "
              f"sets its own switches (pass one on purpose with --env NAME=VALUE)", file=sys.stderr)


def add_matrix_options(parser: argparse.ArgumentParser, *, default_ops: str, timeout: int) -> None:
    """The options of the study commands (fingerprint, identify, sweep): configurations of the
    matrix and emulator models, ops, running and output."""
    config = parser.add_argument_group("configurations")
    config.add_argument("--backend", default="tensorflow", metavar="FRAMEWORKS",
                        help="the frameworks whose configuration matrices run: tensorflow, jax, torch, "
                             "comma-separated, or 'all' (the installed ones; default: tensorflow; jax and torch "
                             "need their extras)")
    config.add_argument("--configs", default=None, metavar="NAMES",
                        help="configurations of the framework's matrix, comma-separated, 'all', or 'none' "
                             "(default: the matrix's default rows; see --list-configs)")
    config.add_argument("--device", choices=DEVICE_CHOICES, default="cpu", help="device (default: cpu)")
    config.add_argument("--model", action="append", default=[], metavar="SPEC",
                        help="also run the exact emulator with this model (repeatable), e.g. sequential:fp16")
    config.add_argument("--op", default=default_ops, metavar="OPS",
                        help=f"ops, comma-separated or 'all' (default: {default_ops})")
    config.add_argument("--list-configs", action="store_true", help="list the configuration matrix and exit")
    add_running_options(parser, timeout=timeout)
    add_output_options(parser, format_help="what to print",
                       output_help="write the results: FILE.json (document with provenance) or FILE.csv (tidy table)")


def study_backends(value: str) -> tuple[str, ...]:
    """A study command's --backend: one framework, a comma-separated list, or 'all' (the
    frameworks installed here)."""
    chosen = names_or_all(value, MATRIX_BACKENDS, "backend")
    if value.strip() != "all":
        return chosen
    return tuple(name for name in chosen if framework_installed(name))


def _framework_rows(args) -> list:
    """The matrix rows of every chosen framework: --configs names each row once, whichever
    framework has it (several frameworks: a name none of them has is refused)."""
    backends = study_backends(args.backend)
    if args.configs == "none":
        return []
    if len(backends) == 1 or args.configs in (None, "all"):
        return [c for backend in backends for c in named_rows(args.device, args.configs, backend)]
    rows_of = {backend: matrix_rows(resolve_device(args.device), backend) for backend in backends}
    names = names_or_all(args.configs, tuple(dict.fromkeys(n for rows in rows_of.values() for n in rows)),
                         "configuration")
    return [rows[name] for rows in rows_of.values() for name in names if name in rows]


def matrix_configs(args) -> list:
    """The chosen frameworks' matrix rows plus emulator models, validated before anything runs."""
    configs = _framework_rows(args)
    models = [emulated_config(spec) for spec in args.model]
    labels = [config.label for config in models]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        given = ", ".join(repr(spec) for spec, label in zip(args.model, labels) if label == twice[0])
        raise InvalidArgument(f"--model names {twice[0]} twice (as {given}); give each model once: results "
                              f"are keyed by model")
    configs += models
    if not configs:
        raise InvalidArgument("nothing to run: --configs none and no --model")
    return configs


def matrix_ops(args) -> tuple[str, ...]:
    """The first checks of a study command, before any work: --output (.json or .csv,
    writable) and --op; returns the ops."""
    from convprobe.probes.fingerprint_ops import check_ops

    check_output(args.output, "json", allowed=("json", "csv"))
    return check_ops(args.op)


def list_configs(device: str, backends: str = "tensorflow") -> int:
    """Print each chosen framework's matrix rows on a device; listing needs no GPU (it only
    says what would run)."""
    chosen = study_backends(backends)
    for backend in chosen:
        if len(chosen) > 1:
            print(f"{backend}:")
        _list_rows(device, backend)
    return 0


def _list_rows(device: str, backend: str) -> None:
    device = device if device in MATRIX else resolve_device(device)
    defaults = matrix_defaults(device, backend)
    for config in matrix_rows(device, backend).values():
        default = "*" if config.name in defaults else " "
        jit = f"jit={'on ' if config.jit_compile else 'off'} " if isinstance(config, TensorFlowConfig) else ""
        print(f"{default} {config.name:24s} {jit}{config.environment or '(nothing set)'}  # {config.note}")
    print({"jax": "(* = run by default; every JAX row is compiled by XLA; options are per-call arguments of "
                  "lax.conv_general_dilated and jnp.matmul)",
           "torch": "(* = run by default; options are PyTorch's process-wide switches, set in each row's own "
                    "process before its first op)",
           }.get(backend, "(* = run by default; on CPU the cuDNN/cuBLAS switches change nothing, so only the "
                          "'gpu-switches' control row carries them)"))


def emit(args, outcome, *, file_format: str | None = None) -> None:
    """Write --output (a JSON envelope, or a CSV: the tidy frame when there is one, else the
    flat rows), then print `outcome` in --format (its notes under a table). The file comes
    first: it is the record, and a terminal or pipe that fails afterwards cannot lose it."""

    from convprobe import results
    if args.output:
        suffix = file_format or Path(args.output).suffix.lower().lstrip(".")
        if suffix == "csv":
            write_atomic(args.output, _csv(outcome))
        else:
            results.write(args.output, outcome.document)
    if args.format == "table":
        sys.stdout.write(render_table(outcome.rows, outcome.columns))
        for note in outcome.notes:
            print(f"  {note}")
        if outcome.summary:
            print(outcome.summary)
    elif args.format == "json":
        sys.stdout.write(render_json(json_clean(outcome.document)))
    else:
        sys.stdout.write(_csv(outcome))


def _csv(outcome) -> str:
    if outcome.frame is not None:
        from convprobe.analysis.tables import validate_frame

        return validate_frame(outcome.frame, outcome.schema).to_csv(index=False)
    return render_csv(outcome.csv_rows)


EXPECT_CHOICES = ("fp16", "fp32")


def add_classic_options(parser: argparse.ArgumentParser) -> None:
    """The options of overflow and compare: backend x accumulate x device, --env, --jit,
    --model, running, output and --expect."""

    config = parser.add_argument_group("configurations")
    config.add_argument("--accumulate", choices=(*ACCUMULATE_CHOICES, "all"), default="all",
                        help="accumulation to request (default: all, one row each)")
    config.add_argument("--backend", choices=(*BACKEND_CHOICES, "all"), default="all",
                        help="real TensorFlow, the exact emulator, or both (default: all)")
    config.add_argument("--device", choices=DEVICE_CHOICES, default="cpu",
                        help="device for TensorFlow (default: cpu; gpu without a GPU is an error)")
    config.add_argument("--env", action="append", metavar="NAME=VALUE", default=[],
                        help="extra environment setting for TensorFlow children (repeatable)")
    config.add_argument("--jit", action="store_true", help="run TensorFlow ops under XLA (jit_compile=True)")
    config.add_argument("--model", metavar="SPEC",
                        help="emulator accumulation model instead of the per-request one, e.g. sequential:fp16, "
                             "blocked:fp16:b=4")
    add_running_options(parser, timeout=300)
    out = add_output_options(parser, format_help="output format",
                             output_help="also write the result in --format (json if table) to FILE")
    out.add_argument("--expect", choices=EXPECT_CHOICES,
                     help="exit 1 unless every configuration is observed to accumulate like this")


def run_classic_command(probe: str, args, params: dict) -> int:
    """overflow / compare after their own checks: configurations, run, render, --expect."""

    from convprobe.probes.studies import run_classic

    file_format = "json" if args.format == "table" else args.format
    check_output(args.output, file_format)
    announce_inherited_switches(probe)
    configs = resolve_configs(
        backend=args.backend, accumulate=args.accumulate, device=args.device,
        extra_env=parse_env_assignments(args.env), jit_compile=args.jit, model=args.model,
    )
    outcome = run_classic(probe, configs, params, device=args.device, timeout=args.timeout, jobs=args.jobs)
    emit(args, outcome, file_format=file_format)
    if args.format != "table":  # the table says it under each row; the JSON in config.warnings
        for warning in sorted({w for c in configs for w in c.warnings}):
            print(f"convprobe {probe}: note: {warning}", file=sys.stderr)
    if args.expect is None:
        return 0
    failing = [r for r in outcome.probe_results if r.status != "ok" or r.accumulation != args.expect]
    for r in failing:
        observed = r.accumulation if r.status == "ok" else r.status
        print(f"expectation failed: {r.config.label} expected {args.expect} accumulation, observed {observed}",
              file=sys.stderr)
    return 1 if failing else 0
