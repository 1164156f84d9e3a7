"""`convprobe overflow`: the 65519 test (inf means fp16 accumulation, 0 means fp32).

Runs every configuration (TensorFlow ones in fresh processes, in parallel) through
`probes.studies.run_classic` and renders one row per configuration; `--expect`
makes it an assertion (exit 1 unless every configuration accumulates as expected).
"""

from __future__ import annotations

from convprobe.cli.options import add_classic_options, run_classic_command

__all__ = ["register"]


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "overflow",
        help="the 65519 test: inf means fp16 accumulation, 0 means fp32",
        description=(
            "Convolve [65519]*4 with [65519, -65519] in fp16 under each configuration and classify "
            "the result: 0 -> wide (fp32+) accumulation, inf -> fp16 fused accumulation, "
            "NaN -> fp16 products and sums rounded separately."
        ),
    )
    add_classic_options(parser)
    parser.set_defaults(handler=run)


def run(args) -> int:
    return run_classic_command("overflow", args, {"seed": args.seed})
