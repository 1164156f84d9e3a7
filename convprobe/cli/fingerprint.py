"""`convprobe fingerprint`: the crafted-input battery, and the arithmetic it reveals.

Parses, calls `probes.studies.run_fingerprint`, renders one row per configuration x op
(`--evidence` prints what each cell rests on).
"""

from __future__ import annotations

from convprobe.cli.options import (add_matrix_options, announce_inherited_switches, emit, list_configs,
                                   matrix_configs, matrix_ops)

__all__ = ["register"]


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "fingerprint",
        help="crafted-input battery: accumulator bits, rounding, products, subnormals, overflow, block size",
        description=(
            "Run the fingerprint battery through each op under each configuration and infer the "
            "arithmetic: significand bits of partial sums (several orderings), rounding, product "
            "rounding, subnormals, overflow, block and chunk sizes. One row per configuration x op."
        ),
    )
    add_matrix_options(parser, default_ops="all", timeout=600)
    parser.add_argument("--evidence", action="store_true", help="print the evidence behind each cell")
    parser.set_defaults(handler=run)


def run(args) -> int:
    if args.list_configs:
        return list_configs(args.device, args.backend)
    from convprobe.probes.studies import run_fingerprint

    ops = matrix_ops(args)
    configs = matrix_configs(args)
    announce_inherited_switches(args.command)
    outcome = run_fingerprint(configs, ops, seed=args.seed, device=args.device, timeout=args.timeout,
                              jobs=args.jobs)
    emit(args, outcome)
    if args.format == "table" and args.evidence:
        for line in outcome.evidence:
            print(f"  {line}")
    return 0
