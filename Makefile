# mlxd: two commands on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=
PYTEST_ARGS ?=

.PHONY: install serve test test-fast bench blas kernels kernels-sanitized clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The stamp re-runs the install when pyproject.toml changes.
# mlx-vlm's model code and processors serve vision models (worker/vision_model.py); its
# declared dependencies are for its own server, audio, video and training (opencv,
# datasets, mlx-audio, fastapi...), none of which mlxd imports: it is installed without them.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test]"
	$(BIN)/python -m pip install --quiet --no-deps "mlx-vlm>=0.7.10,<0.8"
	@touch $@

install: $(VENV)/.installed blas kernels

# mlxd's CPU attention/SwiGLU kernels (worker/csrc), built against the installed MLX.
# Without a compiler or cmake the service still runs, on MLX's slower CPU path.
KERNEL_SO = worker/_cpu_kernels$(shell $(BIN)/python -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))" 2>/dev/null)
kernels: $(VENV)/.installed
	@if [ "$$(uname -s)" = Darwin ]; then exit 0; fi; \
	if ! command -v cmake >/dev/null 2>&1 || ! command -v c++ >/dev/null 2>&1; then \
		echo "warning: cmake or a C++ compiler is missing: CPU kernels not built (attention runs slower)"; exit 0; fi; \
	$(MAKE) --no-print-directory $(KERNEL_SO)

$(KERNEL_SO): worker/csrc/*.cpp worker/csrc/*.h worker/csrc/*.inc worker/csrc/CMakeLists.txt $(VENV)/.installed
	$(BIN)/python -m pip install --quiet "nanobind>=3,<4"
	@mkdir -p .cache
	cmake -S worker/csrc -B .cache/kernels-build -DPython_EXECUTABLE=$(abspath $(BIN)/python) \
		-DOUTPUT_DIR=$(abspath worker) > .cache/kernels-build.log
	cmake --build .cache/kernels-build -j 2 >> .cache/kernels-build.log
	@echo "built $@"

# The kernel tests against the kernels built with AddressSanitizer and UBSan, in a copy of
# the tree (the served kernels in worker/ stay as they are). Python is not instrumented:
# the sanitizer runtimes are preloaded and leak checks are off (the interpreter's own).
SANITIZED := .cache/sanitized
KERNEL_TESTS := tests/worker/test_cpu_kernels.py tests/worker/test_norm_rope_kernels.py \
	tests/worker/test_quantized_kernels.py tests/worker/test_kernel_threads.py
kernels-sanitized: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet "nanobind>=3,<4"
	rm -rf $(SANITIZED) && mkdir -p $(SANITIZED)
	cp -r worker protocol tests pyproject.toml $(SANITIZED)/
	rm -f $(SANITIZED)/worker/_cpu_kernels*.so
	cmake -S worker/csrc -B .cache/kernels-sanitized-build -DMLXD_SANITIZE=ON \
		-DPython_EXECUTABLE=$(abspath $(BIN)/python) -DOUTPUT_DIR=$(abspath $(SANITIZED)/worker) \
		> .cache/kernels-sanitized-build.log
	cmake --build .cache/kernels-sanitized-build -j 2 >> .cache/kernels-sanitized-build.log
	cd $(SANITIZED) && LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
		ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		$(abspath $(BIN)/python) -m pytest -q -p no:cacheprovider $(KERNEL_TESTS)

# Optimised BLAS for MLX's CPU build (README.md, "Linux CPUs").
blas:
	@sh deploy/install_blas.sh

serve: install
	$(BIN)/mlxd serve $(ARGS)

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Every test that needs no real model and no network (marked by tests/conftest.py): the run
# for every change. `make test` runs them all and is what CI runs.
test-fast: install
	$(BIN)/python -m pytest -m fast -n auto $(PYTEST_ARGS)

bench: install
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .cache/kernels-build worker/_cpu_kernels*.so
