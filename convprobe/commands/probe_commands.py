"""`convprobe overflow` and `convprobe compare`: the two classic experiments.

Both take the same configuration options (backend x accumulate x device, raw
--env settings, --jit, an emulator --model), run every configuration (TensorFlow
ones in fresh processes, in parallel), and render one row per configuration.
`--expect` turns a run into an assertion: exit 1 unless every configuration was
observed to accumulate as expected.
"""

from __future__ import annotations

import argparse
import sys

from convprobe.commands.argtypes import (add_output_options, add_running_options,
                                         announce_inherited_switches, bounded_int, check_output)
from convprobe.backends.configurations import ACCUMULATE_CHOICES, BACKEND_CHOICES, DEVICE_CHOICES

__all__ = ["register", "EXPECT_CHOICES"]

EXPECT_CHOICES = ("fp16", "fp32")

_TABLE_COLUMNS = {
    "overflow": ["configuration", "requested", "status", "output", "accumulation", "honoured", "arithmetic", "environment"],
    "compare": [
        "configuration", "requested", "status", "accumulation", "honoured", "max_abs_diff",
        "fraction_different", "real_max_ulp", "fake_max_ulp", "verdict", "environment",
    ],
}


def _add_common(parser: argparse.ArgumentParser) -> None:
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
                        help="emulator accumulation model instead of the per-request one, e.g. sequential:fp16, blocked:fp16:b=4")
    add_running_options(parser, timeout=300)
    out = add_output_options(parser, format_help="output format",
                             output_help="also write the result in --format (json if table) to FILE")
    out.add_argument("--expect", choices=EXPECT_CHOICES,
                     help="exit 1 unless every configuration is observed to accumulate like this")


def register(subparsers) -> None:
    overflow = subparsers.add_parser(
        "overflow",
        help="the 65519 test: inf means fp16 accumulation, 0 means fp32",
        description=(
            "Convolve [65519]*4 with [65519, -65519] in fp16 under each configuration and classify "
            "the result: 0 -> wide (fp32+) accumulation, inf -> fp16 fused accumulation, "
            "NaN -> fp16 products and sums rounded separately."
        ),
    )
    _add_common(overflow)
    overflow.set_defaults(handler=_handler("overflow"))

    compare = subparsers.add_parser(
        "compare",
        help="real fp16 conv vs fp32 compute then cast, against an fp64 reference",
        description=(
            "Run the same seeded fp16 inputs through a real fp16 conv and through an fp32 conv whose "
            "result is rounded to fp16; report how they differ and their errors in fp16 ULPs "
            "against a float64 reference, with the fp32- and fp16-accumulation bounds."
        ),
    )
    _add_common(compare)
    shapes = compare.add_argument_group("shapes (default: the classic question's)")
    for name, default, high in (("batch", 16, 4096), ("height", 32, 4096), ("width", 32, 4096),
                                ("channels", 16, 8192), ("filters", 16, 8192), ("kernel", 3, 64)):
        shapes.add_argument(f"--{name}", type=bounded_int(1, high), default=default,
                            help=f"1 to {high} (default: {default})")
    compare.set_defaults(handler=_handler("compare"))


def _handler(probe: str):
    def handle(args: argparse.Namespace) -> int:
        return _run(probe, args)

    return handle


def _params(probe: str, args: argparse.Namespace) -> dict:
    params = {"seed": args.seed}
    if probe == "compare":
        from convprobe.errors import InvalidArgument
        from convprobe.probes.compare import memory_estimate
        from convprobe.provenance import memory_limit

        if args.kernel > min(args.height, args.width):
            raise InvalidArgument(f"kernel must be at most height and width ({min(args.height, args.width)}); received {args.kernel}")
        params.update({k: getattr(args, k) for k in ("batch", "height", "width", "channels", "filters", "kernel")})
        need, limit = memory_estimate(**{k: v for k, v in params.items() if k != "seed"}), memory_limit()
        if need > limit:
            raise InvalidArgument(f"compare shapes need about {need / 2**30:.1f} GiB (float64 reference and "
                                  f"patches); at most {limit / 2**30:.1f} GiB (half this machine's memory) is "
                                  f"allowed: reduce --batch, --height, --width, --channels or --filters")
    return params



def _rows(probe: str, results) -> list[dict]:
    rows = []
    for result in results:
        row = result.to_row()
        if probe == "overflow":
            row["output"] = "[" + ", ".join(result.observed.get("output", [])) + "]" if result.observed else ""
        else:
            obs = result.observed
            row["max_abs_diff"] = obs.get("max_abs_diff", "")
            row["fraction_different"] = obs.get("fraction_different", "")
            row["real_max_ulp"] = obs.get("real", {}).get("max_ulp_error", "")
            row["fake_max_ulp"] = obs.get("fake", {}).get("max_ulp_error", "")
        rows.append(row)
    return rows


def _run(probe: str, args: argparse.Namespace) -> int:
    from convprobe import provenance
    from convprobe.backends.configurations import parse_env_assignments, resolve_configs
    from convprobe.probes.runner import run_probe
    from convprobe.render import render_csv, render_json, render_table, write_atomic
    from convprobe.provenance import SCHEMA_VERSION

    check_output(args.output, "json" if args.format == "table" else args.format)
    announce_inherited_switches(probe)
    configs = resolve_configs(
        backend=args.backend, accumulate=args.accumulate, device=args.device,
        extra_env=parse_env_assignments(args.env), jit_compile=args.jit, model=args.model,
    )
    params = _params(probe, args)
    results = run_probe(probe, configs, params, timeout=args.timeout, jobs=args.jobs)
    rows = _rows(probe, results)
    document = {
        "schema_version": SCHEMA_VERSION,
        "probe": probe,
        "params": params,
        "provenance": provenance.collect(seed=args.seed, device=args.device),
        "results": [r.to_record() for r in results],
    }
    table_rows = [{k: row[k] for k in _TABLE_COLUMNS[probe]} for row in rows]
    rendered = {
        "table": lambda: render_table(table_rows),
        "json": lambda: render_json(document),
        "csv": lambda: render_csv(rows),
    }
    sys.stdout.write(rendered[args.format]())
    if args.output:
        file_format = "json" if args.format == "table" else args.format
        write_atomic(args.output, rendered[file_format]())
    if args.format != "table":  # the table says it under each row; the JSON in config.warnings
        for warning in sorted({w for c in configs for w in c.warnings}):
            print(f"convprobe {probe}: note: {warning}", file=sys.stderr)
    if args.format == "table":
        for result in results:
            for warning in result.config.warnings:
                print(f"  {result.config.label}: note: {warning}")
            if result.status == "ok" and result.evidence:
                print(f"  {result.config.label}: {result.evidence}")
            elif result.status != "ok" and result.error:
                print(f"  {result.config.label}: {result.status}: {result.error}")
    if args.expect is None:
        return 0
    failing = [r for r in results if r.status != "ok" or r.accumulation != args.expect]
    for r in failing:
        observed = r.accumulation if r.status == "ok" else r.status
        print(f"expectation failed: {r.config.label} expected {args.expect} accumulation, observed {observed}", file=sys.stderr)
    return 1 if failing else 0
