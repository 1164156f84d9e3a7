"""`convprobe contract`: per framework, configuration and op, the accumulation a switch
declares against the accumulation the fingerprint battery observes.

Parses, calls `probes.contract.run_contract`, renders one row per (configuration, op); a
declaration that is not kept is listed under the table.
"""

from __future__ import annotations

from convprobe.backends.configurations import DEVICE_CHOICES
from convprobe.cli.options import add_output_options, add_running_options, announce_inherited_switches, check_output, emit
from convprobe.errors import InvalidArgument
from convprobe.options import names_or_all

__all__ = ["register"]

#: The ops asked by default: a conv layer's three, and a matrix product.
DEFAULT_OPS = "conv2d,conv2d_backprop_input,conv2d_backprop_filter,matmul"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "contract",
        help="per framework, switch and op: the accumulation declared against the accumulation observed",
        description=(
            "Run the fingerprint battery through each op under each framework's configurations, each in its own "
            "process, and set the accumulation each configuration declares (fp16, fp32, or nothing) against the "
            "one the battery observes. A declaration the op does not keep reads NOT HONOURED."
        ),
    )
    parser.add_argument("--backend", default="all", metavar="FRAMEWORKS",
                        help="tensorflow, jax, torch, comma-separated, or 'all' (the installed ones; default: all)")
    parser.add_argument("--rows", default="requests", choices=("requests", "matrix", "all"),
                        help="the --accumulate requests, the configuration matrix's rows, or both "
                             "(default: requests)")
    parser.add_argument("--device", choices=DEVICE_CHOICES, default="cpu", help="device (default: cpu)")
    parser.add_argument("--op", default=DEFAULT_OPS, metavar="OPS",
                        help=f"ops, comma-separated or 'all' (default: {DEFAULT_OPS})")
    add_running_options(parser, timeout=600)
    add_output_options(parser, format_help="what to print",
                       output_help="write the results: FILE.json (document with provenance) or FILE.csv (the cells)")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from convprobe.probes.contract import FRAMEWORKS, contract_configs, installed, run_contract
    from convprobe.probes.fingerprint_ops import check_ops

    check_output(args.output, "json", allowed=("json", "csv"))
    ops = check_ops(args.op)
    chosen = tuple(names_or_all(args.backend, FRAMEWORKS, "backend"))
    frameworks = installed(chosen)
    missing = [name for name in chosen if name not in frameworks]
    if missing and args.backend != "all":
        raise InvalidArgument(f"backend {missing[0]} is not installed here: pip install -e '.[{missing[0]}]'")
    configs = contract_configs(frameworks, args.device, args.rows)
    announce_inherited_switches(args.command)
    emit(args, run_contract(configs, ops, seed=args.seed, device=args.device, timeout=args.timeout, jobs=args.jobs))
    return 0
