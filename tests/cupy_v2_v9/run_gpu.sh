#!/usr/bin/env bash
# Issue 15's acceptance run on the GPU machine: one real CuPy v2-v9 release, stock and with ptxbackend's
# start-up hook.  From the repository root, with .device/cupy_v2_v9/<version> carried (see README.md):
#
#     V2V9_VERSION=7.8.0 bash tests/cupy_v2_v9/run_gpu.sh
#     V2V9_VERSION=9.6.0 bash tests/cupy_v2_v9/run_gpu.sh
#
# Writes $OUT/v2v9-<version>.json, $OUT/summary.txt, the outcomes of CuPy's tests so far
# ($OUT/v2v9-<version>-ledger.jsonl.gz: put it in .device/cupy_v2_v9/<version>/ledger/ for the next call)
# and one log per process; exits 1 if a check failed.
# Unpacks the staged interpreter at the path it was built for (/root/.pyenv/versions/3.X.Y) unless one
# from an earlier run is there; ptxbackend goes into a venv of it, never into the interpreter itself.
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
export OUT=${OUT:-/tmp/v2v9-out}
mkdir -p "$OUT"
version=${V2V9_VERSION:-7.8.0}

main() {
staged=$repo/.device/cupy_v2_v9/$version
work=${V2V9_WORK:-/tmp/v2v9-work-$version}
say() { echo "[run_gpu $((SECONDS))s] $*"; }
if [ ! -f "$staged/python.tar.xz" ]; then
  say "no $staged/python.tar.xz: run 'bash tests/cupy_v2_v9/build.sh' on the CPU machine and carry .device/cupy_v2_v9/$version"
  exit 2
fi
if [ "${V2V9_KEEP_CACHES:-0}" = 1 ] && [ -d "$work" ]; then
  # Keep step d's kernel caches from an earlier call on this (still warm) machine: a test that compiles
  # for longer than one call allows (9.6.0's @slow TestUfuncSlow) finishes in the next one.
  say "V2V9_KEEP_CACHES=1: keeping $(ls -d "$work"/home-d_* "$work"/ptxb-cache-d_* 2>/dev/null | tr '\n' ' ')"
  find "$work" -mindepth 1 -maxdepth 1 ! -name 'home-d_*' ! -name 'ptxb-cache-d_*' -exec rm -rf {} +
else
  rm -rf "$work"
fi
mkdir -p "$work"
nvidia-smi -L || true

# The interpreter, where it was built to live (its libpython is found through that prefix)
prefix=/$(tar -tJf "$staged/python.tar.xz" | head -n 1 | cut -d/ -f1-4)
short=$(basename "$prefix" | cut -d. -f1-2)
if [ -e "$prefix" ] && [ ! -f "$prefix/.ptxb-v2v9" ]; then
  say "$prefix exists and was not unpacked by this harness: not touching it"
  exit 2
fi
if [ ! -f "$prefix/.ptxb-v2v9" ] || [ "$(cat "$prefix/.ptxb-v2v9")" != "$(sha256sum < "$staged/python.tar.xz")" ]; then
  rm -rf "$prefix" && tar -xJf "$staged/python.tar.xz" -C / && sha256sum < "$staged/python.tar.xz" > "$prefix/.ptxb-v2v9"
fi
python=$prefix/bin/python$short
tar -xJf "$staged/libs.tar.xz" -C "$work"
say "$("$python" --version 2>&1) at $python; libraries: $(ls "$work/libs" | tr '\n' ' ')"

# The hook mode: a venv of the same interpreter that sees its packages, plus ptxbackend's wheel (built
# here from the checkout) and its two dependencies.  The old interpreter has no pip: the machine's installs.
python3 -m pip wheel -q --no-deps --no-index --no-build-isolation -w "$work/wheel" . || exit 2
"$python" -m venv --without-pip --system-site-packages "$work/venv-hook" || exit 2
python3 -m pip install -q --no-index --no-deps --no-compile --target "$work/venv-hook/lib/python$short/site-packages" \
  "$work"/wheel/ptxbackend-*.whl "$staged"/wheels/*.whl || exit 2
ls "$work/venv-hook/lib/python$short/site-packages"

cp -r "$staged/cupy_tests" "$work/cupy_tests"
export V2V9_VERSION=$version V2V9_WORK=$work V2V9_PYTHON=$python V2V9_HOOK_PYTHON=$work/venv-hook/bin/python \
  V2V9_LIBS=$work/libs V2V9_CUDA_PATH=$work/cuda V2V9_TESTS=$work/cupy_tests V2V9_LEDGER=${V2V9_LEDGER:-$staged/ledger}
say "setup done"
python3 tests/cupy_v2_v9/harness.py
}

main 2>&1 | tee "$OUT/run_gpu-$version.log"
exit "${PIPESTATUS[0]}"
