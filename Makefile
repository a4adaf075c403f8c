# The two commands of the README's quick start. Each installs what it needs first.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: tour test bench install lab gpu-check gpu-notebooks

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/install.sh
	bash scripts/install.sh
	touch $@

tour: install          ## the main job: measure the course's techniques on this machine
	$(PY) -m labsupport tour --out reports

# `make test` runs in lanes (pytest-xdist, one test file or notebook per lane at a time), each lane
# with one OpenMP thread: two lanes of two threads would spin-wait on each other's cores. Up to 4
# lanes (each loads the embedded model); TEST_LANES=0 runs every test in this process, on all of
# torch's threads.
TEST_LANES ?= $(shell $(PY) -c "import os; print(min(4, len(os.sched_getaffinity(0))))" 2>/dev/null || echo 2)
LANE_THREADS := $(if $(filter 0,$(TEST_LANES)),,OMP_NUM_THREADS=1)

test: install          ## unit tests + every notebook under nbval, in lanes
	$(LANE_THREADS) $(PY) -m pytest -n $(TEST_LANES) --dist loadfile

bench: install         ## every benchmark, as JSON
	$(PY) -m labsupport bench --out reports/bench.json

gpu-check: install     ## on a GPU: the fast paths gated, then measured (7 min, unattended); a CPU rehearsal without one
	$(PY) scripts/gpu_check.py

gpu-notebooks: install ## on a GPU (Colab's T4): gpu tests, every notebook under nbval, a short tour; a dry run without one
	$(PY) scripts/gpu_notebooks.py

lab: install           ## open the course in JupyterLab
	$(VENV)/bin/jupyter lab notebooks/

.PHONY: student
student: install       ## student versions of every notebook (solutions -> stubs) in student/
	$(PY) -m labsupport student --out student
