#!/usr/bin/env bash
# Issue 28 on the GPU machine: the real cuDNN 7 (cupy-cuda80 7.8.0) on a GPU it has no code for.  From the
# repository root, one call per staged part first, then the scenarios (README.md has the exact calls):
#
#     bash tests/cudnn7/run_gpu.sh                                   # stage what this call carried
#     CUDNN7_STEPS=stock,small,warm bash tests/cudnn7/run_gpu.sh     # then run scenarios, resuming
#
# Everything lives under $CUDNN7_HOME (default /tmp/cudnn7), which stays while the machine is warm: the
# parts received so far, the library in a cupy/.data/lib layout, ptxbackend's venv, and each scenario's own
# driver JIT cache and records, so a warm-up longer than one call continues in the next.  Writes
# $OUT/cudnn7-runs.jsonl (every process so far), $OUT/summary.txt and $OUT/run_gpu.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
export OUT=${OUT:-/tmp/cudnn7-out}
export CUDNN7_HOME=${CUDNN7_HOME:-/tmp/cudnn7}
export CUDNN7_STARTED=$(date +%s)
mkdir -p "$OUT" "$CUDNN7_HOME/parts"

main() {
staged=${CUDNN7_STAGED:-$repo/.device/cudnn7}
home=$CUDNN7_HOME
say() { echo "[run_gpu $((SECONDS))s] $*"; }
lib=$home/site/cupy/.data/lib/libcudnn.so.7
nvidia-smi -L || true

if [ ! -f "$lib" ]; then
  [ -f "$staged/SHA256SUMS" ] || { say "no $staged/SHA256SUMS: run tests/cudnn7/build.sh and carry it"; exit 2; }
  cp "$staged/SHA256SUMS" "$home/SHA256SUMS"
  # Each part is checked as it arrives, so a bad carry is named by the call that brought it.
  for part in "$staged"/libcudnn.so.7.xz.part-*; do
    [ -f "$part" ] || continue
    name=$(basename "$part")
    want=$(awk -v n="$name" '$2 == n {print $1}' "$home/SHA256SUMS")
    got=$(sha256sum < "$part" | cut -d' ' -f1)
    if [ -z "$want" ] || [ "$got" != "$want" ]; then say "$name: sha256 $got, SHA256SUMS says '${want}'"; exit 2; fi
    cp "$part" "$home/parts/$name" && say "$name received and checked"
  done
  missing=$(awk '$2 ~ /part-/ {print $2}' "$home/SHA256SUMS" | while read -r n; do [ -f "$home/parts/$n" ] || echo "$n"; done)
  if [ -n "$missing" ]; then
    say "still to carry: $(echo $missing)"
    exit 0
  fi
  cat "$home"/parts/libcudnn.so.7.xz.part-* > "$home/libcudnn.so.7.xz"
  (cd "$home" && grep -E '  libcudnn\.so\.7\.xz$' SHA256SUMS | sha256sum -c -) || exit 2
  mkdir -p "$(dirname "$lib")"
  xz -dc "$home/libcudnn.so.7.xz" > "$lib.tmp" && mv "$lib.tmp" "$lib"
  (cd "$(dirname "$lib")" && grep -E '  libcudnn\.so\.7$' "$home/SHA256SUMS" | sha256sum -c -) || { rm -f "$lib"; exit 2; }
  rm -rf "$home/parts" "$home/libcudnn.so.7.xz"
  say "libcudnn.so.7 in place: $lib"
fi
[ "${CUDNN7_STAGE_ONLY:-0}" = 1 ] && exit 0

# ptxbackend from this checkout, in a venv that sees the machine's numpy (its .pth hook is active there;
# the stock runs use the machine's python3, where ptxbackend is not installed, with PTXBACKEND_DISABLE=1).
venv=$home/venv
[ -x "$venv/bin/python" ] || python3 -m venv --without-pip --system-site-packages "$venv" || exit 2
site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# The machine's python3 may itself be a venv (numpy there, not in the base interpreter that
# --system-site-packages exposes): its site directories go on this venv's path too.
python3 -c "import site, sys; print('\n'.join(p for p in site.getsitepackages() if p.startswith(sys.prefix)))" \
  > "$site/machine-python3.pth"
rm -rf "$home/wheel" && python3 -m pip wheel -q --no-deps --no-index --no-build-isolation -w "$home/wheel" . || exit 2
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" \
  "$home"/wheel/ptxbackend-*.whl $(ls "$staged"/wheels/*.whl 2>/dev/null || ls "$home"/wheels/*.whl) || exit 2
if [ -d "$staged/wheels" ]; then mkdir -p "$home/wheels" && cp "$staged"/wheels/*.whl "$home/wheels/"; fi
say "venv: $venv ($("$venv/bin/python" -c 'import ptxbackend; print(ptxbackend.__version__)'))"

if [ -z "${CUDNN7_STEPS:-}" ]; then
  say "library staged; no CUDNN7_STEPS given: done"
  exit 0
fi
export CUDNN7_LIB=$lib CUDNN7_VENV_PYTHON=$venv/bin/python CUDNN7_SITE=$home/site
"$venv/bin/python" tests/cudnn7/scenarios.py
}

main 2>&1 | tee "$OUT/run_gpu.log"
exit "${PIPESTATUS[0]}"
