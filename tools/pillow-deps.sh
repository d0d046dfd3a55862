#!/usr/bin/env bash
# The C libraries pillow-simd needs to compile every codec the upstream Pillow wheel has.
# Debian/Ubuntu as root: installs what is missing with apt-get. Elsewhere: stops before the
# compile, naming the packages to install, so a half-built PIL never reaches the venv.
set -euo pipefail

# Debian package -> pkg-config module that proves it is there
declare -A DEB=(
  [libjpeg62-turbo-dev]=libjpeg [zlib1g-dev]=zlib [libtiff-dev]=libtiff-4
  [libwebp-dev]=libwebp [libopenjp2-7-dev]=libopenjp2 [liblcms2-dev]=lcms2
  [libfreetype-dev]=freetype2 [libimagequant-dev]=imagequant
)
DNF="libjpeg-turbo-devel zlib-devel libtiff-devel libwebp-devel openjpeg2-devel lcms2-devel freetype-devel libimagequant-devel"
BREW="jpeg-turbo zlib libtiff webp openjpeg little-cms2 freetype libimagequant"

missing=()
for pkg in "${!DEB[@]}"; do
  pkg-config --exists "${DEB[$pkg]}" 2>/dev/null || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if command -v apt-get >/dev/null && command -v dpkg >/dev/null; then
  # Ubuntu names the libjpeg-turbo headers differently
  if ! apt-cache show libjpeg62-turbo-dev >/dev/null 2>&1; then
    missing=("${missing[@]/libjpeg62-turbo-dev/libjpeg-turbo8-dev}")
  fi
  if [ "$(id -u)" = 0 ]; then
    echo "pillow-simd needs: ${missing[*]} (installing with apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends pkg-config "${missing[@]}" >/dev/null \
      || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends pkg-config "${missing[@]}" >/dev/null; }
    exit 0
  fi
  echo "error: pillow-simd needs these packages; run: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "error: pillow-simd needs the development headers of: ${missing[*]}" >&2
echo "  Debian/Ubuntu: sudo apt-get install ${missing[*]}" >&2
echo "  Fedora/RHEL:   sudo dnf install $DNF" >&2
echo "  macOS:         brew install $BREW" >&2
exit 1
