"""`convprobe replay`: real tensor-core outputs through the emulator's GPU presets, bit for bit.

Parses, calls `probes.studies.run_replay`, renders. Exit 0 only when every set matches
100%; 1 when any vector differs; 2 on bad input (an unknown GPU or format folder, a
malformed file), before anything runs.
"""

from __future__ import annotations

from convprobe.cli.options import add_output_options, check_output, emit
from convprobe.errors import InvalidArgument

__all__ = ["register"]


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "replay",
        help="replay real GPU tensor-core outputs through the emulator's GPU presets",
        description=(
            "Run every vector of a directory of real MMA inputs and outputs (the layout of "
            "Khattak & Mikaitis's tensor-core validation data: GPU/FORMAT/a_*, b_*, c_*, d_*) "
            "through the matching GPU preset (v100, a100, ada, h100, b200, ...) and compare the "
            "results bit for bit. Exit 0 only when every set matches 100%."
        ),
    )
    parser.add_argument("--data", metavar="DIR",
                        help="directory of GPU/FORMAT folders (default: the bundled copy of "
                             "the published data, 30 sets from 5 GPUs)")
    parser.add_argument("--gpu", metavar="NAMES",
                        help="comma-separated GPU folders or presets to replay (default: all)")
    add_output_options(parser, format_help="output format",
                       output_help="also write the result in --format (json if table) to FILE")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from convprobe.probes.studies import run_replay

    file_format = "json" if args.format == "table" else args.format
    check_output(args.output, file_format)
    gpus = None
    if args.gpu is not None:
        gpus = [g.strip() for g in args.gpu.split(",") if g.strip()]
        if not gpus:
            raise InvalidArgument(f"--gpu must name at least one GPU; received {args.gpu!r}")
    outcome = run_replay(args.data, gpus)
    emit(args, outcome, file_format=file_format)
    rows = outcome.document["results"]
    return 1 if any(r["matches"] != r["vectors"] for r in rows) else 0
