#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Launch recipe for torchrun (PyTorch elastic): the node's snapsmp, then
# torchrun beside it, then a clean stop. Run it on every node where you would
# run torchrun; everything after -- is torchrun's own command line:
#
#   torchrun.sh --store /dev/shm/libsnap --flush-dir /lustre/ckpt -- \
#       --nnodes=4 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=head:29400 \
#       --max-restarts=3 train.py --epochs 10
#
# 1. snapsmp starts on this node with the store --store (SNAP_STORE is set
#    for the workers). The workers' first connection waits for it
#    (SNAP_TIMEOUT_MS), so nothing here waits.
# 2. torchrun spawns the workers with RANK, WORLD_SIZE and LOCAL_RANK set;
#    libsnap.torch reads those when SNAP_RANK/SNAP_WORLD_SIZE are not set,
#    so a script using libsnap.torch.Checkpointer needs no launcher code.
# 3. When a worker fails, torchrun stops the others and starts them all again
#    (--max-restarts): each restores the newest step every rank committed,
#    from this node's memory, in the time a restore takes instead of a
#    reload from disk. snapsmp keeps running across those restarts.
# 4. When torchrun ends (or this script gets SIGTERM, e.g. a preemption),
#    snapsmp gets SIGTERM: with --flush-dir it persists the newest step to
#    HDF5 first, then exits. The exit status is torchrun's.
#
# With --no-daemon the script starts no snapsmp: use it when the node's
# daemons run as an erasure-coded mesh started once for all nodes
# (`mpirun -np NODES --map-by ppr:1:node snapsmp --ec K+M --store DIR`, see
# mpirun.sh and docs/deploy.md); --store then names the mesh's store.
# Every SNAP_* variable set when this runs reaches snapsmp and the workers.
set -euo pipefail

usage() {
	cat <<'USAGE'
usage: torchrun.sh [options] -- TORCHRUN_ARG... SCRIPT [ARG...]
  --store DIR          this node's store (default /dev/shm/libsnap)
  --mem-limit SIZE     store budget (snapsmp --mem-limit; default 1/4 of RAM)
  --flush-dir DIR      persist to HDF5 there (snapsmp --flush-dir; default none)
  --job NAME           SNAP_JOB of the workers (default: the script's file name)
  --no-daemon          start no snapsmp (a mesh serves --store already)
  --log FILE           snapsmp's log (default: stderr)
  --snapsmp PATH       the daemon (default: snapsmp on PATH)
  --torchrun CMD       torchrun's command (default: torchrun on PATH; word-split)
Exit status: torchrun's (0: every worker finished).
USAGE
}

store=${SNAP_STORE:-/dev/shm/libsnap} mem_limit='' flush_dir='' job='' daemon=1 log=''
snapsmp=$(command -v snapsmp || true)
torchrun=$(command -v torchrun || true)
while [ $# -gt 0 ]; do
	case "$1" in
	--store) store=$2; shift 2 ;;
	--mem-limit) mem_limit=$2; shift 2 ;;
	--flush-dir) flush_dir=$2; shift 2 ;;
	--job) job=$2; shift 2 ;;
	--no-daemon) daemon=0; shift ;;
	--log) log=$2; shift 2 ;;
	--snapsmp) snapsmp=$2; shift 2 ;;
	--torchrun) torchrun=$2; shift 2 ;;
	-h|--help) usage; exit 0 ;;
	--) shift; break ;;
	*) echo "torchrun.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
	esac
done
[ $# -gt 0 ] || { usage >&2; exit 2; }
[ -n "$torchrun" ] || { echo "torchrun.sh: torchrun not found (--torchrun CMD)" >&2; exit 2; }
if [ "$daemon" = 1 ] && [ ! -x "$snapsmp" ]; then
	echo "torchrun.sh: snapsmp not found (--snapsmp PATH)" >&2
	exit 2
fi
# The job: --job, SNAP_JOB, else the script's name (the first argument
# after torchrun's options that names a file).
if [ -z "$job" ]; then
	job=${SNAP_JOB:-}
	for a in "$@"; do
		if [ -z "$job" ] && [ -f "$a" ]; then job=$(basename "$a" .py); fi
	done
fi
export SNAP_STORE=$store SNAP_JOB=${job:-torchrun}
export SNAP_TIMEOUT_MS=${SNAP_TIMEOUT_MS:-120000}
# This script (or, with --no-daemon, a mesh) starts the node's snapsmp with
# its settings: workers wait for it rather than start one of their own.
export SNAP_AUTOSTART=0

smp_pid=''
if [ "$daemon" = 1 ]; then
	args=(--store "$store")
	[ -n "$mem_limit" ] && args+=(--mem-limit "$mem_limit")
	[ -n "$flush_dir" ] && args+=(--flush-dir "$flush_dir")
	mkdir -p "$(dirname "$store")"
	echo "torchrun.sh: starting snapsmp ${args[*]}" >&2
	if [ -n "$log" ]; then
		"$snapsmp" "${args[@]}" >>"$log" 2>&1 &
	else
		"$snapsmp" "${args[@]}" &
	fi
	smp_pid=$!
fi

stop_smp() {
	[ -n "$smp_pid" ] || return 0
	local rc=0
	kill -TERM "$smp_pid" 2>/dev/null || true
	wait "$smp_pid" || rc=$?
	smp_pid=''
	echo "torchrun.sh: snapsmp stopped (status $rc)" >&2
}
tr_pid=''
# shellcheck disable=SC2317 # called by the trap
on_term() {
	echo "torchrun.sh: SIGTERM: stopping torchrun, then snapsmp (which persists the newest step)" >&2
	[ -n "$tr_pid" ] && kill -TERM "$tr_pid" 2>/dev/null
	[ -n "$tr_pid" ] && wait "$tr_pid"
	stop_smp
	exit 143
}
trap on_term TERM INT

echo "torchrun.sh: job $SNAP_JOB, store $SNAP_STORE: $torchrun $*" >&2
rc=0
# shellcheck disable=SC2086 # --torchrun is a command line, split on purpose
$torchrun "$@" &
tr_pid=$!
wait "$tr_pid" || rc=$?
tr_pid=''
trap - TERM INT
stop_smp
echo "torchrun.sh: done (torchrun status $rc)" >&2
exit "$rc"
