#!/usr/bin/env python
"""Regenerate the Vidur section of calibration/profiles.toml from the published operator profiles.

    python tools/vidur_profiles.py                      # data in ../shared/data/vidur-profiling
    python tools/vidur_profiles.py --data DIR --check   # exit 1 if the shipped file differs

Everything from fluidopt.calibration.vidur.GENERATED_MARK to the end of profiles.toml is replaced by
fluidopt.calibration.vidur.render_profiles(DIR); the hand-written profiles above it are kept. Deterministic:
the same data gives the same bytes (tests/calibrate/test_vidur.py checks the shipped file).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fluidopt.calibration.vidur import render_profiles, splice_profiles  # noqa: E402

TOML = ROOT / "calibration" / "profiles.toml"
DATA = ROOT.parent / "shared" / "data" / "vidur-profiling"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DATA), help=f"Vidur profiling folder (default {DATA})")
    ap.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = ap.parse_args(argv)
    generated, skipped = render_profiles(args.data)
    current = TOML.read_text(encoding="utf-8")
    new = splice_profiles(current, generated)
    if args.check:
        if new != current:
            print(f"{TOML} differs from a regeneration from {args.data}; run tools/vidur_profiles.py", file=sys.stderr)
            return 1
        print(f"{TOML} is up to date")
        return 0
    TOML.write_text(new, encoding="utf-8")
    print(f"wrote {TOML}: {generated.count(chr(10) + '[')} profiles, {len(skipped)} slices skipped")
    for s in skipped:
        print(f"  skipped {s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
