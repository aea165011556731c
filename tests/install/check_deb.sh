#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Builds the Debian package from the build tree (cpack -G DEB) and checks it
# without installing it on this machine:
#   1. dpkg-deb -I: name, version, architecture, and a Depends naming the
#      Debian 12 packages of every library the binaries load (libisal2,
#      liburing2, libhdf5-103-1, liblz4-1, libopenmpi3), each a real package
#      (dpkg knows it here, where they were built against);
#   2. dpkg-deb -c: every file under /usr, owned by root, the library with
#      its soname links, the HDF5 plugin in Debian's plugin directory;
#   3. dpkg -x into a temporary directory, then a program compiled against
#      the extracted tree (pkg-config with prefix redefined) runs a
#      save/restore/flush cycle through the extracted snapsmp.
# usage: check_deb.sh BUILD_DIR SOURCE_DIR CC "CFLAGS" LIBDIR PLUGIN_DIR VERSION CPACK
set -euo pipefail
build=$1 src=$2 cc=$3 cflags=$4 libdir=$5 plugindir=$6 version=$7 cpack=$8
t=$(mktemp -d /tmp/snapdeb.XXXXXX)
smp_pid=
cleanup() {
	if [ -n "$smp_pid" ] && kill -0 "$smp_pid" 2>/dev/null; then kill -KILL "$smp_pid"; fi
	rm -rf "$t"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
unset LD_LIBRARY_PATH PKG_CONFIG_PATH HDF5_PLUGIN_PATH

"$cpack" -G DEB --config "$build/CPackConfig.cmake" -B "$t/pkg" >"$t/cpack.log" 2>&1 || { cat "$t/cpack.log"; fail "cpack -G DEB"; }
debs=("$t"/pkg/*.deb)
[ ${#debs[@]} -eq 1 ] && [ -f "${debs[0]}" ] || fail "cpack made ${#debs[@]} packages: ${debs[*]}"
deb=${debs[0]}
arch=$(dpkg --print-architecture)
[ "$(basename "$deb")" = "libsnap_${version}-1_${arch}.deb" ] || fail "package file is $(basename "$deb")"

# 1. control fields
field() { dpkg-deb -f "$deb" "$1"; }
[ "$(field Package)" = libsnap ] || fail "Package: $(field Package)"
[ "$(field Version)" = "$version-1" ] || fail "Version: $(field Version)"
[ "$(field Architecture)" = "$arch" ] || fail "Architecture: $(field Architecture)"
depends=$(field Depends)
for p in libc6 libisal2 liburing2 libhdf5-103-1 liblz4-1 libopenmpi3; do
	echo "$depends" | tr ',' '\n' | sed 's/^ *//; s/ .*//' | grep -qx "$p" || fail "Depends lacks $p: $depends"
done
for p in $(echo "$depends" | tr ',' '\n' | sed 's/^ *//; s/ .*//'); do
	dpkg-query -W -f '${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' \
		|| fail "Depends names $p, which is not a package dpkg knows here"
done
field Recommends | grep -q openmpi-bin || fail "Recommends lacks openmpi-bin (mpirun for --ec)"
dpkg-deb -I "$deb" shlibs | grep -q "^libsnap ${version%%.*} libsnap" || fail "no shlibs entry for libsnap.so.${version%%.*}"

# 2. contents
dpkg-deb -c "$deb" >"$t/contents"
awk '$2 != "root/root" { print; bad = 1 } END { exit bad }' "$t/contents" >"$t/owners" || fail "files not owned by root: $(cat "$t/owners")"
awk '{ print $6 }' "$t/contents" | grep -v '^\./usr/' >"$t/outside" && fail "files outside /usr: $(cat "$t/outside")"
for f in ./usr/include/snap/snap.h ./usr/bin/snapsmp ./usr/bin/snaptool ./usr/bin/snapbench \
	./usr/libexec/libsnap/snap_ec_bench "./usr/$libdir/libsnap.so.$version" \
	"./usr/$libdir/pkgconfig/libsnap.pc" "./usr/$libdir/cmake/libsnap/libsnapConfig.cmake" \
	"./usr/$plugindir/libh5z_snapcodec.so" ./usr/share/doc/libsnap/LICENSE \
	./usr/share/man/man1/snapsmp.1.gz ./usr/share/man/man1/snaptool.1.gz ./usr/share/man/man1/snapbench.1.gz \
	./usr/share/man/man3/libsnap.3.gz; do
	awk '{ print $6 }' "$t/contents" | grep -qxF "$f" || fail "package lacks $f"
done
grep -qF "./usr/$libdir/libsnap.so.${version%%.*} -> libsnap.so.$version" "$t/contents" || fail "no soname link in the package"
# Debian's libhdf5 looks here when HDF5_PLUGIN_PATH is unset (hdf5-filter-plugin's directory).
[ "/usr/$plugindir" = "/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)/hdf5/serial/plugins" ] \
	|| fail "plugin directory /usr/$plugindir is not Debian's HDF5 plugin directory"

# 3. extract and link against it
dpkg -x "$deb" "$t/root"
R=$t/root/usr
"$R/bin/snaptool" --help | grep -q '^usage: snaptool' || fail "extracted snaptool --help"
PATH=/usr/bin:/bin "$R/bin/snaptool" bench ec --help | grep -q '^usage: snapbench ec' || fail "extracted snaptool bench ec --help"
# shellcheck disable=SC2086 # cflags are words
"$cc" $cflags -std=c11 -Wall -Wextra -Werror "$src/tests/install/consumer/main.c" -o "$t/consumer" \
	$(PKG_CONFIG_PATH=$R/$libdir/pkgconfig pkg-config --define-variable=prefix="$R" --cflags --libs libsnap) \
	|| fail "compile against the extracted package"
"$R/bin/snapsmp" --store "$t/store" --mem-limit 64M --flush-dir "$t/flush" --quiet 2>"$t/smp.err" &
smp_pid=$!
SNAP_STORE=$t/store SNAP_JOB=deb SNAP_RANK=0 SNAP_WORLD_SIZE=1 SNAP_TIMEOUT_MS=60000 LD_LIBRARY_PATH=$R/$libdir \
	"$t/consumer" "$t/expect.bin" >"$t/out" || { cat "$t/out"; fail "consumer against the extracted package"; }
grep -q "libsnap.so from $R/$libdir/libsnap.so" "$t/out" || fail "consumer loaded another libsnap.so: $(cat "$t/out")"
HDF5_PLUGIN_PATH=$R/$plugindir h5dump -d /w -b LE -o "$t/got.bin" "$t/flush/deb/step-3/rank-0.h5" >/dev/null \
	|| fail "h5dump with the packaged plugin"
cmp -s "$t/got.bin" "$t/expect.bin" || fail "h5dump of the flush differs from what was saved"
kill -TERM "$smp_pid"
rc=0; wait "$smp_pid" || rc=$?
smp_pid=
[ "$rc" -eq 0 ] || { cat "$t/smp.err"; fail "extracted snapsmp exited $rc on SIGTERM"; }
echo "check_deb: $(basename "$deb") ($(stat -c %s "$deb") bytes, $(grep -c '^-' "$t/contents") files); Depends: $depends"
echo "check_deb: $(cat "$t/out")"
