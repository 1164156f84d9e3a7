"""Rebuild convprobe/data/tensor_core_validation.npz from a directory in the source layout.

Usage: python scripts/vendor_tensor_core_data.py SOURCE_DIR
(run by a developer when the data changes; convprobe itself reads only the .npz).
"""

import sys

from convprobe.probes.replay import bundled_path, load_directory, save_bundle

if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    sets = load_directory(sys.argv[1])
    save_bundle(sets, bundled_path())
    print(f"wrote {len(sets)} sets, {sum(s.vectors for s in sets)} vectors to {bundled_path()}")
