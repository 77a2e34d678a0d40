#!/usr/bin/env bash
# The device check of issue #30 (docs/gpu.md), in two parts so that each call to a lent GPU carries under 64 MiB of
# weights: `ar` (zoo:ar-small and zoo:ar-tiny: the engine on the 1.1B shape, the zoo's lossless methods, the test
# suite with FASTDECODE_TEST_DEVICE=cuda) and `dlm` (zoo:dlm-small: the diffusion family, the dlm-draft tests).
# Every stage has its own time limit, so a slow one costs only itself; everything lands in OUT.
#
#   tools/gpu_run.sh ar  OUT      # about 8 minutes on one H100/H200
#   tools/gpu_run.sh dlm OUT      # about 3 minutes
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
  timeout 300 $py tools/results_gpu.py --out "$out" --reps 2 --budget-s 230 --stages engine bfloat16 bfloat16-nographs \
    --models zoo:ar-small 2>&1 | tee -a "$out/log.txt"
  # the captured graphs first (their in-graph attention plan and the host-work guard have run only on the CPU)
  FASTDECODE_TEST_DEVICE=cuda timeout 60 $py -m pytest -v -p no:cacheprovider tests/invariants/test_graphs.py \
    tests/invariants/test_host_ops.py tests/invariants/test_exact_mode.py > "$out/pytest-graphs.txt" 2>&1
  tail -5 "$out/pytest-graphs.txt" | tee -a "$out/log.txt"
  FASTDECODE_TEST_DEVICE=cuda timeout 150 $py -m pytest -v -p no:cacheprovider --durations=10 tests/invariants \
    tests/unit/test_device_switch.py --ignore=tests/invariants/test_spec_dlm_draft.py \
    --ignore=tests/invariants/test_graphs.py --ignore=tests/invariants/test_host_ops.py \
    --ignore=tests/invariants/test_exact_mode.py > "$out/pytest.txt" 2>&1
  tail -5 "$out/pytest.txt" | tee -a "$out/log.txt"
  timeout 60 $py tools/results_gpu.py --out "$out" --budget-s 30 --stages bfloat16-noexact float32 \
    --models zoo:ar-small 2>&1 | tee -a "$out/log.txt"
  ;;
dlm)
  timeout 120 $py tools/results_gpu.py --out "$out" --budget-s 80 --stages bfloat16 float32 bfloat16-noexact \
    --models zoo:dlm-small 2>&1 | tee -a "$out/log.txt"
  FASTDECODE_TEST_DEVICE=cuda timeout 50 $py -m pytest -v -p no:cacheprovider tests/invariants/test_spec_dlm_draft.py \
    > "$out/pytest-dlm.txt" 2>&1
  tail -5 "$out/pytest-dlm.txt" | tee -a "$out/log.txt"
  ;;
*) echo "part: ar or dlm, not $part" >&2; exit 2 ;;
esac
