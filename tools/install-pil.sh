#!/usr/bin/env bash
# PIL for `make setup`: pillow-simd where it can be built (its resize is faster), else the plain
# Pillow that tilefeed depends on, with one line saying why. Never fails for want of root or
# headers: plain Pillow gives the same results. pillow-simd is built into a wheel first and
# swapped in only once built, so a failed build leaves plain Pillow whole.
#   tools/install-pil.sh PYTHON [CC]
set -uo pipefail
py=$1
cc=${2:-cc}
pip() { "$py" -m pip --disable-pip-version-check --quiet "$@"; }
here=$(dirname "$0")

plain() {
  # plain Pillow alone: one installed over an earlier pillow-simd would leave a mix of the two
  if "$py" -m pip show --quiet pillow-simd >/dev/null 2>&1; then
    pip uninstall -y pillow pillow-simd >/dev/null 2>&1
    pip install pillow
  fi
}

if ! why=$(bash "$here/pillow-deps.sh" 2>&1 >/dev/null); then
  echo "make setup: keeping plain Pillow, pillow-simd not built: ${why##*error: }" | head -1
  plain
  exit 0
fi
built=$(mktemp -d)
trap 'rm -rf "$built"' EXIT
if CC="$cc" pip wheel --no-deps --no-cache-dir -w "$built" pillow-simd==12.1.1.post0 >/dev/null 2>&1; then
  pip uninstall -y pillow pillow-simd >/dev/null 2>&1
  # the wheel built: installing it fails only with the machine (a full disk); plain Pillow then
  pip install --no-deps "$built"/*.whl && exit 0
  echo "make setup: keeping plain Pillow, the pillow-simd wheel built but did not install"
  pip install pillow
  exit 0
fi
echo "make setup: keeping plain Pillow, pillow-simd did not compile (see: $py -m pip wheel pillow-simd)"
plain
