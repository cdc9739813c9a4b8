#!/usr/bin/env python3
"""Write the StoryLM-0 fixture (manifest, checkpoint, vocab, corpus) reproducibly.

    python scripts/make_fixtures.py            # (re)write fixtures/storylm0/
    python scripts/make_fixtures.py --out DIR  # write somewhere else
    python scripts/make_fixtures.py --check    # regenerate into a temp folder and compare bytes

--check exits 1 when a committed file differs from what the recipe produces (or is missing).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a plain script from a source checkout
    sys.path.insert(0, str(REPO_ROOT))

from storylm.fixture import DEFAULT_FIXTURE_DIR, write_fixture  # noqa: E402


def differing_files(expected_dir: Path, actual_dir: Path) -> list[str]:
    """Names of the files in `expected_dir` whose bytes differ in `actual_dir` (or are absent)."""
    differing = []
    for expected in sorted(expected_dir.iterdir()):
        actual = actual_dir / expected.name
        if not actual.is_file() or actual.read_bytes() != expected.read_bytes():
            differing.append(expected.name)
    return differing


def check(fixture_dir: Path) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        fresh_dir = write_fixture(Path(scratch))
        differing = differing_files(fresh_dir, fixture_dir)
    for name in differing:
        print(f"{fixture_dir / name}: differs from the regenerated file", file=sys.stderr)
    if differing:
        print("run scripts/make_fixtures.py to regenerate", file=sys.stderr)
        return 1
    print(f"{fixture_dir}: up to date")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_FIXTURE_DIR,
                        help="fixture folder (default: fixtures/storylm0 in the repo)")
    parser.add_argument("--check", action="store_true",
                        help="compare the folder with a fresh generation instead of writing")
    args = parser.parse_args(argv)
    if args.check:
        return check(args.out)
    for path in sorted(write_fixture(args.out).iterdir()):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
