#!/usr/bin/env bash
# A device part's test run rehearsed on this CPU (docs/gpu.md): a clone of the committed HEAD holding only the weights
# that `python tools/gpu_parts.py carry PART` names and no docs/results, as a device call sees the checkout, and the
# tests tools/gpu_run.sh runs for that part, with FASTDECODE_TEST_DEVICE=cpu:0: the CPU, under a name other than
# "cpu", so that a test failing on a file the call did not carry is skipped as on the device (tests/carried.py). A
# failure here is one the device would show too, apart from what only a GPU shows. PART may join parts with "+"
# (ar+dlm: the dlm part on a warm machine that still holds the ar part's files); the tests are the last part's.
#
#   tools/gpu_dry_run.sh ar|dlm|rest|ar+dlm [FOLDER]     # FOLDER default /tmp/gpu-dry-run-PART; about 7, 2, 1 minutes
#
# The logs and JUnit files have the device run's names (tools/gpu_parts.py `log`), so
# `python tools/gpu_verdict.py /tmp/gpu-dry-run-ar /tmp/gpu-dry-run-dlm /tmp/gpu-dry-run-rest` says which tests no
# part would run (its other lines count device rows only: "not measured").
set -eu
parts=${1:?part: ar, dlm, rest, or several joined by +}
root=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
py=${PYTHON:-$root/.venv/bin/python}
dir=${2:-/tmp/gpu-dry-run-$parts}
rm -rf "$dir"
git clone -q "$root" "$dir"
cd "$dir"
keep=()
for part in ${parts//+/ }; do
  while IFS= read -r path; do keep+=("$path"); done < <($py -c "
import json, sys; sys.path.insert(0, 'tools'); import gpu_parts
print('\n'.join(gpu_parts.PARTS['$part']))")
done
# every weights file but those the parts carry, and the committed results, stay behind
find . -name '*.safetensors' -not -path './.git/*' | while IFS= read -r file; do
  carried=0
  for path in "${keep[@]}"; do
    case "${file#./}" in "$path"|"$path"/*) carried=1 ;; esac
  done
  [ $carried = 1 ] || rm "$file"
done
rm -rf docs/results
last=${parts##*+}
log=$($py tools/gpu_parts.py log "$last")
files=($($py tools/gpu_parts.py tests "$last"))
echo "$dir: $(find . -name '*.safetensors' -not -path './.git/*' | wc -l) weights files kept; running ${#files[@]} test paths"
PYTHONPATH=. FASTDECODE_TEST_DEVICE=cpu:0 FASTDECODE_FAILURES="$dir/$log-failures.txt" $py -m pytest -p tools.pytest_failures \
  -p no:cacheprovider -rs --junitxml "$dir/$log.xml" "${files[@]}" > "$dir/$log.txt" 2>&1 && rc=0 || rc=$?
tail -1 "$dir/$log.txt"
grep '^SKIPPED.*not in this checkout' "$dir/$log.txt" || true
[ -f "$dir/$log-failures.txt" ] && grep '^===' "$dir/$log-failures.txt"
exit $rc
