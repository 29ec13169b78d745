"""Regenerate the golden vectors in ``tests/vectors/`` -- deliberately, by hand.

Run from the repository root::

    python tests/protocol/make_vectors.py            # write every vector
    python tests/protocol/make_vectors.py --check    # only report differences

Regenerating changes the committed on-disk/on-wire format. Do it only for an
intended format change, review ``git diff tests/vectors``, and note it in
CHANGELOG.md. The test suite never calls this module's writer.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from protocol_vectors import MANIFEST, VECTORS, VECTORS_DIR, encode


def render() -> tuple[dict[str, bytes], str]:
    """Every vector's bytes and the manifest text, computed from the constructions."""
    blobs = {name: encode(vector) for name, vector in sorted(VECTORS.items())}
    manifest = {
        name: {"kind": VECTORS[name].kind, "file": f"{name}.msgpack", "hex": blob.hex()}
        for name, blob in blobs.items()
    }
    return blobs, json.dumps(manifest, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report differences, write nothing")
    args = parser.parse_args(argv)
    blobs, manifest_text = render()
    changed = [
        name
        for name, blob in blobs.items()
        if not (VECTORS_DIR / f"{name}.msgpack").exists()
        or (VECTORS_DIR / f"{name}.msgpack").read_bytes() != blob
    ]
    wanted = {f"{name}.msgpack" for name in blobs}
    stale = sorted(p.name for p in VECTORS_DIR.glob("*.msgpack") if p.name not in wanted)
    manifest_changed = not MANIFEST.exists() or MANIFEST.read_text() != manifest_text
    for name in changed:
        print(f"{'differs' if args.check else 'writing'}: {name}.msgpack")
    for name in stale:
        print(f"{'stale' if args.check else 'removing'}: {name}")
    if manifest_changed:
        print(f"{'differs' if args.check else 'writing'}: {MANIFEST.name}")
    if args.check:
        return 1 if changed or stale or manifest_changed else 0
    VECTORS_DIR.mkdir(exist_ok=True)
    for name in changed:
        (VECTORS_DIR / f"{name}.msgpack").write_bytes(blobs[name])
    for name in stale:
        (VECTORS_DIR / name).unlink()
    if manifest_changed:
        MANIFEST.write_text(manifest_text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
