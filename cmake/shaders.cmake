# Shaders: every kernel variant of metal_shaders/ goes glslangValidator -> SPIR-V ->
# spirv-val -> spirv-cross (reflection JSON) and sb_shaderc (MSL with the binding
# remap), all under ${CMAKE_BINARY_DIR}/shaders; then sb_shaderc embeds them in one
# generated source compiled into the library. Variants: "file:DEFINE:kernel_name", or
# "file:DEFINE:kernel_name:vulkan" for a Vulkan-only kernel (SPIR-V that SPIRV-Cross
# cannot read, e.g. cooperative matrices): no MSL and no reflection JSON (none installed
# either); the structural test reads its interface from the SPIR-V itself.
set(SB_KERNEL_VARIANTS
  elementwise:BINARY:binary
  elementwise:BINARY_DIV:binary_div
  elementwise:UNARY:unary
  elementwise:BINARY_INT:binary_int
  elementwise:UNARY_INT:unary_int
  cast:CAST:cast
  cast:CAST_I64:cast_i64
  shape_ops:FILL:fill
  shape_ops:REGION:region
  shape_ops:TRANSPOSE:transpose
  glu:GLU:glu
  combine:COMBINE:combine
  combine:COMBINE16:combine16
  combine:COMBINE_ROWS:combine_rows
  permute:GATHER_ROWS:gather_rows
  permute:GATHER_ROWS16:gather_rows16
  permute:INVERT:invert_permutation
  gather_qmm:QUANTIZE:quantize_q8
  gather_qmm:QUANTIZE16:quantize_q8_16
  gather_qmm:QMM:qmm
  gather_qmm:QMM_ROW:qmm_row
  gather_qmm:QMM_ROW_GLU:qmm_row_glu
  gather_qmm:QMM_ROW_2K:qmm_row_2k
  gather_qmm:QMM_ROW_GLU_2K:qmm_row_glu_2k
  gather_qmm:QMM_ROW_COMBINE_2K:qmm_row_combine_2k
  gather_qmm:QMM_ROW_DOT4:qmm_row_dot4:vulkan
  gather_qmm:QMM_ROW_2K_DOT4:qmm_row_2k_dot4:vulkan
  gather_qmm:QMM_ROW_GLU_DOT4:qmm_row_glu_dot4:vulkan
  gather_qmm:QMM_ROW_GLU_2K_DOT4:qmm_row_glu_2k_dot4:vulkan
  gather_qmm:QMM_ROW_COMBINE_2K_DOT4:qmm_row_combine_2k_dot4:vulkan
  gather_qmm:QMM_TILES:qmm_tiles
  gather_qmm:QMM_TILE:qmm_tile
  gather_qmm:QMM_MMA:qmm_mma:vulkan
  gather_qmm:QMM_MMA4:qmm_mma4:vulkan
  gather_qmm:QMM_MMA4_GLU:qmm_mma4_glu:vulkan
  gather_qmm:QMM_MMA_PROBE:qmm_mma_probe:vulkan
  permute:ARGSORT:argsort
  router:ROUTER:router
  router:ROUTER_E256_SOFTMAX:router_e256_softmax
  router:ROUTER_E256_TOPK_SOFTMAX:router_e256_topk_softmax
  router:ROUTER_E256_SIGMOID:router_e256_sigmoid
  gather_mm:GATHER_MM:gather_mm
  matmul:MATMUL:matmul
  matmul:MATMUL_ROWS16:matmul_rows16
  matmul:MATMUL_TILE:matmul_tile
  norm:SOFTMAX:softmax
  norm:RMS_NORM:rms_norm
  norm:SOFTMAX_ROW:softmax_row
  norm:RMS_NORM_ROW:rms_norm_row
  reduce:REDUCE:reduce
  reduce:REDUCE_MEAN:reduce_mean
  reduce:ARGMAX:argmax
  reduce:ARGMAX_ROW:argmax_row
  reduce:ARGMAX_INT:argmax_int
  probe:PROBE:numerics_probe
  probe:STREAM_READ:stream_read)

find_program(SB_GLSLANG glslangValidator REQUIRED)
find_program(SB_SPIRV_VAL spirv-val REQUIRED)
find_program(SB_SPIRV_CROSS spirv-cross REQUIRED)
find_program(SB_SPIRV_OPT spirv-opt REQUIRED)
find_library(SB_SPIRV_CROSS_C spirv-cross-c-shared REQUIRED)

add_executable(sb_shaderc metal_shaders/tools/sb_shaderc.cpp)
target_link_libraries(sb_shaderc PRIVATE ${SB_SPIRV_CROSS_C})
# A build tool: no sanitizers (its output is what matters, and ASan slows the build).
target_compile_options(sb_shaderc PRIVATE -fno-sanitize=all)
target_link_options(sb_shaderc PRIVATE -fno-sanitize=all)

set(SB_SHADER_DIR ${CMAKE_BINARY_DIR}/shaders)
set(SB_SHADER_SRC ${CMAKE_SOURCE_DIR}/metal_shaders)
file(GLOB SB_SHADER_INCLUDES CONFIGURE_DEPENDS ${SB_SHADER_SRC}/*.glsl ${SB_SHADER_SRC}/*.h)
set(SB_EMBED_ARGS)
set(SB_SHADER_OUTPUTS)
foreach(v ${SB_KERNEL_VARIANTS})
  string(REPLACE ":" ";" parts ${v})
  list(GET parts 0 file)
  list(GET parts 1 define)
  list(GET parts 2 name)
  set(spv ${SB_SHADER_DIR}/${name}.spv)
  set(msl ${SB_SHADER_DIR}/${name}.metal)
  set(json ${SB_SHADER_DIR}/${name}.json)
  set(glslang_cmd ${SB_GLSLANG} -V --target-env vulkan1.2 -D${define} -I${SB_SHADER_SRC} ${SB_SHADER_SRC}/${file}.comp -o ${spv})
  list(LENGTH parts nparts)
  if(nparts GREATER 3)  # Vulkan only: no MSL, no JSON ("-" tells sb_shaderc embed)
    set(msl -)
    set(json -)
    add_custom_command(
      OUTPUT ${spv}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${SB_SHADER_DIR}
      COMMAND ${glslang_cmd}
      # Loops unrolled and register arrays scalarized before the driver sees them (the
      # NVIDIA compiler otherwise leaves the accumulators in local memory); the unroller's
      # copies lose NoContraction, which sb_shaderc puts back (the lint checks it).
      COMMAND ${SB_SPIRV_OPT} --target-env=vulkan1.2 -O ${spv} -o ${spv}
      COMMAND sb_shaderc precise ${spv} ${spv}
      COMMAND ${SB_SPIRV_VAL} --target-env vulkan1.2 ${spv}
      DEPENDS ${SB_SHADER_SRC}/${file}.comp ${SB_SHADER_INCLUDES} sb_shaderc
      COMMENT "shader ${name} (${file}.comp -D${define}, Vulkan only)" VERBATIM)
  else()
    add_custom_command(
      OUTPUT ${spv} ${msl} ${json}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${SB_SHADER_DIR}
      COMMAND ${glslang_cmd}
      COMMAND ${SB_SPIRV_VAL} --target-env vulkan1.2 ${spv}
      COMMAND ${SB_SPIRV_CROSS} ${spv} --reflect --output ${json}
      COMMAND sb_shaderc msl ${spv} sb_${name} ${msl}
      DEPENDS ${SB_SHADER_SRC}/${file}.comp ${SB_SHADER_INCLUDES} sb_shaderc
      COMMENT "shader ${name} (${file}.comp -D${define})" VERBATIM)
  endif()
  list(APPEND SB_EMBED_ARGS ${name} ${spv} ${msl} ${json})
  list(APPEND SB_SHADER_OUTPUTS ${spv})
  if(nparts EQUAL 3)
    list(APPEND SB_SHADER_OUTPUTS ${msl} ${json})
  endif()
endforeach()
set(SB_EMBEDDED_CPP ${CMAKE_BINARY_DIR}/generated/embedded_shaders.cpp)
add_custom_command(
  OUTPUT ${SB_EMBEDDED_CPP}
  COMMAND sb_shaderc embed ${SB_EMBEDDED_CPP} ${SB_EMBED_ARGS}
  DEPENDS ${SB_SHADER_OUTPUTS} sb_shaderc VERBATIM)
add_custom_target(switchboard_shaders DEPENDS ${SB_EMBEDDED_CPP})
install(DIRECTORY ${SB_SHADER_DIR}/ DESTINATION ${CMAKE_INSTALL_DATADIR}/switchboard/shaders
        FILES_MATCHING PATTERN "*.spv" PATTERN "*.metal" PATTERN "*.json")
