#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Installs the build tree into a temporary prefix and uses it as a user would:
#   1. the expected files are there (headers, libsnap.so with its soname and
#      links, the HDF5 plugin, the programs, libsnap.pc, the CMake package);
#   2. libsnap.so exports nothing but snap_* (and its version nodes);
#   3. the installed programs run from the prefix alone (snaptool --help;
#      snaptool bench hands over to the installed snapbench, whose ec
#      benchmark runs the installed MPI helper);
#   4. a program compiled with pkg-config, and one built by a CMake project
#      with find_package(libsnap), each save/restore/flush through the
#      installed snapsmp, load the installed libsnap.so, and h5dump decodes
#      the flushed codec frames through the installed plugin;
#   5. find_package(libsnap <newer major>) is refused by the version file;
#   6. with no daemon running, the installed libsnap.so starts the installed
#      snapsmp (bin/ of its prefix; SNAP_AUTOSTART), which serves the
#      pkg-config consumer and stops on SIGTERM.
# usage: check_install.sh BUILD_DIR SOURCE_DIR CC "CFLAGS" LIBDIR PLUGIN_DIR VERSION CMAKE
set -euo pipefail
build=$1 src=$2 cc=$3 cflags=$4 libdir=$5 plugindir=$6 version=$7 cmake=$8
t=$(mktemp -d /tmp/snapinst.XXXXXX)
smp_pid= auto_pid=
cleanup() {
	if [ -n "$smp_pid" ] && kill -0 "$smp_pid" 2>/dev/null; then kill -KILL "$smp_pid"; fi
	if [ -n "$auto_pid" ] && kill -0 "$auto_pid" 2>/dev/null; then kill -KILL "$auto_pid"; fi
	rm -rf "$t"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
P=$t/prefix
unset LD_LIBRARY_PATH PKG_CONFIG_PATH CMAKE_PREFIX_PATH HDF5_PLUGIN_PATH

"$cmake" --install "$build" --prefix "$P" >"$t/install.log" || { cat "$t/install.log"; fail "cmake --install"; }

# 1. files
for f in include/snap/snap.h include/snap/error.h include/snap/types.h include/snap/config.h include/snap/region.h \
	bin/snapsmp bin/snaptool bin/snapbench libexec/libsnap/snap_ec_bench \
	"$libdir/libsnap.so.$version" "$libdir/pkgconfig/libsnap.pc" \
	"$plugindir/libh5z_snapcodec.so" \
	"$libdir/cmake/libsnap/libsnapConfig.cmake" "$libdir/cmake/libsnap/libsnapConfigVersion.cmake" \
	share/doc/libsnap/LICENSE share/man/man1/snapsmp.1.gz share/man/man1/snaptool.1.gz share/man/man1/snapbench.1.gz share/man/man3/libsnap.3.gz \
	share/libsnap/launch/mpirun.sh share/libsnap/launch/torchrun.sh share/libsnap/launch/slurm.sbatch; do
	[ -f "$P/$f" ] || fail "not installed: $f"
done
soname=$(readelf -d "$P/$libdir/libsnap.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libsnap.so.${version%%.*} ] || fail "soname is '$soname', want libsnap.so.${version%%.*}"
[ "$(readlink "$P/$libdir/libsnap.so")" = "$soname" ] || fail "libsnap.so does not link to $soname"
[ "$(readlink "$P/$libdir/$soname")" = "libsnap.so.$version" ] || fail "$soname does not link to libsnap.so.$version"
# Nothing installed may point back into the build or source tree.
if grep -rlF -e "$build" -e "$src" "$P" >"$t/leaks" 2>/dev/null; then
	# Debug info names the source files it came from; that is not a dependency.
	while read -r f; do
		case "$f" in *.so*|*/bin/*|*/libexec/*) readelf -d "$f" | grep -E 'RPATH|RUNPATH' | grep -qF -e "$build" -e "$src" \
			&& fail "$f has a run path into the build tree: $(readelf -d "$f" | grep -E 'RPATH|RUNPATH')" ;;
		*) fail "$f names the build or source tree: $(grep -m1 -F -e "$build" -e "$src" "$f")" ;;
		esac
	done <"$t/leaks"
fi

# 2. exported symbols: snap_* functions and the LIBSNAP_* version nodes only
nm -D --defined-only "$P/$libdir/libsnap.so" >"$t/nm.txt"
bad=$(awk '!(($3 ~ /^snap_[a-z0-9_]+@@?LIBSNAP_[0-9.]+$/) || ($2 == "A" && $3 ~ /^LIBSNAP_[0-9.]+$/))' "$t/nm.txt")
[ -z "$bad" ] || fail "libsnap.so exports more than snap_*: $bad"
nsyms=$(grep -c ' snap_' "$t/nm.txt")
[ "$nsyms" -ge 10 ] || fail "libsnap.so exports only $nsyms snap_* symbols"
# ... and exactly the functions the installed headers declare (an internal
# snap_ helper leaking out, or a declared call missing from libsnap.map, fails).
grep -hE '^(SNAP_API )?[a-z][^(]*[ *]snap_[a-z0-9_]+\(' "$P"/include/snap/*.h | grep -v '^static' \
	| sed -E 's/.*[ *](snap_[a-z0-9_]+)\(.*/\1/' | sort -u >"$t/declared"
awk '$3 ~ /^snap_/ { sub(/@.*/, "", $3); print $3 }' "$t/nm.txt" | sort -u >"$t/exported"
diff -u "$t/declared" "$t/exported" >"$t/sym.diff" \
	|| fail "libsnap.so's exports differ from the functions the headers declare (-declared +exported): $(cat "$t/sym.diff")"

# 3. the installed programs, with nothing but the prefix
"$P/bin/snaptool" --help >"$t/help.txt" || fail "installed snaptool --help"
grep -q '^usage: snaptool' "$t/help.txt" || fail "snaptool --help: unexpected output"
"$P/bin/snapsmp" --help >/dev/null || fail "installed snapsmp --help"
# snaptool bench execs the snapbench beside it, not one on PATH.
PATH=/usr/bin:/bin "$P/bin/snaptool" bench codec --help >"$t/bench.txt" || fail "installed snaptool bench codec --help"
grep -q '^usage: snapbench codec' "$t/bench.txt" || fail "snaptool bench codec --help: $(cat "$t/bench.txt")"
# snapbench ec finds the MPI helper where it is installed (libexec/libsnap).
(unset SNAP_EC_BENCH_HELPER; export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
	ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0   # Open MPI's allocations, as in tests/ec
	"$P/bin/snapbench" ec --k 2 --m 1 --size 4096 --reps 1 >"$t/ec.txt" 2>&1) \
	|| fail "installed snapbench ec: $(cat "$t/ec.txt")"
grep -q 'rebuild_gbps.*verified' "$t/ec.txt" || fail "installed snapbench ec: $(cat "$t/ec.txt")"
# snapbench uses libsnap.so (snaptool itself no longer needs it): the RUNPATH finds the installed one.
got=$(ldd "$P/bin/snapbench" | awk '$1 == "'"$soname"'" { print $3 }')
[ -n "$got" ] && [ "$(realpath "$got")" = "$(realpath "$P/$libdir/$soname")" ] \
	|| fail "snapbench does not load the installed libsnap.so: $(ldd "$P/bin/snapbench" | grep libsnap)"

# 4. build two consumers and run them against the installed daemon
"$P/bin/snapsmp" --store "$t/store" --mem-limit 64M --flush-dir "$t/flush" --quiet 2>"$t/smp.err" &
smp_pid=$!
export SNAP_STORE=$t/store SNAP_RANK=0 SNAP_WORLD_SIZE=1 SNAP_TIMEOUT_MS=60000   # snap_open waits for the daemon
run_consumer() { # how binary
	SNAP_JOB=$1 "${@:2}" "$t/expect-$1.bin" >"$t/$1.out" || { cat "$t/$1.out"; fail "$1 consumer failed"; }
	grep -q "libsnap.so from $P/$libdir/libsnap.so" "$t/$1.out" || fail "$1 consumer loaded another libsnap.so: $(cat "$t/$1.out")"
	HDF5_PLUGIN_PATH=$P/$plugindir h5dump -d /w -b LE -o "$t/got-$1.bin" "$t/flush/$1/step-3/rank-0.h5" >/dev/null \
		|| fail "h5dump with the installed plugin cannot read $t/flush/$1/step-3/rank-0.h5"
	cmp -s "$t/got-$1.bin" "$t/expect-$1.bin" || fail "h5dump of the $1 flush differs from what was saved"
	echo "$1: $(cat "$t/$1.out")"
}

export PKG_CONFIG_PATH=$P/$libdir/pkgconfig
[ "$(pkg-config --modversion libsnap)" = "$version" ] || fail "pkg-config --modversion: $(pkg-config --modversion libsnap)"
# shellcheck disable=SC2086 # cflags are words
"$cc" $cflags -std=c11 -Wall -Wextra -Werror "$src/tests/install/consumer/main.c" -o "$t/consumer-pc" \
	$(pkg-config --cflags --libs libsnap) || fail "compile with pkg-config"
LD_LIBRARY_PATH=$P/$libdir run_consumer pc "$t/consumer-pc"
unset PKG_CONFIG_PATH

cmake_args=(-DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$cflags" -DCMAKE_PREFIX_PATH="$P"
	-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
"$cmake" -S "$src/tests/install/consumer" -B "$t/cb" "${cmake_args[@]}" -DWANT_VERSION="$version" >"$t/cb.log" 2>&1 \
	|| { cat "$t/cb.log"; fail "find_package(libsnap $version)"; }
"$cmake" --build "$t/cb" >>"$t/cb.log" 2>&1 || { cat "$t/cb.log"; fail "build with find_package"; }
run_consumer cmake "$t/cb/consumer"   # CMake's build RUNPATH points at the prefix

# 5. the version file refuses an incompatible request
if "$cmake" -S "$src/tests/install/consumer" -B "$t/cb" -DWANT_VERSION=$((${version%%.*} + 1)).0 >"$t/cb2.log" 2>&1; then
	fail "find_package(libsnap $((${version%%.*} + 1)).0) accepted version $version"
fi
grep -q 'not compatible\|version' "$t/cb2.log" || { cat "$t/cb2.log"; fail "the refusal does not name the version"; }

kill -TERM "$smp_pid"
rc=0; wait "$smp_pid" || rc=$?
smp_pid=
[ "$rc" -eq 0 ] || { cat "$t/smp.err"; fail "installed snapsmp exited $rc on SIGTERM"; }
# 6. autostart: no SNAPSMP, no snapsmp on PATH: the one beside the installed
# library's prefix starts (its flush directory from SNAP_FLUSH_DIR, inherited).
SNAPSMP= SNAP_AUTOSTART=1 SNAP_STORE=$t/store-auto SNAP_FLUSH_DIR=$t/flush PATH=/usr/bin:/bin \
	LD_LIBRARY_PATH=$P/$libdir run_consumer auto "$t/consumer-pc"
auto_pid=$(pgrep -f -- "--store $t/store-auto" || true)
[ "$(echo "$auto_pid" | wc -w)" -eq 1 ] || fail "autostart: want one snapsmp for $t/store-auto, found '$auto_pid'"
[ "$(realpath "/proc/$auto_pid/exe")" = "$(realpath "$P/bin/snapsmp")" ] \
	|| fail "autostart ran $(realpath "/proc/$auto_pid/exe"), not the installed $P/bin/snapsmp"
kill -TERM "$auto_pid"
timeout 120 tail --pid="$auto_pid" -f /dev/null || fail "the autostarted snapsmp did not exit on SIGTERM"
auto_pid=
grep -q "shutting down" "$t/store-auto/snapsmp.log" || fail "autostart: no log at $t/store-auto/snapsmp.log"

echo "check_install: $(find "$P" -type f | wc -l) files installed under a temporary prefix; libsnap.so exports $nsyms snap_* symbols and nothing else"
