#!/usr/bin/env bash
# One kernel variant's SPIR-V from a (modified) copy of metal_shaders/, the way cmake/shaders.cmake
# builds it, for SWITCHBOARD_SPIRV_DIR (bench/ab_model.sh): OUT_DIR/NAME.spv.
# Usage: bench/spirv_variant.sh SRC_DIR OUT_DIR NAME FILE DEFINE [vulkan-only] [-DEXTRA ...]
#   FILE: the .comp stem (attention for attention.comp); DEFINE: the variant's define (its
#   SB_KERNEL line); vulkan-only: also spirv-opt -O and sb_shaderc's NoContraction pass, as the
#   build does for the F_MMA / F_DOT kernels (SHADERC: that tool, default build/release/bin... found).
set -euo pipefail
if [[ $# -lt 5 ]]; then
  sed -n '2,8p' "$0" >&2
  exit 2
fi
src=$1 out=$2 name=$3 file=$4 define=$5
shift 5
opt=0
if [[ ${1:-} == vulkan-only ]]; then
  opt=1
  shift
fi
mkdir -p "$out"
glslangValidator --quiet -V --target-env vulkan1.2 "-D$define" "$@" -I"$src" "$src/$file.comp" -o "$out/$name.spv"
if [[ $opt == 1 ]]; then
  shaderc=${SHADERC:-$(find build -name sb_shaderc -type f -perm -u+x | head -1)}
  spirv-opt --target-env=vulkan1.2 -O "$out/$name.spv" -o "$out/$name.spv"
  "$shaderc" precise "$out/$name.spv" "$out/$name.spv"
fi
spirv-val --target-env vulkan1.2 "$out/$name.spv"
echo "$out/$name.spv"
