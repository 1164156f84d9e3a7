"""`convprobe sweep`: error versus reduction length K and input distribution.

Checks the distributions and bound format, calls `probes.studies.run_sweep`, renders
the tidy table (one row per configuration x op x distribution x K).
"""

from __future__ import annotations

from convprobe.cli.options import (MAX_K, MAX_ROWS, add_matrix_options, announce_inherited_switches,
                                   bounded_int, emit, int_list, list_configs, matrix_configs,
                                   matrix_ops)

__all__ = ["register"]


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "sweep",
        help="error versus reduction length K and input distribution, as a tidy table",
        description=(
            "Measure error against the exact result for K = 9 ... 18432 and four input "
            "distributions, per configuration, model and op; flag errors above the probabilistic "
            "bound and fp16 stagnation."
        ),
    )
    add_matrix_options(parser, default_ops="conv2d", timeout=600)
    parser.add_argument("--ks", type=int_list(1, MAX_K), default=None, metavar="K,K,...",
                        help=f"reduction lengths, 1 to {MAX_K} (default: 9,18,...,18432)")
    parser.add_argument("--distributions", default="all", metavar="NAMES",
                        help="uniform01, uniform11, normal, heavy_tailed, comma-separated or 'all' (default)")
    parser.add_argument("--rows", type=bounded_int(1, MAX_ROWS), default=None,
                        help=f"outputs per point, 1 to {MAX_ROWS} (default: 32)")
    parser.add_argument("--bound-format", default="fp16", metavar="FMT",
                        help="accumulator format of the bound columns and exceeds flag (default: fp16)")
    parser.set_defaults(handler=run)


def run(args) -> int:
    if args.list_configs:
        return list_configs(args.device, args.backend)
    from convprobe.formats import parse_format
    from convprobe.probes import sweep
    from convprobe.probes.studies import run_sweep

    ops = matrix_ops(args)
    distributions = sweep.check_distributions(args.distributions)
    parse_format(args.bound_format, argument="bound-format")
    sweep.check_size(args.rows or sweep.DEFAULT_ROWS, args.ks or sweep.DEFAULT_KS)
    configs = matrix_configs(args)
    announce_inherited_switches(args.command)
    outcome = run_sweep(configs, ops, ks=args.ks or list(sweep.DEFAULT_KS), distributions=distributions,
                        rows=args.rows or sweep.DEFAULT_ROWS, bound_format=args.bound_format, seed=args.seed,
                        device=args.device, timeout=args.timeout, jobs=args.jobs)
    emit(args, outcome)
    return 0
