#!/usr/bin/env bash
# Issue 16, machine 1 (a fresh H200 machine): warm cuRAND 10.2 (no sm_90 code) and pack the driver's JIT cache.
. benchmarks/device/setup.sh
D=.device/run4
site_wheels --no-compile /tmp/site $D/platformdirs-*.whl
site_wheels --no-compile /tmp/curand $D/nvidia_curand_cu11-*.whl
lib=$(ls /tmp/curand/nvidia/curand/lib/libcurand.so.10* | head -n 1)
gpu_line uuid
ls -la ~/.nv 2>/dev/null | head -3
echo "== warm --libs $lib --driver-jit-bundle"
PYTHONPATH=/tmp/site:$PWD /usr/bin/time -f "warm wall %e s" python3 -m ptxbackend warm --libs "$lib" \
  --driver-jit-bundle $OUT/curand-jit.tgz 2>&1
ls -la $OUT/curand-jit.tgz
python3 - <<'PY'
import tarfile, json, os
with tarfile.open(os.environ["OUT"] + "/curand-jit.tgz") as t:
    m = json.loads(t.extractfile("ptxbackend-driver-jit.json").read())
print(json.dumps({"driver": m["driver"], "gpus": m["gpus"], "libraries": m["libraries"],
                  "files": len(m["files"]), "bytes": sum(f["size"] for f in m["files"])}))
PY
