"""`convprobe report`: figures from result files of every kind and from training runs.

Parses, checks the output directory, calls `analysis.report.draw` (which validates
every input completely before it writes anything), prints the files written.
"""

from __future__ import annotations


from convprobe.files import check_directory_path

__all__ = ["register"]


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "report",
        help="draw figures from results of every command (.json, .csv) and training run directories",
        description=(
            "Render figures from what the other commands write: overflow, compare, fingerprint, "
            "identify, sweep and replay results (--output FILE.json or tidy .csv tables) and train "
            "run directories (or their header.json). Every input is validated before any figure "
            "is written."
        ),
    )
    parser.add_argument("results", nargs="+", metavar="RESULTS",
                        help="result files (.json, .csv) or training run directories")
    parser.add_argument("--output", "--out-dir", dest="out_dir", default="figures", metavar="DIR",
                        help="where figures go (default: figures); --out-dir is the same option's older name")
    parser.add_argument("--formats", default="png,svg", metavar="FMTS", help="png, svg or both (default: png,svg)")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from convprobe.analysis.report import check_formats, draw

    formats = check_formats(args.formats)
    check_directory_path(args.out_dir, "--output", what="a directory")
    for target in draw(args.results, args.out_dir, formats):
        print(target)
    return 0
