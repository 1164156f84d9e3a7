"""Render result rows as an aligned text table, CSV or JSON (files are written by `convprobe.files`).

Kept free of pandas so the CLI starts fast; the analysis layer builds DataFrames
from the same records.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os

from convprobe import files
from convprobe.errors import InvalidArgument
from convprobe.files import can_create_in, write_atomic
from convprobe.options import OutputFormat

__all__ = ["FORMATS", "render_table", "render_csv", "render_json", "write_atomic",
           "check_output_path", "can_create_in", "share_text"]

FORMATS = tuple(f.value for f in OutputFormat)  # plain strings: argparse shows their repr


def share_text(fraction: float, *, up: bool = False) -> str:
    """A share as a percentage that claims no end it has not reached. A share of matching
    outputs is rounded down, so it reads 100.0% only when every output matched (rounded to
    nearest, one mismatch in 8,640 would read 100.0%); `up` rounds a share of differing
    elements up, so it reads 0.0% only when none differs. Two places within 0.1% of that end."""
    if math.isnan(fraction):
        return "nan"
    if fraction >= 1.0 and not up:
        return "100.0%"
    if fraction <= 0.0 and up:
        return "0.0%"
    if up:  # (round: 0.982 * 1000 is 981.999...; the clamps keep a share off the end it has not reached)
        tenths, hundredths = max(math.ceil(round(fraction * 1000, 6)), 1), max(math.ceil(round(fraction * 10000, 6)), 1)
    else:
        tenths, hundredths = min(math.floor(round(fraction * 1000, 6)), 999), min(math.floor(round(fraction * 10000, 6)), 9999)
    if tenths == (1 if up else 999):
        return f"{hundredths / 100:.2f}%"
    return f"{tenths / 10:.1f}%"


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def render_table(rows: list[dict], columns: list[str] | None = None) -> str:
    """Plain aligned columns; wide free-text columns go last so the table stays readable."""
    if not rows:
        return "(no results)\n"
    columns = columns or list(rows[0])
    cells = [[_cell(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines) + "\n"


def render_csv(rows: list[dict]) -> str:
    if not rows:
        return ""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def render_json(document: dict) -> str:
    """Strict JSON: non-finite floats must already be encoded as strings."""
    return json.dumps(document, indent=2, sort_keys=False, allow_nan=False) + "\n"


def json_clean(value):
    """`value` with non-finite floats (nested in dicts, lists, tuples) as their repr
    strings, so `render_json` can stay strict."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: json_clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_clean(v) for v in value]
    return value


def check_output_path(path: str, file_format: str, argument: str = "--output") -> None:
    """Refuse, before any work, an output file whose suffix contradicts its format
    (``--format csv --output o.json``) or that could not be written (`convprobe.files`)."""
    suffix = os.path.splitext(path)[1].lower().lstrip(".")
    if suffix in FORMATS and suffix != "table" and suffix != file_format:
        raise InvalidArgument(f"{argument} {path!r} ends in .{suffix} but the output format is "
                              f"{file_format}; name it *.{file_format} or choose --format {suffix}")
    files.check_output_path(path, argument)
