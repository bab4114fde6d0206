# src/config/KEYS.md must equal `sparsebalance keys --markdown` (the configuration reference is
# generated, never edited by hand). Run as: cmake -DSB=<program> -DKEYS=<KEYS.md> -P keys_markdown.cmake
execute_process(COMMAND ${SB} keys --markdown OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "`${SB} keys --markdown` failed (exit ${rc})")
endif()
file(READ ${KEYS} committed)
if(NOT out STREQUAL committed)
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/KEYS.md.generated "${out}")
  message(FATAL_ERROR "src/config/KEYS.md is stale: it differs from `sparsebalance keys --markdown` "
    "(new output in ${CMAKE_CURRENT_BINARY_DIR}/KEYS.md.generated; see `diff` of the two). Regenerate it, "
    "from the repository root:\n  build/src/sparsebalance keys --markdown > src/config/KEYS.md")
endif()
