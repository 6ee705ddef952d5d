# The two commands in the README: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
WORKDIR ?= workdir/digits
CONFIG ?= configs/digits.py
ARGS ?=
# Every install is the exact set of versions in the lock (the ranges in pyproject.toml are
# what jaxdist supports; the lock is what was tested). `make lock` refreshes it.
LOCK := requirements.lock
PIP_VERSION := 26.3
UV_VERSION := 0.13.9

.PHONY: run test lint format bench bench-peers results clean lock

$(VENV)/.installed: pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet pip==$(PIP_VERSION)
	$(PY) -m pip install --quiet -r $(LOCK)
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -m pip check
	touch $@

venv: $(VENV)/.installed

run: $(VENV)/.installed
	$(PY) experiments/compare.py --config=$(CONFIG) --workdir=$(WORKDIR) $(ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest -n auto -q $(ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: $(VENV)/.installed
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

bench: $(VENV)/.installed
	$(PY) experiments/bench_step.py

# ../shared/peers/side_by_side.sh's work: jaxdist's half, and PyTorch DDP's beside it with
# TORCH_PYTHON=path/to/torchenv/bin/python (a separate venv with torch; never this one)
bench-peers: $(VENV)/.installed
	$(PY) experiments/bench_peers.py --workdir=workdir/peers \
	  $(if $(TORCH_PYTHON),--torch_python=$(TORCH_PYTHON))

# The README's measured tables: each group of variants trained side by side, its markdown
# table written to experiments/results/, then copied into README.md. A work directory holds
# runs of one config (a variant reruns there only with the config that trained it): groups
# that change the config beyond new variant names train in their own.
RESULTS = $(PY) experiments/compare.py --config=configs/digits.py --workdir=workdir/results \
	--config.progress=False
results: $(VENV)/.installed
	$(RESULTS) --only=dense,topk1_ef,artopk1,powersgd2,qsgd8,topk1_noef \
	  --results=experiments/results/compression.md
	$(RESULTS) --only=bsp,local4,local16,diloco8,selsync,selsync01,ssp2,async4,gossip_ring,sma \
	  --results=experiments/results/less_sync.md
	$(RESULTS) --only=bsp,od_sgd,ssd_sgd,cd_sgd,tick_tock,bucketed \
	  --results=experiments/results/delay_tolerant.md
	$(RESULTS) --only=bsp_lr05,delay2,delay2_sc,delay4,delay4_sc,delay4_lwp,delay4_sc_lwp \
	  --results=experiments/results/pipeline.md
	$(RESULTS) --workdir=workdir/stragglers --only=bsp,local4,ssp2,async4,gossip_ring \
	  --config.cluster.straggler_p=0.1 --config.cluster.straggler_slowdown=4 \
	  --config.cluster.price=1 --results=experiments/results/stragglers.md
	$(RESULTS) --workdir=workdir/faults --only=bsp,local4,ssp2,async4,gossip_ring \
	  --config.fault.straggle=7:8@20-120 --results=experiments/results/straggle.md
	$(RESULTS) --workdir=workdir/drop --only=bsp,drop1_at20,drop1_20_60,drop4_at20 \
	  --results=experiments/results/drop.md
	$(RESULTS) --only=uniform_h2,dynamic_h2,uniform_h10,dynamic_h10 --config.workers=3 \
	  --config.batch_size=96 --results=experiments/results/heterogeneous.md
	$(RESULTS) --only=ddl_s1,scadles_s1,ddl_s10,scadles_s10 --results=experiments/results/streams.md
	$(RESULTS) --only=iid,seldp,labels1,labels1_inject10,labels1_inject50,selsync_labels1_inject50,selsync005_labels1_inject50 \
	  --config.workers=10 --config.batch_size=160 --results=experiments/results/noniid.md
	$(RESULTS) --only=dense,topk10x,topk1000x,gravac,scadles_rule \
	  --results=experiments/results/adaptive.md
	$(RESULTS) --only=fixed10x,fixed30x,fixed90x,fixed270x,fixed833x,adopt,adopt_lazy \
	  --config.network.profiles=adopt_c1@25,1gbps --results=experiments/results/adopt.md
	$(PY) experiments/plot_ratios.py --metrics=workdir/results/adopt/metrics.jsonl \
	  --network=adopt_c1@25 --title='ADOPT (gain threshold 0.1), digits CNN, 8 workers' \
	  --out=experiments/results/adopt_ratios.png
	$(PY) experiments/bench_multilevel.py --results=experiments/results/multilevel.md
	$(RESULTS) --only=dense,topk1_ef,artopk1,hitopk --config.workers=16 --config.devices=2 \
	  --config.network.profiles=10gbps,25gbps@25us --workdir=workdir/results_hitopk \
	  --results=experiments/results/hitopk.md
	$(PY) experiments/cpr.py --results=experiments/results/cpr.md
	$(PY) experiments/elastic.py --config=configs/digits.py --workdir=workdir/results/elastic \
	  --results=experiments/results/elastic.md
	$(PY) experiments/plan.py --workdir=workdir/plan
	cp workdir/plan/plan.md workdir/plan/plan.png experiments/results/
	$(PY) experiments/readme_tables.py

# The newest versions pyproject.toml's ranges admit (base + test extras), for every platform
# (markers where they differ), resolved by uv; then `make test` on them before committing.
lock:
	$(PYTHON) -m venv workdir/lock-venv
	workdir/lock-venv/bin/pip install --quiet uv==$(UV_VERSION)
	workdir/lock-venv/bin/uv pip compile pyproject.toml --extra test --universal \
	  --python-version 3.11 --fork-strategy fewest --upgrade --custom-compile-command 'make lock' -o $(LOCK)

clean:
	rm -rf $(VENV) workdir
