# tilefeed: `make demo` (the tour) and `make test` (the suite) install everything they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --quiet --disable-pip-version-check
STAMP  := $(VENV)/.installed
# pillow-simd compiles here; AVX2 where the CPU has it.
SIMD_CC := $(shell grep -q avx2 /proc/cpuinfo 2>/dev/null && echo "cc -mavx2" || echo cc)

.PHONY: setup test test-fast demo bench bench-preprocess gpu-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0            # the CPU build on these machines; an open range pulls CUDA
	$(PIP) -e '.[dev]'
	# pillow-simd last: it provides the same PIL package as pillow, which matplotlib pulls in.
	$(PY) -m pip uninstall --quiet -y pillow pillow-simd
	CC="$(SIMD_CC)" $(PIP) --no-cache-dir pillow-simd==12.1.1.post0
	$(PY) -c "import PIL; assert 'post' in PIL.__version__, PIL.__version__; print('PIL', PIL.__version__, '(pillow-simd)')"
	touch $@

test: setup
	$(PY) -m pytest -q

demo: setup
	$(VENV)/bin/tilefeed demo

bench: setup
	$(VENV)/bin/tilefeed bench preprocess

gpu-check: setup
	$(PY) -m pytest -q -m gpu

clean:
	rm -rf $(VENV) .cache *.egg-info
