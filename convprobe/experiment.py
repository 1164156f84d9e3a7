"""What the scripts under experiments/ share: --config and --output, and the loaded config.

Each script is run as ``python experiments/<name>/run.py [--config FILE] [--output DIR]``
and keeps its parameters in ``config.json`` next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from convprobe import results
from convprobe.errors import InvalidArgument

__all__ = ["parser", "load", "write_probe_results", "provenance_lines", "write_page"]


def parser(doc: str, here: Path) -> argparse.ArgumentParser:
    """A parser whose --help shows the script's whole docstring, with --config (default
    here/config.json) and --output (default here/results: the study's own folder, wherever
    the script is run from)."""
    p = argparse.ArgumentParser(prog=f"python experiments/{here.name}/run.py", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(here / "config.json"), metavar="FILE",
                   help=f"the study's parameters as JSON (default: {here.name}/config.json; copy it and "
                        "edit it to run a variant)")
    p.add_argument("--output", default=str(here / "results"), metavar="DIR",
                   help=f"where results and figures go, created if needed (default: {here.name}/results)")
    return p


def write_probe_results(kind: str, params: dict, probe_results, path: Path, observed_columns=()) -> list[dict]:
    """Probe results as a results envelope (`convprobe.results`, provenance in every record)
    at `path`, and a flat CSV of them beside it; returns the records."""
    import pandas as pd

    from convprobe import files, provenance

    records = [r.to_record() for r in probe_results]
    results.write(path, results.envelope(kind, params, provenance.collect(seed=params.get("seed")),
                                         results=records))
    frame = pd.DataFrame([r.to_row(tuple(observed_columns)) for r in probe_results])
    files.write_atomic(path.with_suffix(".csv"), frame.to_csv(index=False))
    return records


def load(args: argparse.Namespace, **overrides) -> tuple[dict, Path]:
    """(the config file with every override that is not None applied, the output
    folder, created). A config that is not a readable JSON object is one line and exit 2."""
    try:
        config = results.read_json(args.config, where=f"--config {args.config!r}")
        if not isinstance(config, dict):
            raise InvalidArgument(f"--config {args.config!r} must hold a JSON object of settings; received "
                                  f"{type(config).__name__}")
    except InvalidArgument as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    config.update({key: value for key, value in overrides.items() if value is not None})
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    return config, output


def provenance_lines(record: dict) -> list[str]:
    """A generated page's provenance (`provenance.collect()`'s record): when, which versions,
    which CPU with its identity and caches, how many cores, which platform."""
    versions = record["versions"]
    return [f"- created {record['created']}; convprobe {versions.get('convprobe')}, TensorFlow "
            f"{versions.get('tensorflow')}, Keras {versions.get('keras')}, NumPy {versions.get('numpy')}",
            f"- CPU: {record['cpu']} (identity {json.dumps(record['cpu_identity'])}, caches "
            f"{json.dumps(record['cpu_caches'])}), {os.cpu_count()} cores; platform {record['platform']}"]


def write_page(path, lines: list[str]) -> int:
    """Write a generated docs page and name it on stdout; the script's exit status (0)."""
    Path(path).write_text("\n".join(lines), encoding="utf-8")
    print(path)
    return 0
