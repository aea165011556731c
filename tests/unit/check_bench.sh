#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Smoke run of every benchmark at its smallest size, the way the README runs
# them (snaptool bench NAME, which execs snapbench): each exits 0 and prints
# the line that compares it with its alternative. Figures are not checked
# (no timing asserts); that they are numbers is. Also:
#   - bench flush without --dir writes in a fresh directory under $TMPDIR
#     and leaves nothing behind;
#   - snapshot --device cuda reaches snap_bench_gpu (which runs, says there
#     is no device, or is absent in a build without nvcc);
#   - snaptool bench without a snapbench beside it or on PATH fails with
#     exit 1 naming where it looked.
# usage: check_bench.sh SNAPTOOL SNAPBENCH PYTHON [WEIGHTS]
#   WEIGHTS: raw f32 values (tests/data/ppocr_v4_rec_1mib.f32, which ctest
#   passes); its first 256 KiB are used. Given and unreadable: a failure;
#   not given (a run by hand): a generated ramp, said so.
# The GPU case is optional (tests/skiprule.h's rule): with no CUDA device, or
# a build without nvcc, it is counted as skipped in the summary line, and
# only those two outcomes are accepted; any other failure fails.
set -euo pipefail
snaptool=$1 snapbench=$2 python=$3 weights=${4:-}
t=$(mktemp -d "${TMPDIR:-/tmp}/snapbenchtest.XXXXXX")
trap 'rm -rf "$t"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
num='[0-9]+(\.[0-9]+)?'

# Open MPI (bench ec) refuses root without these; its allocations are
# reported as leaks by LeakSanitizer, so bench ec (only it) runs without
# leak checks, as tests/ec's MPI tests do.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
no_leaks=ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0

data=$t/values.f32
if [ -n "$weights" ]; then
	[ -r "$weights" ] || fail "the weights file $weights is not readable"
	head -c 262144 "$weights" >"$data"
	echo "input: first 256 KiB of $weights"
else
	"$python" -c 'import struct,sys; sys.stdout.buffer.write(struct.pack("<65536f", *[(i % 977) * 1e-3 - 0.4 for i in range(65536)]))' >"$data"
	echo "input: generated ramp (no weights file given)"
fi

run() { # name, expected exit, command...
	local name=$1 want=$2 rc=0
	shift 2
	"$@" >"$t/$name.out" 2>"$t/$name.err" || rc=$?
	sed "s/^/  $name| /" "$t/$name.out" "$t/$name.err"
	[ "$rc" -eq "$want" ] || fail "$name: exit $rc, want $want: $(cat "$t/$name.err")"
}
has() { # name, extended regex on stdout
	grep -Eq "$2" "$t/$1.out" || fail "$1: no line matching /$2/ in its output"
}

run codec 0 "$snaptool" bench codec --input "$data" --dtype f32 --reps 1
has codec '^codec +ratio +comp GB/s'
has codec "^snap-lossless +$num +$num +$num .*bit-exact"
has codec "^snap-lossy +$num "
has codec "^lz4 +$num "
grep -q 'FAILED CHECK' "$t/codec.out" && fail "codec: a round trip failed its check"
skips=()
if grep -q 'built without libzfp' "$t/codec.err"; then
	skips+=("the ZFP row (needs a build with libzfp)")
	echo "  optional case not run: the ZFP row (needs a build with libzfp)"
else
	has codec "^zfp +$num "
fi

run snapshot 0 "$snaptool" bench snapshot --size 64K --ranks 2 --iters 1
has snapshot "^  save -> committed +$num +$num +${num}x"
has snapshot "^  restore, new context +$num +$num +${num}x"
has snapshot "^    the same, fresh buffers +$num +$num +${num}x"
has snapshot "^  read\(2\) of the same bytes +$num +$num +${num}x +\(a new context's restore takes ${num}x of it\)"
has snapshot "^  memcpy, 1 thread +$num "
# torch.save is "unavailable" where the interpreter lacks torch; else the ratio.
has snapshot "^  torch.save to /dev/shm +(unavailable|$num .*\(commit is ${num}x faster\))"

# The scrub: its speed against a plain CRC32C loop, and a job's step time
# with and without it (1 MiB, one round, one step: figures, not a verdict).
run scrub 0 "$snaptool" bench scrub --size 1M --rounds 1 --steps 1 --passes 0
has scrub "^  plain snap_crc32c over the slot's mapping +$num GB/s +$num CPU-s/GB"
has scrub "^  scrub vs CRC32C +$num \(wall\) +$num \(CPU per byte\)"
has scrub "^  --scrub-rate 16M \(default\) +$num s +[-+]$num%"
run scrubbad 2 "$snaptool" bench scrub --rounds x
grep -qF "snapbench scrub: --rounds x: expected a whole number from 1 to 32" "$t/scrubbad.err" || fail "bench scrub --rounds x: not refused by name"

mkdir "$t/tmp"
# 4 MiB: fio's block size, the smallest size its comparison row can run at.
run flush 0 env TMPDIR="$t/tmp" SNAP_BENCH_DATA="$data" "$snaptool" bench flush --size 4M
has flush "^flush benchmark: 4194304 bytes of fp32 weights in $t/tmp/snapbench-flush-"
has flush "^  snapio codec=none \(io_uring\) +$num +\($num MiB\)"
has flush "^  snapio codec=lz4 \(io_uring\) +$num +\(ratio $num; $num MiB\)"
has flush "^  snapio frames, lossless \(io_uring\) +$num +\(ratio $num; raw GB/s; $num MiB\)"
has flush "^  snapio frames, lossy abs 1e-3 +$num +\(ratio $num; raw GB/s; $num MiB\)"
has flush "^  (fio write 4M direct io_uring qd8 +$num .*of fio\)|fio +- +fio)"
# fio installed: its row is a figure, and the LZ4 limit that needs it is
# printed; without fio the row is an optional case, counted.
if command -v fio >/dev/null 2>&1; then
	has flush "^  fio write 4M direct io_uring qd8 +$num "
	has flush "^  lz4 in memory, 1 thread +$num +\(snapio lz4 = $num% of"
else
	skips+=("the fio row of bench flush (needs fio)")
	echo "  optional case not run: the fio row of bench flush (needs fio)"
fi
left=$(find "$t/tmp" -mindepth 1)
[ -z "$left" ] || fail "flush left its scratch files behind: $left"

# One chunk (256 KiB) per node: at 4 KiB a loaded machine timed MPI at 0.000
# GB/s, and the ratio printed "-nan%".
run ec 0 env "$no_leaks" "$snaptool" bench ec --k 2 --m 1 --size 262144 --reps 1
grep -qiw 'nan' "$t/ec.out" && fail "ec: a figure printed as nan"
has ec "^  kernel_encode_gbps +$num +ec/ kernel, 1 process \(${num}% of raw\)"
has ec "^  mesh_encode_gbps +$num +end-to-end protect \(${num}% of MPI move\)"
has ec "^  rebuild_gbps +$num +rebuild of 1 lost members over MPI, verified"

# Bad values for bench ec are refused by name, exit 2, before MPI starts
# (they were read with atoi: "--k x" became 0 and met a generic message).
i=0
for bad in "--k x|--k x: expected a whole number from 1 to 254" \
	"--m 0|--m 0: expected a whole number from 1 to 254" \
	"--size 16Q|--size 16Q: expected a size from 1 byte to 16G" \
	"--chunk 100|--chunk 100: expected a multiple of 64 bytes" \
	"--reps 2x|--reps 2x: expected a whole number from 1 to 1000" \
	"--k 200 --m 100|--k 200 --m 100: a group has at most 255 nodes"; do
	i=$((i + 1))
	# shellcheck disable=SC2086 # the options are meant to split
	run "ecbad$i" 2 "$snaptool" bench ec ${bad%%|*}
	grep -qF "snapbench ec: ${bad#*|}" "$t/ecbad$i.err" || fail "bench ec ${bad%%|*}: the error does not say '${bad#*|}'"
done

# And for bench snapshot (--ranks and --iters were atoi'd too).
run snapbad1 2 "$snaptool" bench snapshot --ranks x
grep -qF "snapbench snapshot: --ranks x: expected a whole number from 1 to 64" "$t/snapbad1.err" || fail "bench snapshot --ranks x: not refused by name"
run snapbad2 2 "$snaptool" bench snapshot --dir "$t/absent"
grep -qF "snapbench snapshot: --dir $t/absent: No such file or directory" "$t/snapbad2.err" || fail "bench snapshot --dir absent: not refused by name"

# --device cuda hands over to snap_bench_gpu (4M is its smallest size).
rc=0
"$snapbench" snapshot --device cuda --sizes 4M --iters 1 >"$t/gpu.out" 2>&1 || rc=$?
sed 's/^/  gpu| /' "$t/gpu.out"
gpu_prog=$(dirname "$snapbench")/bench/snap_bench_gpu
skipped=""
if [ "$rc" -eq 0 ]; then
	grep -q '^GPU snapshot benchmark' "$t/gpu.out" || fail "snapshot --device cuda: exit 0 without the GPU benchmark's output"
elif [ ! -e "$gpu_prog" ] && [ "$rc" -eq 1 ] &&
	grep -q 'cannot run .*snap_bench_gpu is built only where nvcc was found' "$t/gpu.out"; then
	skipped="the GPU snapshot benchmark (needs a build with nvcc)"
elif [ -e "$gpu_prog" ] && [ "$rc" -eq 1 ] && [ ! -e /dev/nvidia0 ] &&
	[ "$(cat "$t/gpu.out")" = "snap_bench_gpu: no usable CUDA device" ]; then
	skipped="the GPU snapshot benchmark (needs a CUDA device)"
else
	fail "snapshot --device cuda: exit $rc; accepted only: exit 0 with its output, no snap_bench_gpu built, or its one line 'no usable CUDA device' where /dev/nvidia0 is absent"
fi
if [ -n "$skipped" ]; then
	skips+=("$skipped")
	echo "  optional case not run: $skipped"
fi

# No snapbench beside snaptool and none on PATH: a clear error, exit 1.
mkdir "$t/alone"
cp "$snaptool" "$t/alone/snaptool"
run alone 1 env PATH="$t/alone" "$t/alone/snaptool" bench codec --help
grep -qF "$t/alone/snapbench" "$t/alone.err" || fail "the error does not name where it looked for snapbench"
echo "check_bench: codec, snapshot, scrub, flush and ec ran through snaptool bench; 6 bad ec options, 2 bad snapshot options and 1 bad scrub option refused; ${#skips[@]} optional cases skipped${skips[*]:+: ${skips[*]}}"
