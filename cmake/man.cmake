# SPDX-License-Identifier: BSD-3-Clause
# Man pages, generated when building from what they describe (the programs'
# --help, the public headers' comments: tools/man/gen_man.sh), gzipped as
# Debian wants them, installed under share/man. tests/unit/check_man.py
# checks they say what --help says and render without warnings.
find_program(SNAP_GZIP gzip REQUIRED)
set(SNAP_MAN_DIR ${PROJECT_BINARY_DIR}/man)
set(_gen ${PROJECT_SOURCE_DIR}/tools/man/gen_man.sh)
file(MAKE_DIRECTORY ${SNAP_MAN_DIR})

add_custom_command(OUTPUT ${SNAP_MAN_DIR}/snapsmp.1
  COMMAND bash ${_gen} help snapsmp $<TARGET_FILE:snapsmp> ${PROJECT_VERSION} ${SNAP_MAN_DIR}/snapsmp.1
  DEPENDS snapsmp ${_gen} VERBATIM)
add_custom_command(OUTPUT ${SNAP_MAN_DIR}/snaptool.1
  COMMAND bash ${_gen} help snaptool $<TARGET_FILE:snaptool> ${PROJECT_VERSION} ${SNAP_MAN_DIR}/snaptool.1
    "inspect, verify, flush, export and recover libsnap snapshots"
  DEPENDS snaptool ${_gen} VERBATIM)
add_custom_command(OUTPUT ${SNAP_MAN_DIR}/snapbench.1
  COMMAND bash ${_gen} help snapbench $<TARGET_FILE:snapbench> ${PROJECT_VERSION} ${SNAP_MAN_DIR}/snapbench.1
  DEPENDS snapbench ${_gen} VERBATIM)
add_custom_command(OUTPUT ${SNAP_MAN_DIR}/libsnap.3
  COMMAND bash ${_gen} header ${PROJECT_VERSION} ${SNAP_MAN_DIR}/libsnap.3 ${SNAP_PUBLIC_HEADERS}
  DEPENDS ${SNAP_PUBLIC_HEADERS} ${_gen} ${PROJECT_SOURCE_DIR}/tools/man/header2man.awk VERBATIM)

set(_gz)
foreach(page snapsmp.1 snaptool.1 snapbench.1 libsnap.3)
  # -n: no name or time stamp inside, so the package is reproducible.
  add_custom_command(OUTPUT ${SNAP_MAN_DIR}/${page}.gz
    COMMAND ${SNAP_GZIP} -9nc ${SNAP_MAN_DIR}/${page} > ${SNAP_MAN_DIR}/${page}.gz
    DEPENDS ${SNAP_MAN_DIR}/${page})
  list(APPEND _gz ${SNAP_MAN_DIR}/${page}.gz)
endforeach()
add_custom_target(man ALL DEPENDS ${_gz})

install(FILES ${SNAP_MAN_DIR}/snapsmp.1.gz ${SNAP_MAN_DIR}/snaptool.1.gz ${SNAP_MAN_DIR}/snapbench.1.gz
  DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT runtime)
install(FILES ${SNAP_MAN_DIR}/libsnap.3.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man3 COMPONENT dev)
