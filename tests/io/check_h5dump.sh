#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Independent reader check: h5dump (with the LZ4 plugin) dumps raw bytes of
# contiguous, LZ4-chunked and virtual (exported) datasets; they must equal
# the bytes io_roundtrip registered.
set -eu
out=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
check() { # file dataset expected
	h5dump -d "/$2" -b LE -o "$tmp/got.bin" "$1" >/dev/null
	if ! cmp -s "$tmp/got.bin" "$3"; then
		echo "FAIL: h5dump $1 /$2 differs from $3"; exit 1
	fi
	n=$((n + 1))
}
for step in 10 20 30; do
	f=$out/flush/jobA/step-$step/rank-1.h5
	check "$f" big "$out/expect/rank-1/big.bin"
	check "$f" layers.0.attn.bf16 "$out/expect/rank-1/layers.0.attn.bf16.bin"
	for mode in virtual copy; do
		e=$out/export-$step-$mode.h5
		check "$e" big "$out/expect/global/big.bin"
		check "$e" layers.0.attn.bf16 "$out/expect/global/layers.0.attn.bf16.bin"
	done
done
h5dump -A "$out/flush/jobA/step-20/rank-0.h5" | grep -q 'ATTRIBUTE "crc32c"' || { echo "FAIL: no crc32c attribute"; exit 1; }
h5dump -p -H "$out/flush/jobA/step-20/rank-0.h5" | grep -q 'FILTER_ID 32004' || { echo "FAIL: no filter 32004"; exit 1; }
echo "check_h5dump: $n datasets bit-exact"
