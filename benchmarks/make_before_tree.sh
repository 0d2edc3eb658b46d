#!/usr/bin/env bash
# Export a commit of this repository to a directory and build its compiled simulator core in place,
# for `python benchmarks/bench_sim.py compare --before DIR`.
#
#     benchmarks/make_before_tree.sh [COMMIT] [DIR]        # defaults: cbb4f9a /tmp/fluidopt_before
#     benchmarks/make_before_tree.sh WORKTREE /tmp/fluidopt_after
#
# The export is `git archive` (the repository's worktree list is not touched). COMMIT = WORKTREE
# copies the working tree as it is now instead (tracked and untracked files that git does not
# ignore): an AFTER tree with a compiled core of its own, when the installed one is stale or the
# working tree is being edited, without touching the repository's build or its virtualenv. The core is built by
# that tree's own setup.py (`build_ext --inplace`), so it carries the SHA-256 of that tree's
# engine.py and engine.pxd and is valid there. setup.py needs Cython, which `pip install -e .` only
# has in its isolated build environment: when the Python that runs this has no Cython, a small
# build venv (BUILD_VENV, default /tmp/fluidopt_cython_venv) is made from the same base interpreter
# with the Cython and setuptools versions pinned below (the extension is then ABI-compatible with it).
set -euo pipefail

COMMIT=${1:-cbb4f9a}
DIR=${2:-/tmp/fluidopt_before}
PY=${PYTHON:-python}
BUILD_VENV=${BUILD_VENV:-/tmp/fluidopt_cython_venv}
REPO=$(cd "$(dirname "$0")/.." && pwd)

rm -rf "$DIR"
mkdir -p "$DIR"
if [ "$COMMIT" = WORKTREE ]; then
    (cd "$REPO" && git ls-files -z -c -o --exclude-standard | xargs -0 tar -c --ignore-failed-read -f -) | tar -x -C "$DIR"
    echo "working tree of $(git -C "$REPO" rev-parse HEAD), $(date -u +%FT%TZ)" > "$DIR/COMMIT"
else
    git -C "$REPO" archive "$COMMIT" | tar -x -C "$DIR"
    git -C "$REPO" rev-parse "$COMMIT" > "$DIR/COMMIT"
fi

if "$PY" -c "import Cython" 2>/dev/null; then
    BUILD_PY=$PY
else
    BASE=$("$PY" -c "import sys, os; print(os.path.join(sys.base_prefix, 'bin', 'python3'))")
    if [ ! -x "$BUILD_VENV/bin/python" ]; then
        "$BASE" -m venv "$BUILD_VENV"
        "$BUILD_VENV/bin/pip" install -q "cython==3.3.1" "setuptools==84.2.1" wheel
    fi
    BUILD_PY=$BUILD_VENV/bin/python
fi

(cd "$DIR" && "$BUILD_PY" setup.py build_ext --inplace > build_ext.log 2>&1) || {
    tail -30 "$DIR/build_ext.log"; exit 1; }

# check with the benchmark's interpreter: the tree's fluidopt must import and find its compiled core valid
cd /tmp
PYTHONPATH="$DIR" "$PY" - "$DIR" <<'EOF'
import sys
from pathlib import Path

import fluidopt

try:
    from fluidopt.sim.backend import compiled_status
except ImportError:  # trees from before backend selection moved out of fluidopt/sim/core.py
    from fluidopt.sim.core import compiled_status

ok, why = compiled_status()
where = Path(fluidopt.__file__).resolve()
print(f"{where.parent}: {'compiled' if ok else 'NOT compiled'} ({why})")
if not ok or not where.is_relative_to(Path(sys.argv[1]).resolve()):
    sys.exit(1)
EOF
