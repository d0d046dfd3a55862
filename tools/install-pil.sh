#!/usr/bin/env bash
# PIL for `make setup`: pillow-simd where it can be built (its resize is faster), else the plain
# Pillow that tilefeed depends on, with one line saying why. Never fails for want of root or
# headers: plain Pillow gives the same results.
#   tools/install-pil.sh PYTHON [CC]
set -uo pipefail
py=$1
cc=${2:-cc}
pip() { "$py" -m pip --disable-pip-version-check --quiet "$@"; }
here=$(dirname "$0")

if ! why=$(bash "$here/pillow-deps.sh" 2>&1 >/dev/null); then
  echo "make setup: keeping plain Pillow, pillow-simd not built: ${why##*error: }" | head -1
  exit 0
fi
pip uninstall -y pillow pillow-simd >/dev/null 2>&1
if CC="$cc" pip install --no-cache-dir pillow-simd==12.1.1.post0 >/dev/null 2>&1; then
  exit 0
fi
echo "make setup: keeping plain Pillow, pillow-simd did not compile (see: $py -m pip install pillow-simd)"
pip uninstall -y pillow-simd >/dev/null 2>&1
pip install pillow
