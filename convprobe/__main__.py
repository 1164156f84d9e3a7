"""`python -m convprobe` is the `convprobe` command."""

from convprobe.cli import main

raise SystemExit(main())
