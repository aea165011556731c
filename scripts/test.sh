#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The README's test command. Installs what it needs (apt-get), then:
#   1. the README's Install configuration (Release: gcc -O3) with -Werror,
#      and the install tests on it (configure, build, install to a prefix,
#      the pkg-config and find_package consumers), so that what users build
#      first builds without a warning;
#   2. a gcc build with -Werror (and the CUDA kernels when nvcc is present,
#      compiled and linked only), and every ctest test;
#   3. a clang build with AddressSanitizer + UndefinedBehaviorSanitizer, and
#      every ctest test again (GPU tests skip themselves without a GPU).
# SNAP_WERROR is off by default (for users); every build here turns it on.
# Tests run $(nproc) at a time: they wait for events, never for fixed
# durations, so they must pass beside each other (and beside a build).
# Usage: scripts/test.sh [ctest args...]   e.g. scripts/test.sh -R fault
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

# Debian's Open MPI refuses root without these; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
jobs=$(nproc)

echo "== gcc, -Werror, Release (the README's Install lines) =="
cmake -S . -B build/release -DCMAKE_C_COMPILER=gcc -DCMAKE_BUILD_TYPE=Release -DSNAP_WERROR=ON >/dev/null
cmake --build build/release -j"$jobs"
(cd build/release && ctest --output-on-failure -L install)

echo "== gcc, -Werror, RelWithDebInfo =="
cmake -S . -B build/gcc -DCMAKE_C_COMPILER=gcc -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSNAP_WERROR=ON >/dev/null
cmake --build build/gcc -j"$jobs"
# As root every optional case (mounts, O_DIRECT, the real programs of
# preload.transparency) can run here, so none may be skipped. The sanitized
# build below keeps them optional: some programs cannot run under ASan.
if [ "$(id -u)" -eq 0 ]; then export SNAP_TEST_ALL=1; fi
(cd build/gcc && ctest --output-on-failure -j"$jobs" "$@")
unset SNAP_TEST_ALL

echo "== clang, -Werror, ASan + UBSan =="
cmake -S . -B build/asan -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug -DSNAP_SANITIZE=ON -DSNAP_CUDA=OFF \
	-DSNAP_WERROR=ON >/dev/null
cmake --build build/asan -j"$jobs"
(cd build/asan && ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
   ctest --output-on-failure -j"$jobs" "$@")
