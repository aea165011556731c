#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Independent reader check of codec frames with h5dump: with the plugin
# (libh5z_snapcodec.so) on the path, h5dump -b of frame datasets of rank
# files and of a virtual export equals the values decoding the frames gave
# (written by io_frames); without it, h5dump fails cleanly (non-zero exit,
# not a signal, the error names the missing filter). f16 datasets are left
# to check_h5py_frames.py: h5dump 1.10 has no native half type and dumps
# nothing for them (frames or not).
# usage: check_h5dump_frames.sh OUT CODEC_PLUGIN_DIR OTHER_PLUGIN_DIR
set -eu
out=$1
with="$2:$3"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
check() { # file dataset expected
	HDF5_PLUGIN_PATH=$with h5dump -d "/$2" -b LE -o "$tmp/got.bin" "$1" >/dev/null
	if ! cmp -s "$tmp/got.bin" "$3"; then
		echo "FAIL: h5dump $1 /$2 differs from $3"; exit 1
	fi
	n=$((n + 1))
}
for step in 1 2; do
	for r in 0 1; do
		f=$out/flush/jobF/step-$step/rank-$r.h5
		for ds in fr.f32.lossless model%2Ffr.bf16.abs; do
			check "$f" "$ds" "$out/expect/rank-$r/$ds.bin"
		done
	done
	check "$out/flush/jobF/step-$step/rank-0.h5" fr.one "$out/expect/rank-0/fr.one.bin"
	check "$out/flush/jobF/step-$step/rank-1.h5" fr.many "$out/expect/rank-1/fr.many.bin"
	for ds in fr.f32.lossless model%2Ffr.bf16.abs fr.one fr.many; do
		check "$out/export-$step-copy.h5" "$ds" "$out/expect/global/$ds.bin"
	done
done
if [ -f "$out/export-1-virtual.h5" ]; then
	for ds in fr.f32.lossless model%2Ffr.bf16.abs; do
		check "$out/export-1-virtual.h5" "$ds" "$out/expect/global/$ds.bin"
	done
fi
f=$out/flush/jobF/step-1/rank-0.h5
HDF5_PLUGIN_PATH=$with h5dump -p -H -d /fr.one "$f" | grep -q 'FILTER_ID 311' || { echo "FAIL: no filter 311"; exit 1; }
rc=0
HDF5_PLUGIN_PATH=/nonexistent h5dump --enable-error-stack -d /fr.f32.lossless "$f" >"$tmp/np.txt" 2>&1 || rc=$?
if [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ] || ! grep -q 'filter' "$tmp/np.txt"; then
	echo "FAIL: h5dump without the plugin: exit $rc (want 1..127), output:"; cat "$tmp/np.txt"; exit 1
fi
echo "check_h5dump_frames: $n datasets match the decoded frames; without the plugin h5dump exits $rc: $(grep -m1 'required filter' "$tmp/np.txt" | sed 's/^ *//')"
