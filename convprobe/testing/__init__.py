"""convprobe's public pytest plugin (registered through the `pytest11` entry point)."""
