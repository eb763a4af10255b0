# Sourced (never run) by the device scripts beside it, from the repository root on the GPU machine: the
# set-up they share, in one place.  Defines functions only, besides PYTHONUNBUFFERED, OUT's default and
# PY; a script calls what it needs:
#   say TEXT            one progress line, "[TAG Ns] TEXT" (TAG: $TAG, default the script's name)
#   need PATH...        stop (exit 2) unless every staged PATH was carried, saying what to carry
#   site_wheels [--no-compile] DIR WHEEL...   pip install carried wheels (no index, no deps) into DIR
#                       (--target); byte-compiled unless --no-compile
#   unpack_tree NAME TAR     a ptxbackend tree staged by stage.sh (git archive) into /tmp/NAME
#   unpack_nvcc112      nvcc 11.2 from .device/nvcc112.tar.xz into /tmp/tk, unless LEGACY_NVCC112 or
#                       /tmp/tk has it; sets $nvcc112
#   chainer_site DIR    Chainer 1.24 (its bundled CuPy v1), numpy 1.26.4, six, platformdirs, filelock
#                       into DIR, CUDA 13's cuBLAS/cuRAND on LD_LIBRARY_PATH (as tests/legacy/run_gpu.sh)
#   gpu_line [FIELD...] the GPU, its driver and compute capability (and nvidia-smi's FIELDs), one line
# Staging happens HERE, before a device call: stage.sh (.device/run24), tests/legacy/build.sh
# (.device/legacy), `cp ../shared/toolkits/nvcc112.tar.xz .device/`.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/$(basename "$0" .sh)-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
D=.device/run24
L=.device/legacy

say() { echo "[${TAG:-$(basename "$0" .sh)} ${SECONDS}s] $*"; }

need() {
  local missing=0 p
  for p in "$@"; do
    [ -e "$p" ] || { say "missing $p: stage it here (stage.sh, tests/legacy/build.sh) and carry it"; missing=1; }
  done
  [ $missing = 0 ] || exit 2
}

site_wheels() {
  local flags=() dir
  [ "$1" = --no-compile ] && { flags=(--no-compile); shift; }
  dir=$1; shift
  "$PY" -m pip install -q --no-index --no-deps ${flags[@]+"${flags[@]}"} --target "$dir" "$@" || exit 2
}

unpack_tree() {
  rm -rf "/tmp/$1" && mkdir -p "/tmp/$1" && tar -xf "$2" -C "/tmp/$1" || exit 2
}

unpack_nvcc112() {
  nvcc112=${LEGACY_NVCC112:-/tmp/tk/nvcc112/bin/nvcc112}
  if [ ! -x "$nvcc112" ]; then
    need .device/nvcc112.tar.xz
    mkdir -p /tmp/tk && tar -xJf .device/nvcc112.tar.xz -C /tmp/tk || exit 2
    nvcc112=/tmp/tk/nvcc112/bin/nvcc112
  fi
}

chainer_site() {
  # apart, first on the children's PYTHONPATH (the scripts put --site there), shadowing this Python's
  # numpy and CuPy
  local dir=$1 platformdirs d
  rm -rf "$dir"
  platformdirs=$(ls $L/platformdirs-*.whl $D/platformdirs-*.whl 2>/dev/null | head -n 1)
  site_wheels --no-compile "$dir" $L/chainer-1.24.0-*.whl $L/numpy-1.26.4-*.whl $L/six-*.whl $platformdirs $D/filelock-*.whl
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
  return 0
}

gpu_line() {
  local fields=name,driver_version,compute_cap f
  for f in "$@"; do fields=$fields,$f; done
  nvidia-smi --query-gpu=$fields --format=csv,noheader
}
