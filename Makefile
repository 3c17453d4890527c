# scorelib: `make test` installs everything from nothing and runs the whole suite.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: install install-cuda test test-fast test-slurm slurm-up slurm-down demo bench \
	bench-install bench-kdiffusion bench-scaling bench-gpu lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The CUDA build of jaxlib, for GPU nodes: run it on a login node (slurm/train.sbatch does
# not install anything on compute nodes).
install-cuda: $(STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test,cuda]'

# Three pytest workers (pytest-xdist), each test file on one worker so that module fixtures
# (a trained toy run, the local Slurm) are built once. On 2 cores three workers finish
# first (measured: pytest 879 s against 960 s with two, four within noise of three;
# docs/development.md); the slowest modules go first (tests/conftest.py, SLOWEST_MODULES).
# JOBS=0 runs in one process.
JOBS    ?= 3
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadfile --no-loadscope-reorder --durations=15 tests

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadfile --no-loadscope-reorder -m "not slow" tests

# The tests of the Slurm path on a real single-node Slurm (root; they skip with the reason
# where Slurm is not installed: apt-get install slurm-wlm slurmdbd munge mariadb-server).
test-slurm: $(STAMP)
	$(BIN)/python -m pytest -q tests/slurm tests/parallel

# A single-node Slurm with accounting on this machine (root; slurm/local/up.sh):
#   make slurm-up; export SLURM_CONF=$(SLURM_DIR)/slurm.conf; sbatch ...; make slurm-down
# SLURM_DIR (default /tmp/scorelib-slurm) holds its slurm.conf, state, logs (log/) and pid
# files (run/); the accounting database sits in /tmp/scorelib-slurm-mysql.* (linked as
# $(SLURM_DIR)/mysql); make slurm-down stops the daemons and removes both. It listens on
# SLURM_LOCAL_PORT (default 16817: slurmctld) and the next three ports (slurmd, slurmdbd,
# mariadbd). A second one on the same machine needs its own directory and ports,
#   make slurm-up SLURM_LOCAL_PORT=16917 SLURM_DIR=/tmp/scorelib-slurm-16917
# (and SLURM_DIR=... on its make slurm-down); up.sh refuses, in one line naming a free
# port, a second one in the same directory or on a port in use.
SLURM_DIR ?= /tmp/scorelib-slurm
SLURM_LOCAL_PORT ?= 16817
slurm-up:
	SLURM_LOCAL_PORT=$(SLURM_LOCAL_PORT) slurm/local/up.sh $(SLURM_DIR)

slurm-down:
	slurm/local/down.sh $(SLURM_DIR)

# The main job: EDM on the real 8x8 digits (train, sample with Heun-18), then the tables of
# FD, two-sample test, precision/recall, bits/dim and memorisation, each beside its floor and
# a Gaussian baseline. Rerunning resumes (or reuses) outputs/digits_edm: a finished run's
# samples and their evaluation are printed again, not redrawn or recomputed (reuse=true).
demo: $(STAMP)
	$(BIN)/python -m experiments.train experiment=digits_edm
	$(BIN)/python -m experiments.evaluate run_dir=outputs/digits_edm reuse=true

bench: $(STAMP)
	$(BIN)/python benchmarks/samplers.py

# The optional `bench` extra (torch CPU, torchdiffeq, torchsde, safetensors) and k-diffusion
# without its dependencies (only its sampling module is used; BENCHMARKS.md, "scorelib vs
# k-diffusion").
KDIFFUSION ?= k-diffusion==0.1.1.post1
bench-install: $(STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test,bench]'
	$(BIN)/python -m pip install -q --no-deps '$(KDIFFUSION)'

bench-kdiffusion: bench-install
	$(BIN)/python benchmarks/vs_kdiffusion.py

bench-scaling: $(STAMP)
	$(BIN)/python benchmarks/scaling.py

# One accelerator, under 8 minutes: CIFAR-10 U-Net train steps/s, Heun-18 samples/s,
# fdistill_cifar10 steps/s and peak memory (after make install-cuda; refuses without a GPU;
# benchmarks/scaling_gpu.py --cpu-smoke runs every path at tiny sizes on a CPU).
bench-gpu: $(STAMP)
	$(BIN)/python benchmarks/scaling_gpu.py

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache
