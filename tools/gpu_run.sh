#!/usr/bin/env bash
# The device check of issue #30 (docs/gpu.md), in three parts, since a call to a lent GPU carries at most 64 MiB and
# the zoo's weights are about 150 MB; `python tools/gpu_parts.py carry PART` gives each part's `carry` list. `ar`
# (zoo:ar-small, zoo:ar-tiny, three of ar-small's heads, the image model): the zoo's lossless methods in bfloat16, the
# engine on the 1.1B shape, the kernels, the whole test suite with FASTDECODE_TEST_DEVICE=cuda (a test whose weights
# the call did not carry is skipped, the file named: tests/carried.py). `dlm` (zoo:dlm-small, the DFlash head, the
# image generators): the diffusion family, the tests that name them, spec.dlm_draft and spec.dflash where zoo:ar-small
# is still on the machine. `rest` (zoo:ar-long, the dParallel copy of zoo:dlm-small): the tests that name them. A
# warm machine keeps the files of earlier calls, so run the parts back to back. Every stage has its
# own time limit, so a slow one costs only itself; OUT gets PART-log.txt and PART.tgz (the rows, the test logs, each
# failure's traceback), the most important stages first.
#
#   tools/gpu_run.sh ar   OUT      # at most 10 minutes on one H100/H200 (about 8)
#   tools/gpu_run.sh dlm  OUT      # at most 6 minutes
#   tools/gpu_run.sh rest OUT      # at most 3 minutes
set -u
part=${1:?part: ar, dlm or rest}
out=${2:?output folder}
work=/tmp/fastdecode-$part
mkdir -p "$out" "$work"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
py=${PYTHON:-python3}
log="$out/$part-log.txt"
# a call brings back at most 8 files: everything but the log goes into one archive, remade after every stage so
# that a stage cut by the call's time limit still leaves the earlier ones (written aside and renamed, so that a call
# killed while it writes keeps the previous archive whole)
snap() { tar czf "$out/$part.tgz.part" -C "$work" . && mv -f "$out/$part.tgz.part" "$out/$part.tgz"; }
# each failure with its traceback as it happens (the time limit can stop pytest before its summary); each test's
# outcome in a JUnit file, so that tools/gpu_verdict.py finds the tests that no part ran (skipped wherever their
# weights were not carried). `tests LIMIT OPTIONS...`: the part's test files and log name come from tools/gpu_parts.py
tests() { local name; name=$($py tools/gpu_parts.py log "$part")
  FASTDECODE_TEST_DEVICE=cuda FASTDECODE_FAILURES="$work/$name-failures.txt" timeout "$1" $py -m pytest \
  -p tools.pytest_failures -p no:cacheprovider --junitxml "$work/$name.xml" "${@:2}" \
  $($py tools/gpu_parts.py tests "$part") > "$work/$name.txt" 2>&1
  tail -2 "$work/$name.txt" | tee -a "$log"; snap; }
{ nvidia-smi -L; $py -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__, torch.cuda.get_device_name())"; } 2>&1 | tee "$log"
case $part in
ar)
  # the zoo's lossless methods in bfloat16 (exact mode and graphs, the CUDA default): those whose head is not here are
  # left out with the file named (the DFlash head comes with `dlm`)
  timeout 170 $py tools/results_gpu.py --out "$work" --budget-s 140 --stages bfloat16 --models zoo:ar-small 2>&1 \
    | tee -a "$log"
  snap
  # the 1.1B shape, in the default setting (fused kernels) and against it: the grouped attention, exact mode's old key
  # block (2048 columns); hf.static_compile and the other variants run without `--engine-runs`
  timeout 170 $py tools/results_gpu.py --out "$work" --reps 2 --stages engine --engine-runs hf.greedy spec.pld \
    ar.greedy:fused=true spec.suffix:fused=true ar.greedy:fused=true,grouped=true \
    spec.suffix:fused=true,grouped=true ar.greedy:fused=true,block=2048 2>&1 | tee -a "$log"
  snap
  # where the device time of a step goes, by kernel, in each setting
  timeout 50 $py tools/gpu_kernels.py --out "$work" 2>&1 | tail -5 | tee -a "$log"
  snap
  # the whole suite with the device switch, in parallel (the captured graphs' tests among them)
  # (185 s: the stages' limits then add up to 575 s, inside a call's 600 with the start-up and the archives)
  tests 185 -q -n 15 --dist loadfile --timeout 120 -rs
  ;;
dlm)
  # first, since the "done when" names them (a short device budget cuts this part's end): the last two
  # lossless methods in bfloat16, spec.dlm_draft (zoo:dlm-small the draft) and spec.dflash (the DFlash head), on
  # zoo:ar-small: left out, the file named, unless `ar` ran on this machine; then in float32, so that ar.greedy is
  # timed in both dtypes in one process (bfloat16 at least as fast: tools/gpu_verdict.py)
  timeout 120 $py tools/results_gpu.py --out "$work" --stages bfloat16 float32 --models zoo:ar-small \
    --methods spec.dlm_draft spec.dflash 2>&1 | tee -a "$log"
  snap
  # the diffusion forward's CUDA graphs and fused kernels are on in both dtypes; -unfused runs the graphs without the
  # fused kernels, the -nographs stages run it eagerly (and unfused); the warm-up compiles the kernels
  timeout 130 $py tools/results_gpu.py --out "$work" --budget-s 95 --stages warm bfloat16 float32 \
    bfloat16-unfused bfloat16-nographs float32-nographs --models zoo:dlm-small 2>&1 | tee -a "$log"
  snap
  # the tests that name what this part carries (the `ar` part skipped them), and the diffusion forward's graphs
  tests 110 -q -n 15 --dist loadfile --timeout 90 -rs
  ;;
rest)
  tests 150 -q -n 15 --dist loadfile --timeout 100 -rs
  ;;
*) echo "part: ar, dlm or rest, not $part" >&2; exit 2 ;;
esac
