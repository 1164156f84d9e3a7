"""Render result rows as an aligned text table, CSV or JSON, and write files atomically.

Kept free of pandas so the CLI starts fast; the analysis layer builds DataFrames
from the same records.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile

from convprobe.options import OutputFormat

__all__ = ["FORMATS", "render_table", "render_csv", "render_json", "write_atomic",
           "check_output_path", "can_create_in"]

FORMATS = tuple(f.value for f in OutputFormat)  # plain strings: argparse shows their repr


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
    """Refuse, before any work, an output file that could not be written or whose suffix
    contradicts its format (``--format csv --output o.json``)."""
    from convprobe.errors import InvalidArgument

    suffix = os.path.splitext(path)[1].lower().lstrip(".")
    if suffix in FORMATS and suffix != "table" and suffix != file_format:
        raise InvalidArgument(f"{argument} {path!r} ends in .{suffix} but the output format is "
                              f"{file_format}; name it *.{file_format} or choose --format {suffix}")
    if os.path.isdir(path) or path.endswith(os.sep):
        raise InvalidArgument(f"{argument} must be a file path; received the directory {path!r}")
    existing = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not can_create_in(existing):
        raise InvalidArgument(f"{argument} {path!r} cannot be written: {existing!r} is not a "
                              f"writable directory")


def can_create_in(directory: str) -> bool:
    """Whether a file can really be created there (access() says yes to root on /proc)."""
    try:
        with tempfile.TemporaryFile(dir=directory, prefix=".convprobe-check-"):
            return True
    except OSError:
        return False


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: str, text: str) -> None:
    """Write via a temporary file and rename, so a failure never leaves half a file. The file
    gets the mode a plain open() would give it (0666 less the umask), not mkstemp's 0600."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".convprobe-", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
