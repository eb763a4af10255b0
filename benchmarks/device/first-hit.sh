#!/usr/bin/env bash
# Device call: where the first warm hit of a CuPy 14 kernel goes, 0.4.0 against this tree (cold child, two
# warm children, then a cProfile of the first hit per tree into $OUT/prof-*.txt). Carry .device/run24
# (benchmarks/device/stage.sh). About 25 s.
set -u
OUT=${OUT:-/tmp/first-hit-out}
. benchmarks/device/setup.sh
site_wheels /tmp/site $D/*.whl
unpack_tree pb040 $D/pb040.tar
export PYTHONPATH=/tmp/site PTXBACKEND_DISABLE=1
python3 -c "import cupy; print(cupy.__version__, cupy.cuda.get_nvrtc_path() if hasattr(cupy.cuda,'get_nvrtc_path') else '')"
for tree in /tmp/pb040 $PWD; do
  base=/tmp/c-$(basename $tree); rm -rf $base; mkdir -p $base
  export PTXBACKEND_CACHE_DIR=$base/pb CUPY_CACHE_DIR=$base/cupy CUDA_CACHE_PATH=$base/jit
  python3 benchmarks/device/probes/first_hit.py cold $tree 2>&1 | grep RESULT
  python3 benchmarks/device/probes/first_hit.py warm $tree 2>&1 | grep RESULT
  python3 benchmarks/device/probes/first_hit.py warm $tree 2>&1 | grep RESULT
done
for tree in /tmp/pb040 $PWD; do
  base=/tmp/c-$(basename $tree)
  export PTXBACKEND_CACHE_DIR=$base/pb CUPY_CACHE_DIR=$base/cupy CUDA_CACHE_PATH=$base/jit
  python3 benchmarks/device/probes/first_hit.py prof $tree 2>&1 | grep -v "^$" | head -120 > $OUT/prof-$(basename $tree).txt
  head -3 $OUT/prof-$(basename $tree).txt
done
python3 -m ptxbackend doctor > $OUT/doctor.txt 2>&1; head -40 $OUT/doctor.txt
