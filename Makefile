# The two commands of the README: `make demo` and `make test`. Both create .venv and install first.
PYTHON ?= python3
# torch is installed first and pinned, so pip never resolves another (CUDA) build; override on your machine.
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check "$(TORCH)"
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[dev]"
	touch $@

.PHONY: install demo lint test
install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/fastdecode demo

# lint and types first (ruff and mypy, configured in pyproject.toml), then the test suite
lint: $(VENV)/.installed
	$(BIN)/ruff check fastdecode tools tests
	$(BIN)/mypy fastdecode

test: lint
	$(BIN)/python -m pytest

# The committed measurements: docs/results/*.jsonl and the generated tables docs/results/report.md (resumable: rerun
# to finish a file); docs/RESULTS.md is the hand-written findings page, whose figures `make docs-figures` refreshes.
# One torch thread (--threads 1): each run uses one core, and its timings are comparable with the others.
RESULTS := docs/results
# the model-free and self-drafting methods; then those that run zoo:ar-tiny as a draft model
SPEC_FREE := spec.pld hf.prompt_lookup spec.ngram spec.suffix spec.suffix:tree=true spec.recycling spec.lookahead spec.jacobi \
	spec.layerskip hf.greedy
# spec.draft_model three times: its defaults, and hf.assisted's settings (20 tokens, confidence stop 0.4) with the
# threshold fixed and adapted during each generation (transformers adapts it where scikit-learn is installed, as it
# is with the dev extras): two like-for-like pairs with hf.assisted, in one invocation so that all compare with the
# same baseline rows
HF_SETTINGS := num_draft_tokens=20,confidence_stop=0.4
SPEC_DRAFT := spec.draft_model spec.draft_model:$(HF_SETTINGS) hf.assisted:adaptive_threshold=false \
	spec.draft_model:$(HF_SETTINGS),adaptive_stop=true hf.assisted:adaptive_threshold=true spec.rsd spec.dyntree
DLM_METHODS := dlm.threshold dlm.factor dlm.entropy_bound dlm.localleap dlm.prophet dlm.credit dlm.freedave \
	dlm.adablock dlm.dcd dlm.r2 dlm.ccd dlm.ete
BENCH := $(BIN)/fastdecode bench --threads 1
# every block-based dlm method (and the baseline, one token per step) with blocks of 16, as the zoo's card
DLM_BLOCKS := $(foreach m,dlm.baseline $(filter-out dlm.dcd dlm.adablock,$(DLM_METHODS)),--param $(m).block_length=16)
THRESHOLD_BLOCKS := --param dlm.baseline.block_length=16 --param dlm.threshold.block_length=16
# the caches, each a configuration of its own beside the uncached rows of the same run (bench's METHOD:NAME=VALUE)
DLM_CACHES := $(foreach c,dual suffix delayed,dlm.threshold:cache=$(c)) dlm.baseline:cache=dual dlm.baseline:cache=suffix
# a long canvas (384 masks, LLaDA's gen_length is 256-512): an uncached forward pays for the whole canvas
LONG := --param dlm.baseline.max_new_tokens=384 --param dlm.threshold.max_new_tokens=384
.PHONY: results results-spec results-spec-lists results-spec-code results-dlm results-dlm-lists results-dlm-other \
	results-dlm-dystruct results-dlm-canvas results-dlm-learn2pd results-dlm-dparallel results-dlm-cap results-cost results-bound \
	results-engine results-llamacpp
results: results-spec results-dlm results-dlm-canvas results-cost results-engine
	$(MAKE) results-bound
	$(BIN)/fastdecode report $(RESULTS)/*.jsonl --out $(RESULTS)/report.md --plots $(RESULTS)
	$(BIN)/python tools/measured.py

# the figures README.md and docs/*.md quote (marked <!--m NAME-->...<!--/m-->, NAME defined in docs/figures.txt),
# recomputed from docs/results
.PHONY: docs-figures
docs-figures: $(VENV)/.installed
	$(BIN)/python tools/measured.py

# one target per suite, each running every spec method in turn into its own file; the committed files were made with
# `make results-spec`, one suite after the other: side by side (`make -j2`) the two runs share the memory bus and the
# cache, which adds noise of its own; the draft-free methods first, then those that
# run zoo:ar-tiny (each invocation measures its own baseline rows, which the report compares it with)
results-spec: results-spec-lists results-spec-code

results-spec-lists: $(VENV)/.installed
	$(BENCH) --suite parallel-lists --model zoo:ar-small --methods $(SPEC_FREE) \
		--limit 10 --out $(RESULTS)/spec-parallel-lists.jsonl
	$(BENCH) --suite parallel-lists --model zoo:ar-small --draft zoo:ar-tiny --methods $(SPEC_DRAFT) \
		--limit 10 --out $(RESULTS)/spec-parallel-lists.jsonl

results-spec-code: $(VENV)/.installed
	$(BENCH) --suite code --model zoo:ar-small --methods $(SPEC_FREE) --limit 20 --out $(RESULTS)/spec-code.jsonl
	$(BENCH) --suite code --model zoo:ar-small --draft zoo:ar-tiny --methods $(SPEC_DRAFT) \
		--limit 20 --out $(RESULTS)/spec-code.jsonl

# the trained drafters (issue #31, docs/learned.md): each beside ar.greedy, spec.suffix and spec.draft_model in the
# same invocation, on parallel-lists and code; heads are the ones shipped in fastdecode/zoo/ar-small/heads/ (train
# them with `fastdecode train drafter --target zoo:ar-small --kind KIND`); then the acceptance-per-position plot
LEARNED_BASE := spec.suffix spec.draft_model
.PHONY: results-learned results-learned-medusa results-learned-eagle3 results-learned-dflash
results-learned: results-learned-medusa results-learned-eagle3 results-learned-dflash
	$(BIN)/python tools/learned_plot.py $(wildcard $(RESULTS)/learned/*.jsonl) --out $(RESULTS)/learned/acceptance.png

results-learned-medusa: $(VENV)/.installed
	$(BENCH) --suite parallel-lists --model zoo:ar-small --draft zoo:ar-tiny \
		--methods $(LEARNED_BASE) spec.medusa spec.medusa:hydra=true --limit 10 --out $(RESULTS)/learned/medusa.jsonl
	$(BENCH) --suite code --model zoo:ar-small --draft zoo:ar-tiny \
		--methods $(LEARNED_BASE) spec.medusa spec.medusa:hydra=true --limit 10 --out $(RESULTS)/learned/medusa.jsonl

results-learned-eagle3: $(VENV)/.installed
	$(BENCH) --suite parallel-lists --model zoo:ar-small --draft zoo:ar-tiny \
		--methods $(LEARNED_BASE) spec.eagle3 --limit 10 --out $(RESULTS)/learned/eagle3.jsonl
	$(BENCH) --suite code --model zoo:ar-small --draft zoo:ar-tiny \
		--methods $(LEARNED_BASE) spec.eagle3 --limit 10 --out $(RESULTS)/learned/eagle3.jsonl

results-learned-dflash: $(VENV)/.installed
	$(BENCH) --suite parallel-lists --model zoo:ar-small --draft zoo:ar-tiny \
		--methods $(LEARNED_BASE) spec.dflash --limit 10 --out $(RESULTS)/learned/dflash.jsonl
	$(BENCH) --suite code --model zoo:ar-small --draft zoo:ar-tiny \
		--methods $(LEARNED_BASE) spec.dflash --limit 10 --out $(RESULTS)/learned/dflash.jsonl

# what ar-small's cached forward costs as it verifies more tokens (run it with the machine otherwise idle)
results-cost: $(VENV)/.installed
	$(BIN)/python tools/forward_cost.py --model zoo:ar-small --threads 1 --out $(RESULTS)/cost/ar-small.jsonl

# the zoo models' card evaluation with their weights rounded to bfloat16, the dtype `fastdecode train` exports
# (docs/zoo.md, "Weights in bfloat16"; about 20 minutes on one thread)
# the engine: ar.greedy against transformers' generate() (hf.greedy) and the best lossless speculative methods on
# the code suite, one invocation, rows interleaved item by item (the report divides by the same run's ar.greedy);
# then a batch of 8 prompts in one call against the same prompts one at a time (tools/batch_speed.py); its own folder,
# so that its rows do not pool with the suites' files. llama.cpp is not a reference method yet (docs/RESULTS.md).
# constrained decoding (docs/constraints.md): constraint kind x method, with and without the constraint
.PHONY: results-structured
results-structured: $(VENV)/.installed
	$(BIN)/python tools/structured.py --threads 1 --out $(RESULTS)/structured/structured.jsonl \
		--table $(RESULTS)/structured/structured.md

.PHONY: results-engine
results-engine: $(VENV)/.installed
	$(BENCH) --suite code --model zoo:ar-small --methods hf.greedy spec.suffix spec.ngram spec.pld \
		--limit 20 --out $(RESULTS)/engine/engine.jsonl
	$(BIN)/python tools/batch_speed.py --model zoo:ar-small --suite code --limit 16 --batch 8 \
		--methods ar.greedy spec.suffix spec.pld --out $(RESULTS)/engine/batch.jsonl
	$(BIN)/python tools/step_bound.py --model zoo:ar-small --suite code --limit 10 --max-new-tokens 128 \
		--out $(RESULTS)/engine/step_bound.jsonl
	$(BIN)/fastdecode report $(RESULTS)/engine/engine.jsonl --out $(RESULTS)/engine/report.md

# the evidence for the CLI's default thread count (docs/cli.md): tokens/s at 1 and 2 threads per zoo model
.PHONY: results-threads
results-threads: $(VENV)/.installed
	$(BIN)/python tools/thread_speed.py --models zoo:ar-tiny zoo:ar-small zoo:dlm-small --methods spec.pld \
		--synthetic 25 100 --threads 1 2 --reps 5 --out $(RESULTS)/engine/threads.jsonl

# forwards per image, accepted length and batch-1 wall time of the image methods beside ar.sample (docs/image-methods.md)
.PHONY: results-image-speed
results-image-speed: $(VENV)/.installed
	$(BIN)/python tools/image_speed.py --model zoo:img-ar --per-class 2 --threads 1 --out $(RESULTS)/image/speed.jsonl

# llama.cpp beside fastdecode on the same weights and items (needs the optional extra: pip install '.[llamacpp]',
# a ~40-minute source build of llama-cpp-python); every method against the same ar.greedy rows of one run
.PHONY: results-llamacpp
results-llamacpp: $(VENV)/.installed
	$(BENCH) --suite code --model zoo:ar-small --methods hf.greedy llamacpp.greedy llamacpp.prompt_lookup \
		spec.suffix spec.suffix:tree=true spec.ngram spec.pld --limit 20 --out $(RESULTS)/engine/llamacpp.jsonl
	$(BIN)/fastdecode report $(RESULTS)/engine/llamacpp.jsonl --out $(RESULTS)/engine/llamacpp.md

# `fastdecode serve` under load: tokens/s and TTFT / inter-token / end-to-end latency percentiles at 1, 4 and 16
# concurrent streaming clients, a fresh server per method (docs/serve.md); JSONL, report.md and serve.png
.PHONY: results-serve
results-serve: $(VENV)/.installed
	$(BIN)/python tools/serve_bench.py --model zoo:ar-small --methods ar.greedy spec.pld spec.suffix \
		--concurrency 1 4 16 --requests 32 --max-tokens 64 --threads 1 --out $(RESULTS)/serve/serve.jsonl

# long-context sparse decoding (docs/sparse.md): every sparse.* rule at budgets 64/256/1024 against dense greedy,
# accuracy and agreement at 1k-4k on zoo:ar-long (three test items per task and length); decode speed at 8k-16k and
# spec.sparse_self at 8k on zoo:ar-small with its positions stretched 32x (past ar-long's 4k of training, where speed
# does not depend on what the model learnt; one item each, interleaved repeats); about an hour on one thread
.PHONY: results-sparse
SPARSE := --model zoo:ar-small --rope linear:32 --threads 1 --out $(RESULTS)/sparse
results-sparse: $(VENV)/.installed
	$(BIN)/python tools/sparse_results.py --model zoo:ar-long --rope none --threads 1 --out $(RESULTS)/sparse \
		--items 3 --steps 12 --speed-contexts "" --budgets 64,256,1024
	$(BIN)/python tools/sparse_results.py $(SPARSE) --accuracy-contexts "" --speed-contexts "" --selfspec-contexts 8k \
		--budgets 256,1024
	$(BIN)/python tools/sparse_results.py $(SPARSE) --accuracy-contexts "" --speed-steps 24 --repeats 3 \
		--budgets 64,256,1024
	$(BIN)/python tools/sparse_report.py $(RESULTS)/sparse

# the GPU measurements of issue #30 (docs/gpu.md): one H100/H200, under 8 minutes, nothing downloaded: a random
# TinyLlama-1.1B-shaped Llama's engine speed, then the zoo's lossless and diffusion methods in bfloat16 (exact mode)
# and float32, and bfloat16 without exact mode (agreement); rows record dtype and GPU. Resumable: rerun to finish.
.PHONY: results-gpu
results-gpu: $(VENV)/.installed
	$(BIN)/python tools/results_gpu.py --out $(RESULTS)/gpu
	$(BIN)/fastdecode report $(RESULTS)/gpu/*.jsonl --out $(RESULTS)/gpu/report.md

# the image benchmark of issue #33 (docs/image-bench.md): ar.sample (the baseline, always run) and IMAGE_METHODS
# beside it on zoo:img-ar, IMAGE_PER_CLASS images of each class each, scored by the evaluator fastdecode/zoo/img-eval;
# writes docs/results/image/{samples,metrics}.jsonl, grids/*.png and report.md (one run per seed in IMAGE_SEEDS)
IMAGE_METHODS ?=
IMAGE_METHODS += img.dd1:steps=1 img.dd1:steps=2 img.dd2
IMAGE_PER_CLASS ?= 100
IMAGE_SEEDS ?= 0 1 2
.PHONY: results-image
results-image: $(VENV)/.installed
	$(foreach s,$(IMAGE_SEEDS),$(BIN)/fastdecode bench-image --model zoo:img-ar --threads 1 \
		--per-class $(IMAGE_PER_CLASS) --seed $(s) $(foreach m,$(IMAGE_METHODS),--methods $(m)) \
		--out $(RESULTS)/image &&) true

# every image method beside ar.sample in one run, 10 images a class (the README's image table and grids)
IMAGE_ALL := spec.sjd:temperature=1 spec.sjd:temperature=1,coupling=true spec.lantern:temperature=1 \
	spec.gsd:temperature=1 img.zipar img.dd1 img.dd2
.PHONY: results-image-methods
results-image-methods: $(VENV)/.installed
	$(BIN)/fastdecode bench-image --model zoo:img-ar --threads 1 --per-class 10 --seed 0 --methods $(IMAGE_ALL) \
		--out $(RESULTS)/image/methods

.PHONY: results-zoo-bf16
results-zoo-bf16: $(VENV)/.installed
	$(BIN)/python tools/zoo_bf16.py ar-small ar-tiny dlm-small --items 50 --threads 1 --out $(RESULTS)/zoo/bf16.jsonl

# the most a drafter copying from the context could gain on the committed greedy answers, on the cost curve above
# (seconds; after results-spec and results-cost)
results-bound: $(VENV)/.installed
	$(BIN)/python tools/copy_bound.py --results $(RESULTS)/spec-parallel-lists.jsonl $(RESULTS)/spec-code.jsonl \
		--cost $(RESULTS)/cost/ar-small.jsonl --out $(RESULTS)/cost/copy-bound.jsonl

# two independent halves; the committed files were made one after the other with the machine otherwise idle (`make
# results-dlm results-dlm-canvas`, about an hour): `make -j2` halves the time, but side by side the runs share the
# memory bus and the cache, which adds noise of its own;
# 15 items per list task (210 items: one accuracy point is two items), 25 per puzzle task, 5 per task on 384 masks
results-dlm: results-dlm-lists results-dlm-other results-dlm-learn2pd results-dlm-dystruct results-dlm-dparallel \
	results-dlm-cap

results-dlm-lists: $(VENV)/.installed
	$(BENCH) --suite parallel-lists --model zoo:dlm-small --methods $(DLM_METHODS) $(DLM_CACHES) \
		$(DLM_BLOCKS) --limit 15 --out $(RESULTS)/dlm-parallel-lists.jsonl

# the dParallel student (zoo:dlm-small-dparallel, `fastdecode train dparallel`) beside its teacher, the two commit
# rules it is decoded with, blocks of 16, one invocation per model into one file (each measures its own baseline)
DPARALLEL_BLOCKS := --param dlm.baseline.block_length=16 --param dlm.threshold.block_length=16 \
	--param dlm.entropy_bound.block_length=16
results-dlm-dparallel: $(VENV)/.installed
	$(BENCH) --suite parallel-lists --model zoo:dlm-small --methods dlm.threshold dlm.entropy_bound \
		$(DPARALLEL_BLOCKS) --limit 10 --out $(RESULTS)/dparallel/dlm-dparallel.jsonl
	$(BENCH) --suite parallel-lists --model zoo:dlm-small-dparallel --methods dlm.threshold dlm.entropy_bound \
		$(DPARALLEL_BLOCKS) --limit 10 --out $(RESULTS)/dparallel/dlm-dparallel.jsonl

# every dlm.* method on a 256-token cap, the canvas a user sets who does not know the answer's length (issue #32),
# beside dlm.baseline on the same cap in the same run; their fitted-canvas rows are results-dlm-lists / -other and
# dlm.dystruct's are results-dlm-dystruct; a folder of its own (docs/results/dlm-cap/README.md); few items, since
# the baseline spends 256 forwards an item; then the dParallel student and its teacher on puzzles
CAP_METHODS := $(DLM_METHODS) dlm.learn2pd dlm.threshold:eotp=true dlm.dystruct
DLM_CAP := $(foreach m,dlm.baseline dlm.learn2pd dlm.dystruct $(DLM_METHODS),--param $(m).max_new_tokens=256) \
	$(DLM_BLOCKS) --param dlm.learn2pd.block_length=16
results-dlm-cap: $(VENV)/.installed
	$(BENCH) --suite parallel-lists --model zoo:dlm-small --methods $(CAP_METHODS) $(DLM_CAP) --limit 3 \
		--out $(RESULTS)/dlm-cap/parallel-lists.jsonl
	$(BENCH) --suite puzzles --model zoo:dlm-small --methods $(CAP_METHODS) $(DLM_CAP) --limit 5 \
		--out $(RESULTS)/dlm-cap/puzzles.jsonl
	$(BENCH) --suite puzzles --model zoo:dlm-small --methods dlm.threshold dlm.entropy_bound \
		$(DPARALLEL_BLOCKS) --limit 10 --out $(RESULTS)/dparallel/dlm-dparallel-puzzles.jsonl
	$(BENCH) --suite puzzles --model zoo:dlm-small-dparallel --methods dlm.threshold dlm.entropy_bound \
		$(DPARALLEL_BLOCKS) --limit 10 --out $(RESULTS)/dparallel/dlm-dparallel-puzzles.jsonl

results-dlm-other: $(VENV)/.installed
	$(BENCH) --suite parallel-lists --model zoo:ar-small --draft zoo:dlm-small --methods spec.dlm_draft \
		--limit 10 --out $(RESULTS)/spec-dlm-draft-parallel-lists.jsonl
	$(BENCH) --suite puzzles --model zoo:dlm-small --methods $(DLM_METHODS) $(DLM_BLOCKS) \
		--limit 25 --out $(RESULTS)/dlm-puzzles.jsonl
	$(BENCH) --suite parallel-lists --model zoo:dlm-small --methods dlm.threshold $(DLM_CACHES) \
		$(THRESHOLD_BLOCKS) $(LONG) --limit 5 --out $(RESULTS)/dlm-cache-long.jsonl

# Learn2PD (issue #32; its filter ships as zoo:dlm-small/learn2pd) beside dlm.baseline and the threshold rule with
# and without End-of-Text Prediction, which dlm.learn2pd has on by default; in a folder of its own (rows that carry
# the new parameters beside the committed rows would relabel every quoted dlm figure); 5 items per task
LEARN2PD := dlm.learn2pd dlm.learn2pd:threshold=0.9 dlm.threshold dlm.threshold:eotp=true
results-dlm-learn2pd: $(VENV)/.installed
	$(BENCH) --suite parallel-lists --model zoo:dlm-small --methods $(LEARN2PD) $(THRESHOLD_BLOCKS) --limit 5 \
		--out $(RESULTS)/dlm-learn2pd/parallel-lists.jsonl
	$(BENCH) --suite puzzles --model zoo:dlm-small --methods $(LEARN2PD) $(THRESHOLD_BLOCKS) --limit 5 \
		--out $(RESULTS)/dlm-learn2pd/puzzles.jsonl

# dlm.dystruct decides the length under a 256-token cap, beside dlm.threshold and dlm.baseline on the fitted canvas
# (docs/results/dlm-dystruct/README.md); a folder of its own, as docs/results/dlm-eotp
DYSTRUCT := --model zoo:dlm-small --methods dlm.threshold dlm.dystruct $(THRESHOLD_BLOCKS) \
	--param dlm.dystruct.max_new_tokens=256
results-dlm-dystruct: $(VENV)/.installed
	$(BENCH) --suite parallel-lists $(DYSTRUCT) --limit 10 --out $(RESULTS)/dlm-dystruct/parallel-lists.jsonl
	$(BENCH) --suite puzzles $(DYSTRUCT) --limit 25 --out $(RESULTS)/dlm-dystruct/puzzles.jsonl

# the caches on canvases between the fitted one and 384 masks, where dlm-small still solves part of the tasks:
# 15 items per list task
CANVAS := 64 128 256
results-dlm-canvas: $(foreach n,$(CANVAS),results-dlm-canvas-$(n))
results-dlm-canvas-%: $(VENV)/.installed
	$(BENCH) --suite parallel-lists --model zoo:dlm-small --methods dlm.threshold $(DLM_CACHES) $(THRESHOLD_BLOCKS) \
		--param dlm.baseline.max_new_tokens=$* --param dlm.threshold.max_new_tokens=$* \
		--limit 15 --out $(RESULTS)/dlm-cache-$*.jsonl
