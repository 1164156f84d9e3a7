"""`convprobe compare`: a real fp16 conv against fp32 compute then cast, both against fp64.

The shapes are checked, and their memory estimated, before anything runs; then
`probes.studies.run_classic` runs every configuration and one row each is rendered.
"""

from __future__ import annotations

from convprobe.cli.options import add_classic_options, bounded_int, run_classic_command

__all__ = ["register"]

#: Shape options: (name, default, largest allowed).
SHAPES = (("batch", 16, 4096), ("height", 32, 4096), ("width", 32, 4096), ("channels", 16, 8192),
          ("filters", 16, 8192), ("kernel", 3, 64))


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="real fp16 conv vs fp32 compute then cast, against an fp64 reference",
        description=(
            "Run the same seeded fp16 inputs through a real fp16 conv and through an fp32 conv whose "
            "result is rounded to fp16; report how they differ and their errors in fp16 ULPs "
            "against a float64 reference, with the fp32- and fp16-accumulation bounds."
        ),
    )
    add_classic_options(parser)
    shapes = parser.add_argument_group("shapes (default: the classic question's)")
    for name, default, high in SHAPES:
        shapes.add_argument(f"--{name}", type=bounded_int(1, high), default=default,
                            help=f"1 to {high} (default: {default})")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from convprobe.probes.compare import check_shapes

    shapes = {name: getattr(args, name) for name, _, _ in SHAPES}
    check_shapes(**shapes)
    return run_classic_command("compare", args, {"seed": args.seed, **shapes})
