# heavykv_cc_library: one room's library (abseil's absl_cc_library in spirit).
#
#   heavykv_cc_library(NAME heavykv_gguf
#     SRCS gguf.cc gguf_writer.cc
#     DEPS heavykv_kernels_cpu absl::statusor          # public: users of the room get them too
#     PRIVATE_DEPS PkgConfig::PCRE2)                   # used inside the room only
#
# Every room includes from the project root ("engine/gguf/gguf.h"), so the root is the include
# directory. DEPS are the arrows of docs/ARCHITECTURE.md's map of the rooms: list only what the
# room's sources really use.
function(heavykv_cc_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${ARG_NAME} ${ARG_SRCS})
  target_include_directories(${ARG_NAME} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${ARG_NAME} PUBLIC ${ARG_DEPS})
  if(ARG_PRIVATE_DEPS)
    target_link_libraries(${ARG_NAME} PRIVATE ${ARG_PRIVATE_DEPS})
  endif()
endfunction()
