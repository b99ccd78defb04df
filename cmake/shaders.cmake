# Shaders: every kernel variant of metal_shaders/kernel_list.inc (the one list, which the
# C++ kernel table expands too) goes glslangValidator -> SPIR-V -> spirv-val -> spirv-cross
# (reflection JSON) and sb_shaderc (MSL with the binding remap), all under
# ${CMAKE_BINARY_DIR}/shaders; then sb_shaderc embeds them in one generated source compiled
# into the library. Vulkan-only kernels (flags F_MMA or F_DOT: SPIR-V that SPIRV-Cross
# cannot read, e.g. cooperative matrices) get no MSL and no reflection JSON (none installed
# either); the structural test reads their interface from the SPIR-V itself.
set(SB_KERNEL_LIST ${CMAKE_SOURCE_DIR}/metal_shaders/kernel_list.inc)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${SB_KERNEL_LIST})
file(STRINGS ${SB_KERNEL_LIST} sb_kernel_lines REGEX "^SB_KERNEL\\(")
set(SB_KERNEL_VARIANTS)
foreach(line ${sb_kernel_lines})
  if(NOT line MATCHES "^SB_KERNEL\\(([a-z0-9_]+), ([a-z0-9_]+), ([A-Z0-9_]+), ")
    message(FATAL_ERROR "kernel_list.inc: cannot read '${line}'")
  endif()
  set(v "${CMAKE_MATCH_2}:${CMAKE_MATCH_3}:${CMAKE_MATCH_1}")
  if(line MATCHES "F_MMA|F_DOT")
    string(APPEND v ":vulkan")
  endif()
  list(APPEND SB_KERNEL_VARIANTS ${v})
endforeach()

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
  set(glslang_cmd ${SB_GLSLANG} --quiet -V --target-env vulkan1.2 -D${define} -I${SB_SHADER_SRC} ${SB_SHADER_SRC}/${file}.comp -o ${spv})
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
