#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Lays out DIR for scripts/bench_train_gpu.sh from a build tree, on the build
# machine: the GPU node has no HDF5/MPI/ISA-L, so snapsmp travels with every
# non-glibc library ldd lists for it (and libsnap with libisal).
#
# usage: bench_train_pack.sh BUILD DIR
#   BUILD  a tree with snapsmp, libsnap and libsnap_cuda built for the GPU
#          (-DCMAKE_CUDA_ARCHITECTURES=90 for H100/H200)
#   DIR    created: bench_train.py, benchtrain/, bench_train_gpu.sh, bin/snapsmp
#          (a wrapper setting LD_LIBRARY_PATH), lib/, pylib/, python/libsnap
set -eu
build=${1:?usage: bench_train_pack.sh BUILD DIR}
dir=${2:?usage: bench_train_pack.sh BUILD DIR}
src=$(cd "$(dirname "$0")/.." && pwd)
for f in smp/snapsmp libsnap/libsnap.so libsnap/libsnap_cuda.so; do
	[ -e "$build/$f" ] || { echo "bench_train_pack: $build/$f missing (build snapsmp, snap, snap_cuda)" >&2; exit 1; }
done
rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/lib" "$dir/pylib" "$dir/python"
cp "$src/scripts/bench_train.py" "$src/scripts/bench_train_gpu.sh" "$dir/"
cp -r "$src/scripts/benchtrain" "$dir/"
rm -rf "$dir/benchtrain/__pycache__"
cp -r "$src/integration/python/libsnap" "$dir/python/"
rm -rf "$dir/python/libsnap/__pycache__"
cp "$build/smp/snapsmp" "$dir/bin/snapsmp.bin"
# glibc's own libraries stay the node's
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so)'
libs() { ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | grep -Ev "$skip" | awk '{print $2}'; }
for l in $(libs "$build/smp/snapsmp"); do cp -L "$l" "$dir/lib/"; done
cp -P "$build"/libsnap/libsnap.so* "$dir/pylib/"
cp "$build/libsnap/libsnap_cuda.so" "$dir/pylib/"
for l in $(libs "$build/libsnap/libsnap.so"); do cp -L "$l" "$dir/pylib/"; done
cat > "$dir/bin/snapsmp" <<'W'
#!/bin/sh
d=$(cd "$(dirname "$0")/.." && pwd)
LD_LIBRARY_PATH=$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec "$d/bin/snapsmp.bin" "$@"
W
chmod +x "$dir/bin/snapsmp"
du -sh "$dir"
