# tilefeed: `make demo` (the tour) and `make test` (the suite) install everything they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --quiet --disable-pip-version-check
STAMP  := $(VENV)/.installed
# pillow-simd compiles here; AVX2 where the CPU has it.
SIMD_CC := $(shell grep -q avx2 /proc/cpuinfo 2>/dev/null && echo "cc -mavx2" || echo cc)

.PHONY: setup test test-fast check docs demo bench device-graph-check ffcv-venv img2dataset-venv gpu-check wheelhouse install-offline clean

setup: $(STAMP)

# torch with the torchvision and timm that import beside it: the recipe-parity tests and the
# training scripts the Loader swaps into (timm's and torchvision's train.py) need all three. The
# torchvision wheels are built against torch's CUDA build, so the pin is that build (it runs on
# a CPU-only machine too); another pair: make setup TORCH_SPEC=torch==X TORCHVISION_SPEC=torchvision==Y
TORCH_SPEC ?= torch==2.14.1
TORCHVISION_SPEC ?= torchvision==0.29.1
TIMM_SPEC ?= timm==1.0.31
# DALI's build for the pinned torch's CUDA major (13); a CUDA 12 torch takes CUDA=12 (that
# build also runs CPU-only).
CUDA ?= 13
PIL_PLUGINS := pillow-avif-plugin==1.6.0 pillow-heif==1.8.1

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) "$(TORCH_SPEC)" "$(TORCHVISION_SPEC)" "$(TIMM_SPEC)"
	$(PIP) -e '.[dev,cuda$(CUDA)]'
	# pillow-simd last: it provides the same PIL package as the plain Pillow tilefeed depends on.
	# It compiles only the codecs whose headers are present: those are installed first (apt-get
	# as root on Debian/Ubuntu); without root or headers plain Pillow stays, said in one line.
	bash tools/install-pil.sh $(PY) "$(SIMD_CC)"
	# AVIF and HEIC through plugin wheels that bundle their libraries; --no-deps, or they
	# would pull plain pillow back over pillow-simd.
	$(PIP) --no-deps $(PIL_PLUGINS)
	$(PY) -m tilefeed.cli.doctor --pil
	touch $@

# img2dataset's venv too (about 30 s to install): its shards are a source the suite preprocesses.
test: setup img2dataset-venv
	$(PY) -m pytest -q

# The inner loop: everything but the slow fault, cluster, distributed and install tests.
test-fast: setup
	$(PY) -m pytest -q -m "not slow"

# Lint, types and the floor plan: ruff (pyflakes, pycodestyle, bugbear), mypy over the package,
# import-linter's contracts (pyproject.toml), a warning (never a failure) for a module over 600 lines,
# the documentation site built with --strict (a broken link or reference fails), a README of
# at most 200 lines.
check: setup
	$(PY) -m ruff check .
	$(PY) -m mypy -p tilefeed
	$(VENV)/bin/lint-imports
	$(PY) tools/import_cycles.py
	$(PY) tools/module_lines.py 600
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
	@test $$(wc -l < README.md) -le 200 || { echo "README.md: $$(wc -l < README.md) lines, over 200: move the material to a docs page"; exit 1; }

# The documentation site (mkdocs.yml, pages under docs/) into site/.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

demo: setup
	$(VENV)/bin/tilefeed demo

# A quick look on this machine: preprocessing, the loader alone, and four loaders against a 40 ms step
# (docs/benchmarks.md's tables each name their own command).
bench: setup
	$(VENV)/bin/tilefeed bench preprocess
	$(VENV)/bin/tilefeed bench loader
	$(VENV)/bin/tilefeed bench --loaders baseline,dali-files,tiles-dataloader,tilefeed \
		--batch-size 64 --steps 40 --step-ms 40 --workers 2 --out bench-out/bench.json --plots bench-out

# The GPU's graph on DALI's CPU backend against the CPU path, over codecs x fits x recipes x
# outputs, with boxes and masks: a minute, no GPU (docs/development.md#the-devices-graph-without-a-gpu).
device-graph-check: setup
	$(VENV)/bin/tilefeed bench device-graph --out bench-out/device-graph.json

# FFCV 1.0.2, the peer of `tilefeed bench loader --peer ffcv --peer-python .ffcv-venv/bin/python`, in a
# venv of its own (it pulls plain Pillow and OpenCV) that sees this venv's torch through a .pth file, so
# both sides run the same torch. Its C extension needs OpenCV's and libjpeg-turbo's headers (apt-get).
FFCV_VENV ?= .ffcv-venv
ffcv-venv: setup
	command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && apt-get install -y -q libopencv-dev libturbojpeg0-dev pkg-config || true
	$(PYTHON) -m venv $(FFCV_VENV)
	$(PY) -c "import site; print(site.getsitepackages()[0])" > "$$($(FFCV_VENV)/bin/python -c 'import site; print(site.getsitepackages()[0])')/tilefeed-venv.pth"
	$(FFCV_VENV)/bin/python -m pip install --quiet --disable-pip-version-check ffcv==1.0.2 pillow

# img2dataset 1.47.0, whose shards tests/preprocess/test_img2dataset.py makes from URLs served on
# 127.0.0.1 and preprocesses: in a venv of its own, since it pins webdataset<0.3, pandas<3,
# albumentations<2 and OpenCV, which tilefeed's venv must not take.
I2D_VENV := .img2dataset-venv
I2D_STAMP := $(I2D_VENV)/.installed
img2dataset-venv: $(I2D_STAMP)

$(I2D_STAMP):
	$(PYTHON) -m venv $(I2D_VENV)
	$(I2D_VENV)/bin/python -m pip install --quiet --disable-pip-version-check img2dataset==1.47.0
	touch $@

# Offline GPU nodes: on a machine with the package index, download every wheel a node needs
# (default: CPython 3.12, CUDA 13; WH_PY=3.11 WH_CUDA=12 for others), torch excepted.
WH_PY   ?= 3.12
WH_CUDA ?= 13
WHEELHOUSE ?= wheelhouse
wheelhouse: setup
	$(PY) tools/wheelhouse.py --python $(WH_PY) --cuda $(WH_CUDA) --out $(WHEELHOUSE)

# On the node, into its own Python (which has CUDA torch): no network needed.
NODE_PY ?= python3
install-offline:
	$(NODE_PY) -m pip install --no-index --find-links $(WHEELHOUSE) 'tilefeed[cuda$(WH_CUDA),coco]' \
		pillow-avif-plugin pillow-heif pillow
	$(NODE_PY) -m tilefeed.cli.doctor --pil --offline

# On a CUDA machine, in a few minutes: the GPU tests (a failure does not stop the rest), then
# the GPU report (decode on the device, device memory, stall at a bf16 ResNet-50 step), with
# the tests' results, in one JSON.
# GPU_PY is any Python with CUDA torch, DALI and this project installed (default: the venv).
GPU_PY ?= $(PY)
TF     := $(GPU_PY) -m tilefeed
gpu-check:
	@$(GPU_PY) -c "import sys, torch; torch.cuda.is_available() or sys.exit('gpu-check: no CUDA device (torch.cuda.is_available() is False): run it on a GPU node')"
	@$(GPU_PY) -c "import sys, importlib.util as u; u.find_spec('nvidia.dali') or sys.exit('gpu-check: DALI is not installed: pip install tilefeed[cuda12] or [cuda13]')"
	@mkdir -p bench-out
	-$(GPU_PY) -m pytest -q -m gpu -p no:cacheprovider --junitxml bench-out/gpu-tests.xml
	$(TF) bench gpu-report --tests-xml bench-out/gpu-tests.xml --out bench-out/gpu-report.json
	-$(TF) bench device-graph --cuda --out bench-out/device-graph.json
	$(TF) bench recipe --count 4800 --out bench-out/recipe.json
	-$(TF) bench detection --count 512 --out bench-out/detection.json
