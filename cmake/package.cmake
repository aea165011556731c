# SPDX-License-Identifier: BSD-3-Clause
# A Debian package of everything `cmake --install` puts down:
#
#   cpack -G DEB --config build/gcc/CPackConfig.cmake -B OUTDIR
#   apt install ./OUTDIR/libsnap_<PROJECT_VERSION>-1_amd64.deb   (pulls in the libraries below by name)
#
# One package (library, headers, daemon, CLI, plugin, man pages): libsnap is
# small and its users want all of it. Depends is computed by dpkg-shlibdeps
# from the binaries' NEEDED entries, so it names exactly what they load
# (libisal2, liburing2, libhdf5-103-1, liblz4-1, libopenmpi3, libzfp1, libc6
# on Debian 12) and cannot drift from the code; tests/install/check_deb.sh
# checks those names.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME libsnap)
set(CPACK_PACKAGE_VENDOR "The libsnap authors")
set(CPACK_PACKAGE_CONTACT "The libsnap authors")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "fault-tolerant checkpointing middleware for large-model training")
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION "libsnap snapshots a training job's state (sharded parameters, optimizer
state, RNG state) every few steps into node memory held by a per-node
daemon, snapsmp, so a crashed trainer loses at most the step in flight.
The daemons erasure-code snapshots across nodes over MPI and lazily flush
them to HDF5. This package holds libsnap.so and its headers, pkg-config
file and CMake package, snapsmp, the snaptool recovery CLI, and the HDF5
plugin that reads compressed datasets.")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# shlibs for packages that link libsnap.so, and the ldconfig trigger.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
# mpirun for `snapsmp --ec`; Debian's LZ4 filter 32004 for h5py/h5dump to
# read LZ4-compressed flushes; h5dump/h5ls to look at flushed files.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "openmpi-bin, hdf5-filter-plugin")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "hdf5-tools, python3-h5py")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
