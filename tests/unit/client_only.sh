#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# build.client_only: -DSNAP_CLIENT_ONLY=ON configures with MPI and HDF5
# made unfindable (liburing and LZ4 are not looked for), builds libsnap.so
# and nothing else, the library needs none of the four, and a program linked
# against it alone runs and sees the version of its header.
# usage: client_only.sh SOURCE_DIR WORK_DIR C_COMPILER
set -eu
src=$1 work=$2 cc=$3
rm -rf "$work"
mkdir -p "$work"
cmake -S "$src" -B "$work/build" -DCMAKE_C_COMPILER="$cc" -DSNAP_CLIENT_ONLY=ON -DSNAP_CUDA=OFF -DSNAP_WERROR=ON \
	-DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DCMAKE_DISABLE_FIND_PACKAGE_HDF5=ON >"$work/configure.log" 2>&1 ||
	{ cat "$work/configure.log"; echo "client-only configure failed"; exit 1; }
cmake --build "$work/build" -j2 >"$work/build.log" 2>&1 ||
	{ tail -50 "$work/build.log"; echo "client-only build failed"; exit 1; }
lib=$work/build/libsnap/libsnap.so
for t in snapsmp snaptool snapio snapec; do
	if find "$work/build" -name "$t" -o -name "lib$t.a" | grep -q .; then
		echo "client-only build made $t"; exit 1
	fi
done
if readelf -d "$lib" | grep NEEDED | grep -Ei 'mpi|hdf5|uring|lz4'; then
	echo "client-only libsnap.so needs one of the above"; exit 1
fi
cat >"$work/v.c" <<'C'
#include <stdio.h>
#include <snap/snap.h>
int main(void)
{
	struct snap_config c;
	if (snap_config_init(&c) || c.size != sizeof(c) || snap_version() != SNAP_VERSION_NUMBER)
		return 1;
	printf("client-only libsnap %s\n", snap_version_string());
	return 0;
}
C
"$cc" -std=c11 -Wall -Werror -I "$src/libsnap/include" -I "$src/common/include" -o "$work/v" "$work/v.c" \
	-L "$work/build/libsnap" -lsnap -Wl,-rpath,"$work/build/libsnap"
"$work/v"
