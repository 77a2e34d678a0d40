#!/usr/bin/env bash
# The device check of issue #30 (docs/gpu.md), in two parts so that each call to a lent GPU carries under 64 MiB of
# weights: `ar` (zoo:ar-small, zoo:ar-tiny, zoo:img-ar and two of ar-small's heads: the captured graphs' tests, the
# engine on the 1.1B shape, the zoo's lossless methods, the whole test suite with FASTDECODE_TEST_DEVICE=cuda) and
# `dlm` (zoo:dlm-small and its dParallel copy: the diffusion family, the tests that need them, and the tests the first
# part failed where the same machine is still held). Every stage has its own time limit, so a slow one costs only
# itself; everything lands in OUT, the most important first.
#
#   tools/gpu_run.sh ar  OUT      # at most 9.5 minutes on one H100/H200 (about 7.5)
#   tools/gpu_run.sh dlm OUT      # at most 3.5 minutes
set -u
part=${1:?part: ar or dlm}
out=${2:?output folder}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
py=${PYTHON:-python3}
{ nvidia-smi -L; $py -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__, torch.cuda.get_device_name())"; } 2>&1 | tee "$out/log.txt"
case $part in
ar)
  # the captured graphs first: their in-graph attention plan, the host-work guard and the fused kernels (inductor,
  # inside the captured graphs) have run only on the CPU
  FASTDECODE_TEST_DEVICE=cuda timeout 100 $py -m pytest -v -p no:cacheprovider tests/invariants/test_graphs.py \
    tests/invariants/test_host_ops.py tests/invariants/test_exact_mode.py tests/invariants/test_native_fused.py \
    > "$out/pytest-graphs.txt" 2>&1
  tail -3 "$out/pytest-graphs.txt" | tee -a "$out/log.txt"
  # the 1.1B shape (hf.static_compile and the eager variants of ar.greedy: `--engine-runs` leaves them out to save
  # the call's time; the full list runs without it), then the zoo in bfloat16
  timeout 260 $py tools/results_gpu.py --out "$out" --reps 2 --budget-s 200 --stages engine bfloat16 \
    --engine-runs hf.greedy spec.suffix spec.pld ar.greedy:fused=true spec.suffix:fused=true \
    --models zoo:ar-small 2>&1 | tee -a "$out/log.txt"
  # the two tree methods that left ar.greedy in bfloat16 with graphs: the same without graphs
  timeout 50 $py tools/results_gpu.py --out "$out" --budget-s 30 --stages bfloat16-nographs --models zoo:ar-small \
    --methods spec.recycling spec.rsd spec.suffix:tree=true 2>&1 | tee -a "$out/log.txt"
  # the whole suite with the device switch, in parallel; its failures stay in the cache for the `dlm` part
  FASTDECODE_TEST_DEVICE=cuda timeout 150 $py -m pytest -q -n 12 --dist loadfile --timeout 120 -rfE \
    -o cache_dir=/tmp/fastdecode-pytest-cache tests > "$out/pytest.txt" 2>&1
  tail -3 "$out/pytest.txt" | tee -a "$out/log.txt"
  ;;
dlm)
  timeout 100 $py tools/results_gpu.py --out "$out" --budget-s 70 --stages bfloat16 float32 bfloat16-noexact \
    --models zoo:dlm-small 2>&1 | tee -a "$out/log.txt"
  # the tests that need zoo:dlm-small, then those the `ar` part failed on this machine (none where it is a new one)
  FASTDECODE_TEST_DEVICE=cuda timeout 50 $py -m pytest -q -n 8 --dist loadfile -rfE -p no:cacheprovider \
    tests/invariants/test_spec_dlm_draft.py tests/invariants/test_dlm_dystruct.py tests/unit/test_learn2pd.py \
    tests/unit/test_dparallel_card.py tests/unit/test_dparallel.py > "$out/pytest-dlm.txt" 2>&1
  tail -3 "$out/pytest-dlm.txt" | tee -a "$out/log.txt"
  FASTDECODE_TEST_DEVICE=cuda timeout 40 $py -m pytest -q -n 8 --dist loadfile -rfE --lf --lfnf=none \
    -o cache_dir=/tmp/fastdecode-pytest-cache tests > "$out/pytest-again.txt" 2>&1
  tail -3 "$out/pytest-again.txt" | tee -a "$out/log.txt"
  ;;
*) echo "part: ar or dlm, not $part" >&2; exit 2 ;;
esac
