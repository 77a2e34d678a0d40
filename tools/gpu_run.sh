#!/usr/bin/env bash
# The device check of issue #30 (docs/gpu.md), in two parts so that each call to a lent GPU carries under 64 MiB of
# weights: `ar` (zoo:ar-small, zoo:ar-tiny, zoo:img-ar and two of ar-small's heads: the captured graphs' tests, the
# engine on the 1.1B shape, the zoo's lossless methods, the whole test suite with FASTDECODE_TEST_DEVICE=cuda) and
# `dlm` (zoo:dlm-small and its dParallel copy: the diffusion family, the tests that need them). Every stage has its
# own time limit, so a slow one costs only itself; OUT gets PART-log.txt and PART.tgz (the rows, the test logs, each
# failure's traceback), the most important stages first.
#
#   tools/gpu_run.sh ar  OUT      # at most 10 minutes on one H100/H200 (about 8)
#   tools/gpu_run.sh dlm OUT      # at most 3 minutes
set -u
part=${1:?part: ar or dlm}
out=${2:?output folder}
work=/tmp/fastdecode-$part
mkdir -p "$out" "$work"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
py=${PYTHON:-python3}
log="$out/$part-log.txt"
# a call brings back at most 8 files: everything but the log goes into one archive, remade after every stage so
# that a stage cut by the call's time limit still leaves the earlier ones
snap() { tar czf "$out/$part.tgz" -C "$work" . ; }
# each failure with its traceback as it happens (the time limit can stop pytest before its summary)
tests() { FASTDECODE_TEST_DEVICE=cuda FASTDECODE_FAILURES="$work/$1-failures.txt" timeout "$2" $py -m pytest \
  -p tools.pytest_failures -p no:cacheprovider "${@:3}" > "$work/$1.txt" 2>&1; tail -2 "$work/$1.txt" | tee -a "$log"; snap; }
{ nvidia-smi -L; $py -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__, torch.cuda.get_device_name())"; } 2>&1 | tee "$log"
case $part in
ar)
  # on the device first: the captured graphs and their reuse, the host-work guard, tree confirmation, the fused kernels
  # and the grouped attention
  tests pytest-graphs 120 -q tests/invariants/test_graphs.py tests/invariants/test_graph_reuse.py \
    tests/invariants/test_host_ops.py tests/invariants/test_exact_mode.py tests/invariants/test_exact_trees.py \
    tests/invariants/test_native_fused.py tests/unit/test_grouped_attention.py \
    tests/invariants/test_canvas_graphs.py
  # the 1.1B shape (hf.static_compile and the eager variants of ar.greedy: `--engine-runs` leaves them out to save
  # the call's time; the full list runs without it), then the zoo in bfloat16
  timeout 250 $py tools/results_gpu.py --out "$work" --reps 2 --budget-s 190 --stages engine bfloat16 \
    --engine-runs hf.greedy spec.suffix spec.pld ar.greedy:fused=true ar.greedy:grouped=true \
    spec.suffix:fused=true,grouped=true ar.greedy:fused=true,block=2048 --models zoo:ar-small 2>&1 | tee -a "$log"
  snap
  # where the device time of a step goes, by kernel, in each setting
  timeout 50 $py tools/gpu_kernels.py --out "$work" 2>&1 | tail -5 | tee -a "$log"
  snap
  # the whole suite with the device switch, in parallel
  tests pytest 170 -q -n 15 --dist loadfile --timeout 120 tests
  ;;
dlm)
  # the diffusion forward's CUDA graphs are on in both dtypes; the -nographs stages run it eagerly
  timeout 110 $py tools/results_gpu.py --out "$work" --budget-s 75 --stages warm bfloat16 float32 \
    bfloat16-nographs float32-nographs --models zoo:dlm-small 2>&1 | tee -a "$log"
  snap
  # the tests that need zoo:dlm-small or its dParallel copy (the `ar` part does not carry them)
  tests pytest-dlm 80 -q -n 8 --dist loadfile tests/invariants/test_canvas_graphs.py \
    tests/invariants/test_spec_dlm_draft.py \
    tests/invariants/test_dlm_dystruct.py tests/unit/test_learn2pd.py tests/unit/test_dparallel_card.py \
    tests/unit/test_dparallel.py tests/statistical/test_spec_dlm_draft_sampling.py tests/test_threads.py
  ;;
*) echo "part: ar or dlm, not $part" >&2; exit 2 ;;
esac
