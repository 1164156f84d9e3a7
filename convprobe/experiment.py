"""What the scripts under experiments/ share: --config and --output, and the loaded config.

Each script is run as ``python experiments/<name>/run.py [--config FILE] [--output DIR]``
and keeps its parameters in ``config.json`` next to it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["parser", "load"]


def parser(doc: str, here: Path, *, output: str | None = None) -> argparse.ArgumentParser:
    """A parser described by the script's docstring, with --config (default
    here/config.json) and --output (default `output`, else here/results)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--config", default=str(here / "config.json"))
    p.add_argument("--output", default=output or str(here / "results"))
    return p


def load(args: argparse.Namespace, **overrides) -> tuple[dict, Path]:
    """(the config file with every override that is not None applied, the output
    folder, created)."""
    config = json.loads(Path(args.config).read_text(encoding="utf-8"))
    config.update({key: value for key, value in overrides.items() if value is not None})
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    return config, output
