#!/usr/bin/env bash
# The device run's test call rehearsed on this CPU (docs/gpu.md): a clone of the committed HEAD holding only the
# weights that `python tools/gpu_parts.py carry PART` names for the PARTS given (joined by "+": ar+dlm+rest is a
# machine kept warm through the three calls, rest alone one that went cold before the last) and no docs/results, as
# the device's checkout is then, and the whole suite, as tools/gpu_run.sh's `rest` runs it, with
# FASTDECODE_TEST_DEVICE=sim: the simulated device of tests/device_sim.py, the CPU under the name cpu:0 (so that a
# test failing on a file the calls did not carry is skipped as on the device, tests/carried.py) refusing a host tensor
# beside a device one and a host generator for the device's sampling, as a GPU does. A failure here is one the device
# would show too, apart from what only a GPU shows. DEVICE=cpu:0 runs it without the simulation (about 3 times faster).
#
#   tools/gpu_dry_run.sh ar+dlm+rest|rest|... [FOLDER]     # FOLDER default /tmp/gpu-dry-run-PARTS; about 20 minutes
#
# with the device's pytest options but WORKERS processes (default 2; the device has the plugins they need, here:
# pip install --no-deps pytest-xdist execnet pytest-timeout).
#
# The log and JUnit file have the device run's names (tools/gpu_parts.py `LOG`), so `python tools/gpu_verdict.py
# /tmp/gpu-dry-run-rest` says which tests never ran (its other lines count device rows only: "not measured").
set -eu
parts=${1:?parts: ar, dlm, rest, joined by +}
root=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
py=${PYTHON:-$root/.venv/bin/python}
dir=${2:-/tmp/gpu-dry-run-$parts}
rm -rf "$dir"
git clone -q "$root" "$dir"
cd "$dir"
# the weights of the parts not named stay behind (a part's weights: gpu_parts.weights_in), and the committed results
$py - "$parts" <<'EOF'
import sys
sys.path.insert(0, "tools")
import gpu_parts
kept = sys.argv[1].split("+")
for part, paths in gpu_parts.PARTS.items():
    if part not in kept:
        for weights in (w for path in paths for w in gpu_parts.weights_in(path)):
            weights.unlink(missing_ok=True)
EOF
rm -rf docs/results
log=$($py -c "import sys; sys.path.insert(0, 'tools'); import gpu_parts; print(gpu_parts.LOG)")
$py tools/gpu_parts.py present
$py tools/gpu_parts.py suite "$dir" --device "${DEVICE:-sim}" --workers "${WORKERS:-2}" && rc=0 || rc=$?
grep '^SKIPPED.*not in this checkout' "$dir/$log.txt" || true
[ -f "$dir/$log-failures.txt" ] && grep '^===' "$dir/$log-failures.txt"
exit $rc
