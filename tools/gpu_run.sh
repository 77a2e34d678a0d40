#!/usr/bin/env bash
# The device check of issue #30 (docs/gpu.md), in three calls, since a call to a lent GPU carries at most 64 MiB and
# the zoo's weights are about 141 MiB; `python tools/gpu_parts.py carry PART` gives each call's `carry` list. A warm
# machine keeps the files of earlier calls, so the calls build up the whole zoo there and the last runs the whole test
# suite once, with every part's weights: make them back to back (a machine goes back 30 s after a call).
#   `ar`   (zoo:ar-small, zoo:ar-tiny, three of ar-small's heads, the image model): the zoo's lossless methods in
#          bfloat16, the engine on the 1.1B shape (random weights, no file), the kernels;
#   `dlm`  (zoo:dlm-small, the DFlash head, the image generators): spec.dlm_draft and spec.dflash (zoo:ar-small is
#          still there) in bfloat16, ar.greedy in float32, the diffusion family in both dtypes;
#   `rest` (zoo:ar-long, the dParallel copy of zoo:dlm-small): the whole suite with FASTDECODE_TEST_DEVICE=cuda; a
#          test whose weights are not there (a machine that went cold) is skipped with the file named
#          (tests/carried.py), and the log's first lines say which parts' weights were there.
# Every stage has its own time limit, so a slow one costs only itself; OUT gets PART-log.txt and PART.tgz (the rows,
# the test logs, each failure's traceback). The measuring calls' limits add up to 565 s (ar 345, dlm 220); with the
# machine's start (not known in advance) and the transfers, the suite gets what is left of a session's 15 minutes.
# So each later call's LIMIT comes from the previous reply's lease.budget_left_s (`python tools/gpu_parts.py limit
# PART B` prints it with the call's timeout_s): `dlm` shortens its diffusion stages (or runs none and only carries
# its weights) where a slow start would leave the suite under 150 s, and `rest` gets what is left less a call's
# cost, so that its tests end before the session's device time does. tools/gpu_session.sh prepares the checkout
# for the calls and unpacks what they bring back.
#
#   tools/gpu_run.sh ar   OUT          # at most 6 minutes on one H100/H200
#   tools/gpu_run.sh dlm  OUT [LIMIT]  # at most 4 (LIMIT default 220)
#   tools/gpu_run.sh rest OUT [LIMIT]  # the tests: LIMIT seconds (default 240)
#   tools/gpu_run.sh present OUT       # only what is there: a call that carries a part and runs nothing
set -u
part=${1:?part: ar, dlm, rest or present}
out=${2:?output folder}
limit=${3:-}
[ -n "$limit" ] || case $part in dlm) limit=220 ;; *) limit=240 ;; esac
began=$SECONDS
work=${WORK:-/tmp/fastdecode-$part}  # (a test gives its own)
mkdir -p "$out" "$work"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
py=${PYTHON:-python3}
NOT_RUN="gpu_run.sh: not run within the call's limit of"  # (tools/gpu_verdict.py reads it)
log="$out/$part-log.txt"
# a call brings back at most 8 files: everything but the log goes into one archive, remade after every stage so
# that a stage cut by the call's time limit still leaves the earlier ones (written aside and renamed, so that a call
# killed while it writes keeps the previous archive whole)
snap() { tar czf "$out/$part.tgz.part" -C "$work" . && mv -f "$out/$part.tgz.part" "$out/$part.tgz"; }
# the whole suite with the device switch, 15 workers (tools/gpu_parts.py `run_suite`: its log, JUnit file and each
# failure as it comes; at LIMIT pytest is interrupted and the log says so), then the archive
suite() { $py tools/gpu_parts.py suite "$work" --device cuda --workers 15 --limit "$1" 2>&1 | tee -a "$log"; snap; }
{ nvidia-smi -L; $py -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__, torch.cuda.get_device_name())"; $py tools/gpu_parts.py present; } 2>&1 | tee "$log"
case $part in
ar)
  # the zoo's lossless methods in bfloat16 (exact mode and graphs, the CUDA default): those whose head or draft is not
  # here are left out with the file named (spec.dflash and spec.dlm_draft: their files come with `dlm`, which runs them)
  timeout 190 $py tools/results_gpu.py --out "$work" --budget-s 150 --stages bfloat16 --models zoo:ar-small 2>&1 \
    | tee -a "$log"
  snap
  # the 1.1B shape, in the default setting (fused kernels) and against it: the grouped attention, exact mode's old key
  # block (2048 columns); hf.static_compile, spec.pld and the other variants run without `--engine-runs`
  timeout 120 $py tools/results_gpu.py --out "$work" --reps 2 --stages engine --engine-runs hf.greedy \
    ar.greedy:fused=true spec.suffix:fused=true ar.greedy:fused=true,grouped=true \
    spec.suffix:fused=true,grouped=true ar.greedy:fused=true,block=2048 2>&1 | tee -a "$log"
  snap
  # where the device time of a step goes, by kernel, in each setting (the most telling first)
  timeout 35 $py tools/gpu_kernels.py --out "$work" 2>&1 | tail -5 | tee -a "$log"
  snap
  ;;
dlm)
  # LIMIT (default 220 s; `python tools/gpu_parts.py limit dlm B`, B the `ar` reply's lease.budget_left_s) is shared
  # out in order of what the targets need, so that a slow start shortens the diffusion stages, not the suite:
  # the last two lossless methods in bfloat16, spec.dlm_draft (zoo:dlm-small the draft) and spec.dflash (the DFlash
  # head), on zoo:ar-small (left out, the file named, where the `ar` call's weights are not here); then, in the same
  # process, ar.greedy alone in float32 (bfloat16 at least as fast: tools/gpu_verdict.py compares one process's rows)
  first=$(( limit < 120 ? limit : 120 ))
  if [ "$first" -ge 45 ]; then
    timeout "$first" $py tools/results_gpu.py --out "$work" --budget-s $(( first - 35 )) --stages bfloat16 \
      float32-baseline --models zoo:ar-small --methods spec.dlm_draft spec.dflash 2>&1 | tee -a "$log"
    snap
  else
    echo "$NOT_RUN $limit s: spec.dlm_draft, spec.dflash and float32-baseline ($first s for them)" | tee -a "$log"
  fi
  # the diffusion forward's CUDA graphs and fused kernels are on in both dtypes (the warm-up compiles the kernels);
  # then, while the budget lasts, what each is worth: -unfused runs the graphs without the fused kernels, the
  # -nographs stages run it eagerly (and unfused)
  left=$(( limit - SECONDS + began ))
  if [ "$left" -ge 45 ]; then
    timeout "$left" $py tools/results_gpu.py --out "$work" --budget-s $(( left - 25 )) --stages warm bfloat16 \
      float32 bfloat16-unfused bfloat16-nographs float32-nographs --models zoo:dlm-small 2>&1 | tee -a "$log"
    snap
  else
    echo "$NOT_RUN $limit s: the diffusion family's stages ($left s left for them)" | tee -a "$log"
  fi
  ;;
rest)
  suite "$limit"
  ;;
present) ;;
*) echo "part: ar, dlm, rest or present, not $part" >&2; exit 2 ;;
esac
