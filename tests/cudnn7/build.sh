#!/usr/bin/env bash
# Stage the real cuDNN 7 of the user's generation for the GPU machine (issue 28), on the CPU machine.  From
# the repository root:
#
#     bash tests/cudnn7/build.sh
#
# cupy-cuda80 7.8.0 bundles cupy/.data/lib/libcudnn.so.7 (cuDNN 7.1.2, 203 MB, the CUDA 8 runtime linked in
# statically; it needs only glibc and libstdc++).  One call to the GPU machine carries 64 MiB at most, so
# .device/cudnn7/ gets:
#   libcudnn.so.7.xz.part-NN  the library, xz -9, split into $CUDNN7_PART_MB MiB parts (default 56), one per call
#   SHA256SUMS                the SHA-256 of the library, of the .xz and of every part (run_gpu.sh checks all)
#   wheels/                   filelock and platformdirs (the GPU machine has no network) for ptxbackend's venv
# and prints the carry of each call.  Before staging it checks the library here, without a GPU: it loads
# with ctypes and answers cudnnGetVersion() = 7102, cudnnGetCudartVersion() = 8000 (program.py --dry-run).
#
# The wheel: $CUDNN7_WHEEL, else the copy the CuPy v2-v9 harness downloaded, else pip downloads it into
# $CUDNN7_BUILD_DIR (default /tmp/ptxb-cudnn7-build; reused).  Network: PyPI only.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
work=${CUDNN7_BUILD_DIR:-/tmp/ptxb-cudnn7-build}
out=$repo/.device/cudnn7
part_mb=${CUDNN7_PART_MB:-56}
host_python=${CUDNN7_HOST_PYTHON:-python3}
member=cupy/.data/lib/libcudnn.so.7
say() { echo "[build $((SECONDS))s] $*"; }
die() { echo "[build] ERROR: $*" >&2; exit 1; }

mkdir -p "$work/dl"
wheel=${CUDNN7_WHEEL:-}
if [ -z "$wheel" ]; then
  for candidate in /tmp/ptxb-v2v9-build/dl/cp37/cupy_cuda80-7.8.0-cp37-cp37m-manylinux1_x86_64.whl \
                   "$work"/dl/cupy_cuda80-7.8.0-cp37-cp37m-manylinux1_x86_64.whl; do
    [ -f "$candidate" ] && wheel=$candidate && break
  done
fi
if [ -z "$wheel" ]; then
  say "downloading cupy-cuda80==7.8.0 (about 300 MB)"
  "$host_python" -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: \
    --platform manylinux1_x86_64 --python-version 3.7 -d "$work/dl" cupy-cuda80==7.8.0
  wheel=$(ls "$work"/dl/cupy_cuda80-7.8.0-*.whl | head -n 1)
fi
[ -f "$wheel" ] || die "no cupy-cuda80 7.8.0 wheel at $wheel"
say "wheel: $wheel"

lib=$work/libcudnn.so.7
"$host_python" - "$wheel" "$member" "$lib" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open(sys.argv[2]) as src, open(sys.argv[3] + ".tmp", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
mv "$lib.tmp" "$lib"
lib_sha=$(sha256sum < "$lib" | cut -d' ' -f1)
say "libcudnn.so.7: $(stat -c %s "$lib") bytes, sha256 $lib_sha"

# The CPU check: the real library loads and answers its version without a GPU.
if "$host_python" -c "import numpy" 2>/dev/null; then
  check=$("$host_python" tests/cudnn7/program.py --lib "$lib" --dry-run 2>/dev/null)
else
  check=$("$host_python" -c "import ctypes, json, sys; l = ctypes.CDLL(sys.argv[1]); print(json.dumps(dict(
cudnn_version=l.cudnnGetVersion(), cudart_version=l.cudnnGetCudartVersion())))" "$lib")
fi
say "CPU check: $check"
case $check in *'"cudnn_version": 7102, "cudart_version": 8000'*) ;; *) die "not cuDNN 7102 on CUDA 8000" ;; esac

# Compress once per library content (xz -9 of 203 MB takes minutes on a small machine).
xz_file=$work/libcudnn.so.7.xz
if [ ! -f "$xz_file" ] || [ "$(cat "$xz_file.of" 2>/dev/null)" != "$lib_sha" ]; then
  say "xz -9 (minutes)"
  xz -9 -T1 -k -c "$lib" > "$xz_file.tmp" && mv "$xz_file.tmp" "$xz_file"
  echo "$lib_sha" > "$xz_file.of"
fi
[ "$(xz -dc "$xz_file" | sha256sum | cut -d' ' -f1)" = "$lib_sha" ] || die "$xz_file does not decompress to the library"

rm -rf "$out" && mkdir -p "$out/wheels"
split -b "${part_mb}M" -d -a 2 "$xz_file" "$out/libcudnn.so.7.xz.part-"
"$host_python" -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: -d "$out/wheels" \
  filelock platformdirs
{
  echo "$lib_sha  libcudnn.so.7"
  echo "$(sha256sum < "$xz_file" | cut -d' ' -f1)  libcudnn.so.7.xz"
  (cd "$out" && sha256sum libcudnn.so.7.xz.part-*)
} > "$out/SHA256SUMS"
cat "$out/SHA256SUMS"
du -sh "$out"/*

parts=$(cd "$out" && ls libcudnn.so.7.xz.part-*)
say "staged $(echo "$parts" | wc -l) parts. One device call each, in order (README.md has the commands):"
for part in $parts; do
  echo "  carry: [\".device/cudnn7/SHA256SUMS\", \".device/cudnn7/wheels\", \".device/cudnn7/$part\"]"
done
