#!/usr/bin/env bash
# Device call (issue 24), from the repository root on the H200: stock CuPy 14 against the start-up hook
# of 0.2.0, 0.3.0 and this working tree, fresh processes, 100 distinct kernels, ABAB rounds
# (benchmarks/run.py cupy-ab). Carries .device/run24 (benchmarks/device/stage.sh makes it).
# Fits in 9 minutes: ~70 s a round (per arm: cold ~14 s at ~0.11 s/kernel, warm ~3 s), so at most 6
# rounds, and no round is started that the longest so far would push past 430 s; the hard stop at
# 500 s still leaves the rounds done (results.json and summary.md are rewritten after each round).
. benchmarks/device/setup.sh
site_wheels /tmp/site $D/*.whl
export PYTHONPATH=/tmp/site
unpack_tree pb020 $D/pb020.tar
unpack_tree pb030 $D/pb030.tar
gpu_line
timeout 500 python3 benchmarks/run.py cupy-ab --tree 0.2.0=/tmp/pb020 --tree 0.3.0=/tmp/pb030 --tree now="$PWD" \
  --rounds 6 --budget-s 430 --child-timeout 120 --out "$OUT/cupy14-ab" > "$OUT/cupy14-ab.log" 2>&1
echo "rc=$?"
grep -E "^(check|round|budget)" "$OUT/cupy14-ab.log" | cut -c1-200
cat "$OUT/cupy14-ab/summary.md" 2>/dev/null || tail -n 40 "$OUT/cupy14-ab.log"
