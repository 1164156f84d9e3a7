"""mkdocs hook: the notebooks live in notebooks/ (where users run them), not in docs/; the site
renders them from there, so there is one copy."""

from __future__ import annotations

from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent


@event_priority(100)  # before mkdocs-jupyter, which turns .ipynb files into pages
def on_files(files, config):
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        files.append(File(f"notebooks/{notebook.name}", str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files
