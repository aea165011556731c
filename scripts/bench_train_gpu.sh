#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The GPU run of scripts/bench_train.py behind docs/benchmarks-train.md: a
# 124M and a 1.3B GPT on one GPU, and the recovery trials of the 124M, each
# phase under its own time limit (T124, T13, TREC seconds); JSON and logs
# into OUT. libsnap's modes run before DCP's and torch.save's, which take
# seconds per save at 1.3B. The three limits add up to 370 s (about 6.5
# minutes with the start): the device's budget is 8 minutes a command.
# Never run as it is now (the phases' modes were reordered after the last
# GPU run); DIR from scripts/bench_train_pack.sh.
#
# usage: bench_train_gpu.sh OUT [DIR]
#   DIR holds bench_train.py and benchtrain/, bin/snapsmp, pylib/libsnap.so (+ libsnap_cuda.so,
#   libisal.so.2) and python/libsnap (default: this script's folder); see
#   docs/benchmarks-train.md, "Commands".
set -u
out=${1:?usage: bench_train_gpu.sh OUT [DIR]}
d=$(cd "${2:-$(dirname "$0")}" && pwd)
mkdir -p "$out"
export SNAP_LIBRARY=$d/pylib/libsnap.so SNAP_CUDA_MODULE=$d/pylib/libsnap_cuda.so PYTHONPATH=$d/python
export LD_LIBRARY_PATH=$d/pylib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
b="$py $d/bench_train.py"
stop() {   # a phase cut by its time limit leaves its snapsmp (own session) behind
	[ -f "$1.smp.pid" ] && kill "$(cat "$1.smp.pid")" 2>/dev/null
	rm -rf "$1" "$1.smp.pid" "$1.smp.log" /dev/shm/bench_train_dcp /dev/shm/bench_train_torch.pt* /dev/shm/bench_recover_*
}
{
	nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
	$py -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
	df -h /dev/shm; free -g; nproc
} 2>&1 | tee "$out/env.log"
s=/dev/shm/bt124
timeout ${T124:-100} $b bench --preset 124m --steps ${STEPS124:-30} --store $s --snapsmp $d/bin/snapsmp \
	--modes base snap@1 snap@10 snap-t8@1 snap-t8@10 snap-lossless-t8@10 dcp@10 dcp@1 torch@10 base2 \
	--mem-limit 12G --mode-budget-s 12 --json "$out/bench_124m.json" 2>&1 | tee "$out/bench_124m.log"
stop $s
s=/dev/shm/bt1p3
timeout ${T13:-150} $b bench --preset 1.3b --steps ${STEPS13:-20} --probes 1 \
	--modes base snap-t8@1 snap-t8@10 snap@10 base2 dcp@10 torch@10 \
	--store $s --snapsmp $d/bin/snapsmp --mem-limit 40G --mode-budget-s 25 --json "$out/bench_1p3b.json" 2>&1 \
	| tee "$out/bench_1p3b.log"
stop $s
s=/dev/shm/btrec
timeout ${TREC:-120} $b recover --preset 124m --steps 16 --every-other 4 --copy-threads 8 --store $s \
	--snapsmp $d/bin/snapsmp --mem-limit 12G --json "$out/recover_124m.json" 2>&1 | tee "$out/recover_124m.log"
stop $s
