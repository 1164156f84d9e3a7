"""`convprobe identify`: the emulator model that reproduces an op bit for bit, per K.

Checks the candidate specs, reduction lengths and row count, calls
`probes.studies.run_identify`, renders the match fraction per K.
"""

from __future__ import annotations

from convprobe.cli.options import (MAX_K, MAX_ROWS, add_matrix_options, announce_inherited_switches,
                                   bounded_int, emit, int_list, list_configs, matrix_configs,
                                   matrix_ops)

__all__ = ["register"]


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "identify",
        help="find the emulator model that reproduces an op bit for bit, per reduction length K",
        description=(
            "Run seeded random dot products of length K (16 ... 8192) through each op and search "
            "the emulator's model family for the one that matches the outputs bit for bit; report "
            "the match fraction per K and the K at which the best model stops matching."
        ),
    )
    add_matrix_options(parser, default_ops="conv2d,conv2d_backprop_input,conv2d_backprop_filter", timeout=600)
    parser.add_argument("--candidates", metavar="SPECS",
                        help="comma-separated model specs to search instead of the default family")
    parser.add_argument("--ks", type=int_list(1, MAX_K), default=None, metavar="K,K,...",
                        help=f"reduction lengths, 1 to {MAX_K} (default: 16,32,...,8192)")
    parser.add_argument("--rows", type=bounded_int(1, MAX_ROWS), default=None,
                        help=f"dot products per K, 1 to {MAX_ROWS} (default: 64)")
    parser.set_defaults(handler=run)


def run(args) -> int:
    if args.list_configs:
        return list_configs(args.device)
    from convprobe.emulation.composites import split_arguments
    from convprobe.errors import InvalidArgument
    from convprobe.probes import identify
    from convprobe.probes.studies import run_identify

    ops = matrix_ops(args)
    specs = None
    if args.candidates is not None:
        specs = split_arguments(args.candidates)  # commas inside splitk(...) stay
        if not specs:
            raise InvalidArgument(f"--candidates must name at least one model spec; received {args.candidates!r}")
    identify.candidates(specs)  # bad specs fail before anything runs
    configs = matrix_configs(args)
    announce_inherited_switches(args.command)
    outcome = run_identify(configs, ops, specs=specs, ks=args.ks or list(identify.DEFAULT_KS),
                           rows=args.rows or identify.DEFAULT_ROWS, seed=args.seed, device=args.device,
                           timeout=args.timeout, jobs=args.jobs)
    emit(args, outcome)
    return 0
