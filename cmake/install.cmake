# SPDX-License-Identifier: BSD-3-Clause
# Install rules, the pkg-config file and the CMake package, in one place so
# that the components' CMakeLists.txt stay about building. Included by the
# top-level CMakeLists.txt after every component.
#
#   cmake --install build --prefix P     (or DESTDIR=... cmake --install build)
#
#   P/bin/snapsmp, P/bin/snaptool        RUNPATH $ORIGIN/../<libdir>: relocatable
#   P/bin/snapbench                      the benchmarks (`snaptool bench` execs it), same RUNPATH
#   P/libexec/libsnap/snap_ec_bench      MPI helper snapbench ec starts under mpiexec
#   P/include/snap/{snap,error,types,config,region}.h  what a user of libsnap.so includes
#   P/<libdir>/libsnap.so.<PROJECT_VERSION> (+ .so.0, .so) and libsnap_cuda.so when nvcc was found
#   P/<libdir>/hdf5/serial/plugins/libh5z_snapcodec.so   Debian's HDF5 plugin directory
#   P/<libdir>/pkgconfig/libsnap.pc      prefix written at install time
#   P/<libdir>/cmake/libsnap/            find_package(libsnap) -> libsnap::snap
#   P/share/man/man1, man3; P/share/doc/libsnap (LICENSE, README.md)
#   P/share/libsnap/launch               the launch recipes (mpirun, SLURM, torchrun)
include(CMakePackageConfigHelpers)

# The headers of libsnap.so's API (snap.h includes the other four). ec.h,
# io.h and codec.h belong to static libraries that are not installed.
set(SNAP_PUBLIC_HEADERS
  ${PROJECT_SOURCE_DIR}/libsnap/include/snap/snap.h
  ${PROJECT_SOURCE_DIR}/common/include/snap/error.h
  ${PROJECT_SOURCE_DIR}/common/include/snap/types.h
  ${PROJECT_SOURCE_DIR}/common/include/snap/config.h
  ${PROJECT_SOURCE_DIR}/common/include/snap/region.h)

# Debian's libhdf5 (1.10, serial flavour) looks for plugins in
# /usr/lib/<multiarch>/hdf5/serial/plugins when HDF5_PLUGIN_PATH is unset,
# the directory of hdf5-filter-plugin (filter 32004, LZ4). Elsewhere HDF5's
# own default is <prefix>/lib/plugin of its installation, which we cannot
# know: lib/hdf5/plugin then, and users set HDF5_PLUGIN_PATH.
if(HDF5_C_LIBRARIES MATCHES "/hdf5/serial/")
  set(_plugin_dir ${CMAKE_INSTALL_LIBDIR}/hdf5/serial/plugins)
else()
  set(_plugin_dir ${CMAKE_INSTALL_LIBDIR}/hdf5/plugin)
endif()
set(SNAP_HDF5_PLUGIN_DIR ${_plugin_dir} CACHE STRING
  "Where the HDF5 codec-frame plugin is installed, relative to the prefix")

# Programs find libsnap.so in the prefix they were installed to, whatever it
# is (a temporary prefix, /opt/libsnap, /usr).
file(RELATIVE_PATH _bin_to_lib /${CMAKE_INSTALL_BINDIR} /${CMAKE_INSTALL_LIBDIR})
if(NOT SNAP_CLIENT_ONLY)
  set_target_properties(snaptool snapsmp snapbench PROPERTIES INSTALL_RPATH "$ORIGIN/${_bin_to_lib}")
endif()

install(TARGETS snap EXPORT libsnapTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${SNAP_PUBLIC_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/snap COMPONENT dev)
if(NOT SNAP_CLIENT_ONLY)
  install(TARGETS snapsmp snaptool EXPORT libsnapTargets
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
  # The benchmarks: a program for people, not for CMake consumers (no export).
  # Where snapbench looks for its helper is tools/CMakeLists.txt's SNAP_BENCH_LIBEXEC.
  install(TARGETS snapbench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
  install(TARGETS snap_ec_bench RUNTIME DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/libsnap COMPONENT runtime)
endif()
# libsnap.so dlopens the CUDA backend from its own directory (libsnap/src/gpu.c).
if(TARGET snap_cuda)
  install(TARGETS snap_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime)
endif()
if(NOT SNAP_CLIENT_ONLY)
  install(TARGETS h5z_snapcodec LIBRARY DESTINATION ${SNAP_HDF5_PLUGIN_DIR} COMPONENT runtime)
endif()

# ---- pkg-config ----------------------------------------------------------
# Written when installing, so the prefix is the one given to
# `cmake --install --prefix` (or CPack's /usr), not the configure-time one.
# Point at an unpacked copy with --define-variable=prefix=DIR.
set(_pc_in ${PROJECT_SOURCE_DIR}/cmake/libsnap.pc.in)
set(_pc_out ${PROJECT_BINARY_DIR}/cmake/libsnap.pc)
foreach(_d LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${_d}}")
    set(_pc_${_d} "${CMAKE_INSTALL_${_d}}")
  else()
    set(_pc_${_d} "\${prefix}/${CMAKE_INSTALL_${_d}}")
  endif()
endforeach()
install(CODE "
  set(PROJECT_VERSION \"${PROJECT_VERSION}\")
  set(SNAP_PC_LIBDIR [=[${_pc_LIBDIR}]=])
  set(SNAP_PC_INCLUDEDIR [=[${_pc_INCLUDEDIR}]=])
  configure_file(\"${_pc_in}\" \"${_pc_out}\" @ONLY)" COMPONENT dev)
install(FILES ${_pc_out} DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

# ---- CMake package: find_package(libsnap) --------------------------------
set(_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/libsnap)
install(EXPORT libsnapTargets NAMESPACE libsnap:: DESTINATION ${_cmake_dir} COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/libsnapConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/libsnapConfig.cmake
  INSTALL_DESTINATION ${_cmake_dir})
# 0.x: the soname stays libsnap.so.0 and symbols are versioned (libsnap.map),
# so any 0.y at least as new as the one asked for will do.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/libsnapConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/libsnapConfig.cmake
  ${PROJECT_BINARY_DIR}/cmake/libsnapConfigVersion.cmake
  DESTINATION ${_cmake_dir} COMPONENT dev)

install(FILES ${PROJECT_SOURCE_DIR}/LICENSE ${PROJECT_SOURCE_DIR}/README.md
  DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)
# The recipes find snapsmp on PATH, so they work from here once installed.
install(PROGRAMS ${PROJECT_SOURCE_DIR}/integration/launch/mpirun.sh ${PROJECT_SOURCE_DIR}/integration/launch/torchrun.sh
  ${PROJECT_SOURCE_DIR}/integration/launch/slurm.sbatch
  DESTINATION ${CMAKE_INSTALL_DATADIR}/libsnap/launch COMPONENT runtime)
install(FILES ${PROJECT_SOURCE_DIR}/integration/launch/README.md
  DESTINATION ${CMAKE_INSTALL_DATADIR}/libsnap/launch COMPONENT runtime)
if(NOT SNAP_CLIENT_ONLY)
  include(${CMAKE_CURRENT_LIST_DIR}/man.cmake)
  include(${CMAKE_CURRENT_LIST_DIR}/package.cmake)
endif()
