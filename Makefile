# The two commands in the README: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
WORKDIR ?= workdir/digits
CONFIG ?= configs/digits.py
VARIANTS ?= configs/variants/default.py
ARGS ?=
# Every install is the exact set of versions in the lock (the ranges in pyproject.toml are
# what jaxdist supports; the lock is what was tested), installed by uv (pip took 45 s with its
# cache warm, uv 4 s). `make lock` refreshes it.
LOCK := requirements.lock
PIP_VERSION := 26.3
UV_VERSION := 0.13.9

.PHONY: run run-lm test test-all lint format docs bench bench-lm bench-network bench-hetero bench-peers results results-lm clean lock wheel

$(VENV)/.installed: pyproject.toml $(LOCK)
	@echo "Creating $(VENV) and installing the exact versions in $(LOCK) into it (once; seconds from"
	@echo "uv's cache, a minute or two to download 1.4 GB: jax, flax, orbax, tensorflow-datasets,"
	@echo "matplotlib, the docs and test tools) ..."
	@$(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --disable-pip-version-check pip==$(PIP_VERSION) uv==$(UV_VERSION)
	@$(VENV)/bin/uv pip install --quiet --python $(PY) -r $(LOCK)
	@$(PY) -m pip install --quiet --no-deps -e . > $(VENV)/install.log 2>&1 \
	  || (cat $(VENV)/install.log; exit 1)
	@$(PY) -m pip check --quiet > /dev/null || $(PY) -m pip check
	@touch $@
	@echo "... $(VENV) is ready"

venv: $(VENV)/.installed

run: $(VENV)/.installed
	$(PY) experiments/compare.py --config=$(CONFIG) --variants=$(VARIANTS) --workdir=$(WORKDIR) $(ARGS)

# The character-level GPT on Shakespeare, three ways (configs/variants/default_lm.py): the
# validation loss in nats and bits per character; a few minutes on the CPU
run-lm: $(VENV)/.installed
	$(PY) experiments/compare.py --config=configs/shakespeare_gpt.py \
	  --variants=configs/variants/default_lm.py --workdir=workdir/lm $(ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest -n auto -q -m 'not extended' $(ARGS)

# The suite and the cases marked `extended`, each a behaviour `make test` checks elsewhere too
test-all: $(VENV)/.installed
	$(PY) -m pytest -n auto -q $(ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: $(VENV)/.installed
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

# The documentation site (mkdocs.yml, pages in docs/), built into site/; any warning (a broken
# link, anchor or API reference) is an error.
docs: $(VENV)/.installed
	$(VENV)/bin/mkdocs build --strict

bench: $(VENV)/.installed
	$(PY) experiments/bench_step.py

# The language model's step: every variant of configs/variants/lm.py against AdamW's, in turns,
# and the trainer's median step on the same config
bench-lm: $(VENV)/.installed
	$(PY) experiments/bench_step.py --nolayouts --scaling= --overhead_params= --lm=all \
	  --results=experiments/results/step_lm.md

# Training over real, rate-limited links between network namespaces on this machine (root):
# measured steps beside the modelled clock (experiments/bench_network.py), with the peers'
# PyTorch DDP on the same links given TORCH_PYTHON; 8 hosts, the language model's DiLoCo
# family and its exchange beside the steps (one worker a host) each write a table of their own
NETWORK = $(PY) experiments/bench_network.py --steps=200 \
	  $(if $(TORCH_PYTHON),--torch_python=$(TORCH_PYTHON))
bench-network: $(VENV)/.installed
	$(NETWORK) --hosts=2,4 --rates=100,1000,unlimited --target=0.96 --workdir=workdir/network \
	  --results=experiments/results/network.md
	$(NETWORK) --hosts=8 --rates=100,unlimited --only=dense,topk1_ef,powersgd2,local4 \
	  --target=0.96 --workdir=workdir/network_k8 --results=experiments/results/network_k8.md
	$(PY) experiments/bench_network.py --steps=200 --config=configs/shakespeare_gpt.py \
	  --variants=configs/variants/network_lm.py --metric=test_loss --hosts=2 \
	  --rates=100,unlimited --workdir=workdir/network_lm --results=experiments/results/network_lm.md
	$(PY) experiments/bench_network.py --hosts=2 --rates=100,unlimited --only=dense,dense_bucketed \
	  --steps=100 --workdir=workdir/network_buckets --results=experiments/results/network_buckets.md
	$(PY) experiments/bench_network.py --config=configs/shakespeare_gpt.py \
	  --variants=configs/variants/network_lm.py --metric=test_loss --hosts=2 --rates=100,unlimited \
	  --only=bsp,bsp_bucketed --steps=60 --workdir=workdir/network_buckets_lm \
	  --results=experiments/results/network_buckets_lm.md
	$(PY) experiments/bench_network.py --config=configs/shakespeare_gpt.py \
	  --variants=configs/variants/overlap_lm.py --metric=test_loss --hosts=2 --workers_per_host=1 \
	  --single_thread_hosts --rates=100,unlimited --steps=300 --workdir=workdir/network_overlap \
	  --results=experiments/results/network_overlap.md
	$(PY) experiments/bench_network.py --config=configs/shakespeare_gpt.py \
	  --variants=configs/variants/overlap_lm.py --metric=test_loss --hosts=4 --workers_per_host=1 \
	  --single_thread_hosts --only=streaming_inline,streaming_deferred --rates=100,unlimited \
	  --steps=300 --workdir=workdir/network_overlap_k4 \
	  --results=experiments/results/network_overlap_k4.md

# Unequal hosts for real (root: network namespaces and cgroup v1 CPU groups): each host its own
# CPU share, BSP against dynamic batching (masked and micro-batched), local SGD and SelSync,
# measured beside the cluster model calibrated on the same hosts; then the GPT tiny with DiLoCo and
# heterogeneity-aware DiLoCo (its window of inner steps a round); then ScaDLES's streams at
# real input rates (each worker waits for its data in wall-clock)
bench-hetero: $(VENV)/.installed
	$(PY) experiments/bench_hetero.py --cpu=1,0.85,0.1 --rates=unlimited --steps=200 \
	  --workdir=workdir/hetero_hosts --results=experiments/results/hetero_hosts.md
	$(PY) experiments/bench_hetero.py --cpu=1,0.85,0.1 --rates=unlimited,unlimited,100 --steps=200 \
	  --workdir=workdir/hetero_hosts_link --results=experiments/results/hetero_hosts_link.md
	$(PY) experiments/bench_hetero.py --config=configs/shakespeare_gpt.py \
	  --variants=configs/variants/hetero_diloco.py --metric=test_loss --steps=200 --eval_every=25 \
	  --calibrate_batches=8,16 --calibration_steps=30 --workdir=workdir/hetero_diloco \
	  --results=experiments/results/hetero_diloco.md
	$(PY) experiments/bench_hetero.py --variants=configs/variants/hetero_streams.py --steps=200 \
	  --workdir=workdir/hetero_streams --results=experiments/results/hetero_streams.md

# jaxdist beside PyTorch DDP on the digits CNN: jaxdist's half, and DDP's beside it with
# TORCH_PYTHON=path/to/torchenv/bin/python (a separate venv with torch; never this one)
bench-peers: $(VENV)/.installed
	$(PY) experiments/bench_peers.py --workdir=workdir/peers \
	  $(if $(TORCH_PYTHON),--torch_python=$(TORCH_PYTHON))

# The docs' measured tables: each group of variants (configs/variants/<group>.py: its
# variants and the settings they share) trained side by side, its markdown table written to
# experiments/results/<group>.md, then copied into the pages under docs/. A work directory
# holds runs of one config (a variant reruns there only with the config that trained it):
# groups whose settings change the config beyond new variant names train in their own.
RESULTS = $(PY) experiments/compare.py --config=configs/digits.py --workdir=workdir/results \
	--config.progress=False
group = $(RESULTS) --variants=configs/variants/$(1).py --results=experiments/results/$(1).md $(2)
results: $(VENV)/.installed
	$(call group,compression)
	$(call group,less_sync)
	$(call group,delay_tolerant)
	$(call group,pipeline)
	$(call group,stragglers,--workdir=workdir/stragglers)
	$(call group,straggle,--workdir=workdir/faults)
	$(call group,drop,--workdir=workdir/drop)
	$(call group,heterogeneous)
	$(call group,streams)
	$(call group,noniid)
	$(call group,adaptive)
	$(call group,adopt)
	$(PY) experiments/plot_ratios.py --metrics=workdir/results/adopt/metrics.jsonl \
	  --network=adopt_c1@25 --title='ADOPT (gain threshold 0.1), digits CNN, 8 workers' \
	  --out=experiments/results/adopt_ratios.png
	$(PY) experiments/bench_multilevel.py --results=experiments/results/multilevel.md
	$(call group,hitopk,--workdir=workdir/results_hitopk)
	$(PY) experiments/cpr.py --results=experiments/results/cpr.md
	$(PY) experiments/elastic.py --config=configs/digits.py --workdir=workdir/results/elastic \
	  --variants=configs/variants/elastic.py --results=experiments/results/elastic.md
	$(PY) experiments/plan.py --workdir=workdir/plan
	cp workdir/plan/plan.md workdir/plan/plan.png experiments/results/
	$(MAKE) results-lm

# The DiLoCo family on the character-level GPT (configs/variants/lm.py), and its step times
results-lm: $(VENV)/.installed
	$(PY) experiments/compare.py --config=configs/shakespeare_gpt.py --workdir=workdir/results_lm \
	  --config.progress=False --variants=configs/variants/lm.py --results=experiments/results/lm.md
	$(MAKE) bench-lm
	$(PY) experiments/lm_targets.py --workdir=workdir/results_lm \
	  --steps=experiments/results/step_lm.md --results=experiments/results/lm_targets.md
	$(PY) experiments/docs_tables.py

# The newest versions pyproject.toml's ranges admit (the core and the `all` extra: every extra
# but the accelerators'), for every platform
# (markers where they differ), resolved by uv; then `make test` on them before committing.
lock:
	$(PYTHON) -m venv workdir/lock-venv
	workdir/lock-venv/bin/pip install --quiet uv==$(UV_VERSION)
	workdir/lock-venv/bin/uv pip compile pyproject.toml --extra all --universal \
	  --python-version 3.11 --fork-strategy fewest --upgrade --custom-compile-command 'make lock' -o $(LOCK)

# The wheel and source distribution of a release, in dist/ (the build backend is the lock's).
wheel: $(VENV)/.installed
	rm -rf dist
	$(PY) -m build --no-isolation --outdir dist .

clean:
	rm -rf $(VENV) workdir dist build site
