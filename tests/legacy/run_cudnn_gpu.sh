#!/usr/bin/env bash
# Chainer 1.24 with cuDNN on, on the GPU machine (issue 39).  From the repository root, in several calls
# on one warm machine (README.md, "cuDNN on", has the exact calls and carries):
#
#     bash tests/legacy/run_cudnn_gpu.sh                             # stage what this call carried
#     CUDNN_STEPS=warm,functions bash tests/legacy/run_cudnn_gpu.sh  # once everything is staged
#
# Everything lives under $CUDNN_HOME (default /tmp/legacy-cudnn), kept while the machine stays warm: the
# library parts received so far, then libcudnn.so.7 in $CUDNN_HOME/lib, the wheels, Chainer 1.24 +
# numpy 1.26 in $CUDNN_HOME/site (first on PYTHONPATH: they shadow the machine's numpy 2 and CuPy 14),
# nvcc 11.2, the driver JIT cache ($CUDNN_HOME/jit) and ptxbackend's caches.  ptxbackend is installed
# into python3's environment (its .pth hook active) for the steps and removed at the end of each call.
# Writes $OUT/summary.txt, $OUT/cudnn-gpu.json, one log per process.
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
export OUT=${OUT:-/tmp/legacy-cudnn-out}
export CUDNN_HOME=${CUDNN_HOME:-/tmp/legacy-cudnn}
mkdir -p "$OUT" "$CUDNN_HOME/parts" "$CUDNN_HOME/wheels" "$CUDNN_HOME/lib"

main() {
staged=${CUDNN_STAGED:-$repo/.device/legacy-cudnn}
home=$CUDNN_HOME
PY=${PYTHON:-python3}
say() { echo "[run_cudnn_gpu $((SECONDS))s] $*"; }
nvidia-smi -L || true

# 1. What this call carried: library parts (each checked against SHA256SUMS as it arrives), wheels, nvcc 11.2
[ -f "$staged/SHA256SUMS" ] && cp "$staged/SHA256SUMS" "$home/SHA256SUMS"
lib=$home/lib/libcudnn.so.7
if [ ! -f "$lib" ]; then
  [ -f "$home/SHA256SUMS" ] || { say "no SHA256SUMS: carry .device/legacy-cudnn/SHA256SUMS (bash tests/legacy/build.sh)"; exit 2; }
  for part in "$staged"/libcudnn.so.7.xz.part-*; do
    [ -f "$part" ] || continue
    name=$(basename "$part")
    want=$(awk -v n="$name" '$2 == n {print $1}' "$home/SHA256SUMS")
    got=$(sha256sum < "$part" | cut -d' ' -f1)
    if [ -z "$want" ] || [ "$got" != "$want" ]; then say "$name: sha256 $got, SHA256SUMS says '$want'"; exit 2; fi
    cp "$part" "$home/parts/$name" && say "$name received and checked"
  done
  missing=$(awk '$2 ~ /part-/ {print $2}' "$home/SHA256SUMS" | while read -r n; do [ -f "$home/parts/$n" ] || echo "$n"; done)
  if [ -z "$missing" ]; then
    cat "$home"/parts/libcudnn.so.7.xz.part-* > "$home/libcudnn.so.7.xz"
    (cd "$home" && grep -E '  libcudnn\.so\.7\.xz$' SHA256SUMS | sha256sum -c -) || exit 2
    xz -dc "$home/libcudnn.so.7.xz" > "$lib.tmp" && mv "$lib.tmp" "$lib"
    (cd "$home/lib" && grep -E '  libcudnn\.so\.7$' "$home/SHA256SUMS" | sha256sum -c -) || { rm -f "$lib"; exit 2; }
    rm -rf "$home/parts" "$home/libcudnn.so.7.xz"
    say "libcudnn.so.7 in place: $lib"
  else
    say "library parts still to carry: $(echo $missing)"
  fi
fi
if [ -d "$staged/wheels" ]; then cp "$staged"/wheels/*.whl "$home/wheels/" && say "wheels received"; fi
if [ -f "$staged/nvcc112.tar.xz" ] && [ ! -x "$home/tk/nvcc112/bin/nvcc112" ]; then
  mkdir -p "$home/tk" && tar -xJf "$staged/nvcc112.tar.xz" -C "$home/tk" && say "nvcc 11.2 unpacked"
fi
if [ ! -f "$lib" ] || ! ls "$home"/wheels/chainer-1.24.0-*.whl >/dev/null 2>&1; then
  say "staged so far: $(ls "$home/lib" "$home/wheels" | tr '\n' ' '); carry the rest in the next call"
  exit 0
fi
[ -z "${CUDNN_STEPS:-}" ] && { say "everything staged; no CUDNN_STEPS given: done"; exit 0; }

# 2. Chainer 1.24 (+ its CuPy v1 with cupy.cuda.cudnn), numpy 1.26.4, six: apart, first on PYTHONPATH
if [ ! -d "$home/site/chainer" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$home/site" \
    "$home"/wheels/chainer-1.24.0-*.whl "$home"/wheels/numpy-1.26.4-*.whl "$home"/wheels/six-*.whl \
    "$home"/wheels/platformdirs-*.whl "$home"/wheels/filelock-*.whl || exit 2
fi
# cuBLAS/cuRAND of CUDA 13 for the bundled CuPy (as run_gpu.sh)
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
# The nvcc each run finds on PATH: CUDA 13's (knows sm_90) or 11.2 (does not): scripts, not links
nvcc13=/usr/local/cuda/bin/nvcc
[ -x "$nvcc13" ] || nvcc13=$(command -v nvcc)
mkdir -p "$home/bin13" && printf '#!/bin/sh\nexec %s "$@"\n' "$nvcc13" > "$home/bin13/nvcc" && chmod +x "$home/bin13/nvcc"
if [ -x "$home/tk/nvcc112/bin/nvcc112" ]; then
  mkdir -p "$home/bin112" && printf '#!/bin/sh\nexec %s "$@"\n' "$home/tk/nvcc112/bin/nvcc112" > "$home/bin112/nvcc" \
    && chmod +x "$home/bin112/nvcc"
fi

# 3. ptxbackend as a user installs it (a wheel; its .pth hook), removed again at the end of the call
rm -rf "$home/wheel" && "$PY" -m pip wheel -q --no-deps --no-index --no-build-isolation -w "$home/wheel" . || exit 2
# (its dependencies, filelock and platformdirs, are in $home/site, on every run's PYTHONPATH)
"$PY" -m pip install -q --no-index --no-deps --force-reinstall "$home"/wheel/ptxbackend-*.whl || exit 2
trap '"$PY" -m pip uninstall -q -y ptxbackend' EXIT
say "setup done; steps: $CUDNN_STEPS"
export PYTHON=$PY
"$PY" tests/legacy/cudnn_gpu.py
}

main 2>&1 | tee "$OUT/run_cudnn_gpu.log"
exit "${PIPESTATUS[0]}"
