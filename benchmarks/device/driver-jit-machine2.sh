#!/usr/bin/env bash
# Issue 16, machine 2 (another fresh H200 machine): import the bundle, then a fresh process's first cuRAND call.
. benchmarks/device/setup.sh
D=.device/run4
site_wheels --no-compile /tmp/site $D/platformdirs-*.whl
site_wheels --no-compile /tmp/curand2 $D/nvidia_curand_cu11-*.whl
lib=$(ls /tmp/curand2/nvidia/curand/lib/libcurand.so.10* | head -n 1)
gpu_line uuid
# ptxbackend installed as users install it (its .pth hook sets CUDA_CACHE_PATH), platformdirs beside it
python3 -m pip wheel -q --no-deps --no-index --no-build-isolation -w /tmp/wheel . || exit 2
python3 -m pip install -q --no-index --no-deps /tmp/wheel/ptxbackend-*.whl || exit 2
export PYTHONPATH=/tmp/site
echo "== cache import"
python3 -m ptxbackend cache import $D/curand-jit.tgz
echo "== doctor (driver JIT cache part)"
python3 -m ptxbackend doctor 2>&1 | grep -A2 "driver JIT cache"
echo "== a fresh process: create + first generate (the library at another path than on machine 1)"
for i in 1 2; do
  python3 -c "import os, json; from ptxbackend.deploy.library_warmup import child; r = child('curand', '$lib'); print(json.dumps(r))"
done
echo "== the same with the hook off (no imported set: the driver JITs)"
PTXBACKEND_DISABLE=1 CUDA_CACHE_PATH=/tmp/empty-jit timeout 120 python3 -c "import json; from ptxbackend.deploy.library_warmup import child; print(json.dumps(child('curand', '$lib')))"
python3 -m pip uninstall -q -y ptxbackend
echo "== benchmarks: the library section (first process, second process, new machine)"
PYTHONPATH=/tmp/site timeout 330 python3 benchmarks/run.py --sections libraries --curand "$lib" --no-plots --out $OUT/bench-lib > $OUT/bench-lib.log 2>&1
echo "rc=$?"; sed -n '/## 5/,$p' $OUT/bench-lib/results.md | head -20
