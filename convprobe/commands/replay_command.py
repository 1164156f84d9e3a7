"""`convprobe replay`: real tensor-core outputs through the GPU presets, bit for bit.

Parses, calls `convprobe.probes.replay`, renders. Exit 0 only when every set matches
100%; 1 when any vector differs; 2 on bad input (an unknown GPU or format folder, a
malformed file), before anything runs.
"""

from __future__ import annotations

import argparse
import sys

from convprobe.commands.argtypes import add_output_options

__all__ = ["register"]

_COLUMNS = ["gpu", "input", "output", "model", "k", "vectors", "matches", "first_mismatch"]


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
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from convprobe import provenance
    from convprobe.errors import InvalidArgument
    from convprobe.probes import replay
    from convprobe.provenance import SCHEMA_VERSION
    from convprobe.render import (check_output_path, json_clean, render_csv, render_json,
                                  render_table, write_atomic)

    file_format = "json" if args.format == "table" else args.format
    if args.output:
        check_output_path(args.output, file_format)
    gpus = None
    if args.gpu is not None:
        gpus = [g.strip() for g in args.gpu.split(",") if g.strip()]
        if not gpus:
            raise InvalidArgument(f"--gpu must name at least one GPU; received {args.gpu!r}")
    sets = (replay.load_directory(args.data, gpus) if args.data
            else replay.load_bundled(gpus))
    rows = replay.replay(sets)
    document = {
        "schema_version": SCHEMA_VERSION,
        "kind": "replay",
        "params": {"data": args.data or "bundled", "gpu": gpus},
        "provenance": provenance.collect(seed=None, device="cpu"),
        "results": rows,
    }
    flat = [{**{k: r[k] for k in _COLUMNS[:-1]}, "first_mismatch": _mismatch(r)} for r in rows]
    rendered = {"table": lambda: render_table(flat, _COLUMNS),
                "json": lambda: render_json(json_clean(document)),
                "csv": lambda: render_csv(flat)}
    sys.stdout.write(rendered[args.format]())
    if args.output:
        write_atomic(args.output, rendered[file_format]())
    failing = [r for r in rows if r["matches"] != r["vectors"]]
    if args.format == "table":
        total = sum(r["vectors"] for r in rows)
        print(f"{len(rows) - len(failing)} of {len(rows)} sets bit-exact; "
              f"{sum(r['matches'] for r in rows)} of {total} vectors")
    return 1 if failing else 0


def _mismatch(row: dict) -> str:
    m = row["first_mismatch"]
    return "-" if m is None else f"#{m['index']}: model {m['model']}, hardware {m['hardware']}"
