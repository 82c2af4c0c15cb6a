# Stasis. `make run` and `make test` each set up the host first (idempotent, seconds when done).
VENV := .venv
PY := $(VENV)/bin/python
STATE_DIR ?= $(CURDIR)/.state

.PHONY: setup run test lint protos check-protos images bench fuzz clean-state

setup:
	@./scripts/host-setup.sh

run: setup
	$(VENV)/bin/stasis up --nodes 2 --state-dir $(STATE_DIR)

test: setup lint check-protos
	$(VENV)/bin/pytest -q --durations=15 -m "not images"

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

protos:
	$(PY) protos/generate.py

check-protos:
	$(PY) protos/generate.py --check

# The container images helm/stasis deploys (stasis:<appVersion>) and one per component, built
# with Docker FROM the base rootfs setup makes; a dockerd of its own if none answers (docs/helm.md).
# Then each entry point is started in a container and must answer its health check.
images: setup
	./scripts/images.sh
	$(VENV)/bin/pytest -q -m images tests/helm/test_images.py

bench: setup
	$(PY) benchmarks/bench.py
	$(PY) benchmarks/control_plane.py
	$(PY) benchmarks/snapshot_throughput.py
	$(PY) benchmarks/gateway_latency.py
	$(PY) benchmarks/image_pull.py
	$(PY) benchmarks/fork.py

FUZZ_SECONDS ?= 300

# Coverage-guided fuzzing (atheris) of every parser a stranger or a harness feeds, each for
# FUZZ_SECONDS; corpora are kept in .cache/fuzz between runs.
fuzz: setup
	for target in spec image-config gateway manifest archive; do \
	  $(PY) -m tests.fuzz_coverage $$target --seconds $(FUZZ_SECONDS) || exit 1; done

clean-state:
	rm -rf $(STATE_DIR)
