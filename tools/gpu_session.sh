#!/usr/bin/env bash
# The checkout's side of a device session (docs/gpu.md "What remains for a device session"), so that nothing is done
# by hand between the device calls, which must follow one another within the 30 s a machine stays warm:
#
#   tools/gpu_session.sh prepare           # before the first call: the work tree must be clean (commit first)
#   tools/gpu_session.sh restore           # after the last call: the checkout as it was
#   tools/gpu_session.sh unpack DATE DIR...  # each call's PART.tgz and PART-log.txt found in DIRs (the calls'
#                                          # files_at) into docs/results/gpu/DATE/PART/, then the verdict
#
# `prepare` stops tracking docs/results and every *.safetensors (the staged removal is what keeps them out of the
# call's 64 MiB: a call carries tracked and untracked-not-ignored files) and ignores them in .git/info/exclude (a
# copy of the file, or a note that there was none, is kept beside it), then prints each call's `carry` list and
# command. Commit nothing until `restore`: the removal is staged. `restore` unstages it (`git reset -q`) and puts
# the exclude file back. Both refuse what they cannot undo.
set -eu
tools=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
root=$(git rev-parse --show-toplevel)
cd "$root"
exclude=$(git rev-parse --git-path info/exclude)
backup=$exclude.before-gpu
absent=$exclude.none-before-gpu
parts=$($py -c "import sys; sys.path.insert(0, '$tools'); import gpu_parts; print(' '.join(gpu_parts.PARTS))")
case ${1:-} in
prepare)
  if [ -e "$backup" ] || [ -e "$absent" ]; then
    echo "already prepared ($backup is there): run 'tools/gpu_session.sh restore' first" >&2; exit 2
  fi
  if [ -n "$(git status --porcelain)" ]; then
    echo "the work tree has changes: commit them first (a staged removal follows, and restore resets the index)" >&2
    git status --short >&2; exit 2
  fi
  mkdir -p "$(dirname "$exclude")"
  if [ -e "$exclude" ]; then cp "$exclude" "$backup"; else : > "$absent"; fi
  git rm -r --cached -q --ignore-unmatch docs/results '*.safetensors'
  printf '/docs/results/\n*.safetensors\n' >> "$exclude"
  echo "prepared: docs/results and the weights untracked for the calls (restore with: tools/gpu_session.sh restore)"
  for part in $parts; do
    echo "call $part: carry $($py "$tools/gpu_parts.py" carry $part 2>&1 | tr '\n' ' ')"
  done
  $py "$tools/gpu_parts.py" plan
  ;;
restore)
  if [ ! -e "$backup" ] && [ ! -e "$absent" ]; then
    echo "not prepared: nothing to restore" >&2; exit 2
  fi
  git reset -q
  if [ -e "$backup" ]; then mv -f "$backup" "$exclude"; else rm -f "$exclude" "$absent"; fi
  if [ -n "$(git status --porcelain)" ]; then
    echo "restored, but the work tree differs from HEAD:" >&2; git status --short >&2; exit 1
  fi
  echo "restored: the checkout is as before"
  ;;
unpack)
  date=${2:?unpack DATE DIR...: DATE names the run, e.g. 2026-11-28}
  shift 2
  [ $# -gt 0 ] || { echo "unpack DATE DIR...: name the folders the calls' files came back in" >&2; exit 2; }
  run=docs/results/gpu/$date
  found=0
  for part in $parts; do
    archive=$(find "$@" -name "$part.tgz" 2>/dev/null | head -1)
    log=$(find "$@" -name "$part-log.txt" 2>/dev/null | head -1)
    [ -n "$archive$log" ] || { echo "$part: no $part.tgz or $part-log.txt in $*"; continue; }
    found=1
    mkdir -p "$run/$part"
    [ -z "$archive" ] || tar xzf "$archive" -C "$run/$part"
    [ -z "$log" ] || cp "$log" "$run/$part/"
    echo "$part: $(find "$run/$part" -type f | wc -l) files in $run/$part"
  done
  [ $found = 1 ] || exit 2
  $py "$tools/gpu_verdict.py" "$run" || true
  ;;
*)
  echo "usage: tools/gpu_session.sh prepare | restore | unpack DATE DIR..." >&2; exit 2 ;;
esac
