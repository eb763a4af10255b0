#!/usr/bin/env bash
# Runs HERE, on the CPU machine, from the repository root: stages .device/run24 (git-ignored) for
# cupy14-ab.sh: the platformdirs and filelock wheels the old trees need (the H200 has no network) and
# the two old ptxbackend trees as git archives.
#   PB020: 0.2.0 (dc44526).  PB030: 0.3.0 as last landed before issue 24 (91c624a; the version string
#   stayed 0.3.0 from 765f55a on).  PB040: 0.4.0 (4f6f762, the flat layout; ab-h200.sh's baseline).
set -euo pipefail
D=.device/run24
PB020=${PB020:-dc44526}
PB030=${PB030:-91c624a}
PB040=${PB040:-4f6f762}
mkdir -p "$D"
rm -f "$D"/*.whl
${PYTHON:-python3} -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform any -d "$D" platformdirs==4.3.6 filelock==3.16.1
git archive -o "$D/pb020.tar" "$PB020"
git archive -o "$D/pb030.tar" "$PB030"
git archive -o "$D/pb040.tar" "$PB040"
git check-ignore -q "$D" || echo "warning: $D is not git-ignored: it would travel as untracked files" >&2
ls -l "$D"
