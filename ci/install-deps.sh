#!/usr/bin/env bash
# Installs Switchboard's build and test dependencies from Debian 12's archive.
# Idempotent: a package already present is skipped; run as root (or via sudo).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  clang libclang-rt-14-dev
  flatbuffers-compiler libflatbuffers-dev
  libspdlog-dev libfmt-dev
  glslang-tools spirv-tools spirv-cross libspirv-cross-c-shared-dev
  libvulkan-dev mesa-vulkan-drivers
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev
  nlohmann-json3-dev
  libcli11-dev
  libxxhash-dev
  python3
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
