#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Launch recipe for Open MPI: one snapsmp per node as an erasure-coded mesh,
# the training job beside it, automatic relaunch after a failure, a clean
# stop at the end. Copy it and adapt it; docs/deploy.md explains the sizing.
#
#   mpirun.sh --nodes 6 --ranks-per-node 8 --ec 4+2 --hostfile hosts -- python3 train.py
#
# 1. The mesh: `mpirun -np NODES --map-by ppr:1:node snapsmp --ec K+M`.
#    Daemon n runs on the n-th node of the hostfile; its store is --store
#    (default /dev/shm/libsnap) on that node. A relaunch over the same
#    hostfile finds every store again and rebuilds the stores of replaced
#    nodes from parity (no more than M per group).
# 2. The trainers: `mpirun -np NODES*R --map-by ppr:R:node TRAINER...`, so
#    rank r runs on node r/R next to its daemon. libsnap reads the rank and
#    world size from Open MPI's variables and connects to the local daemon
#    at SNAP_STORE/smp.sock, retrying for SNAP_TIMEOUT_MS while the mesh
#    starts (and rebuilds), so nothing here waits for the daemons.
# 3. If the trainers fail or the mesh dies, both are launched again
#    (--restarts): the mesh recovers its stores (rebuilding those of replaced
#    nodes) and each rank restores the newest step every rank committed,
#    from its node's memory.
#    Every rank restores the same step: a restore of the newest step waits
#    for an agreement round newer than the request (docs/design/mesh-and-ec.md).
#    Ranks must land on the same nodes as before: keep the hostfile's order
#    (replace a dead node in place).
# 4. When the trainers finish, the mesh gets SIGTERM and shuts down (mpirun
#    forwards it, and SIGKILLs what is left a second later, which is safe;
#    mpirun itself then exits 1, which is not an error); the stores stay in
#    memory (tmpfs) for the next job or `snaptool`.
#
# Every SNAP_* variable set when this runs is passed to the daemons and the
# trainers (mpirun -x), so snapsmp flags can be given as their SNAP_* twins.
# --simulate runs every "node" on this machine (tests, demos): node n gets
# the store DIR/node<n>, and trainer rank r uses node r/R's.
set -euo pipefail

usage() {
	cat <<'USAGE'
usage: mpirun.sh --nodes N [options] -- TRAINER [ARG...]
  --nodes N            nodes, one snapsmp each (at least K+M)
  --ranks-per-node R   trainer ranks per node (default 1)
  --ec K+M             erasure-coding shape (default 4+2)
  --store DIR          node store on every node (default /dev/shm/libsnap)
  --mem-limit SIZE     node store budget per node (snapsmp --mem-limit; default 1/4 of RAM)
  --job NAME           SNAP_JOB of the trainers (default: the trainer's file name)
  --restarts N         launch the trainers again up to N times after a failure (default 3)
  --hostfile FILE      Open MPI hostfile (default: mpirun's, e.g. the batch allocation)
  --log-dir DIR        write the mesh's log to DIR/snapsmp.log (default: stderr)
  --snapsmp PATH       the daemon (default: snapsmp on PATH)
  --mpirun PATH        (default: mpirun on PATH)
  --simulate           all nodes on this machine: stores DIR/node0, DIR/node1, ...
Exit status: the trainers' last exit status (0: training finished).
USAGE
}

nodes='' rpn=1 ec=4+2 store=/dev/shm/libsnap mem_limit='' job='' restarts=3 hostfile='' logdir='' simulate=0
snapsmp=$(command -v snapsmp || true)
mpirun=$(command -v mpirun || true)
while [ $# -gt 0 ]; do
	case "$1" in
	--nodes) nodes=$2; shift 2 ;;
	--ranks-per-node) rpn=$2; shift 2 ;;
	--ec) ec=$2; shift 2 ;;
	--store) store=$2; shift 2 ;;
	--mem-limit) mem_limit=$2; shift 2 ;;
	--job) job=$2; shift 2 ;;
	--restarts) restarts=$2; shift 2 ;;
	--hostfile) hostfile=$2; shift 2 ;;
	--log-dir) logdir=$2; shift 2 ;;
	--snapsmp) snapsmp=$2; shift 2 ;;
	--mpirun) mpirun=$2; shift 2 ;;
	--simulate) simulate=1; shift ;;
	-h|--help) usage; exit 0 ;;
	--) shift; break ;;
	*) echo "mpirun.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
	esac
done
if [ $# -eq 0 ] || [ -z "$nodes" ]; then usage >&2; exit 2; fi
[ -x "$snapsmp" ] || { echo "mpirun.sh: snapsmp not found (--snapsmp PATH)" >&2; exit 2; }
[ -x "$mpirun" ] || { echo "mpirun.sh: mpirun not found (--mpirun PATH)" >&2; exit 2; }
k=${ec%+*} m=${ec#*+}
[ "$nodes" -ge $((k + m)) ] || { echo "mpirun.sh: --ec $ec needs at least $((k + m)) nodes, got $nodes" >&2; exit 2; }
export SNAP_JOB=${job:-${SNAP_JOB:-$(basename "$1")}}
# The first connection waits for the mesh, which rebuilds lost stores first.
export SNAP_TIMEOUT_MS=${SNAP_TIMEOUT_MS:-120000}
# The mesh's daemons serve the stores: a trainer that connects first must
# wait for them, not start a lone snapsmp that would take a node's store.
export SNAP_AUTOSTART=0

common=() map_mesh=(--map-by ppr:1:node) map_train=(--map-by "ppr:$rpn:node")
[ -n "$hostfile" ] && common+=(--hostfile "$hostfile")
if [ "$simulate" = 1 ]; then
	common+=(--oversubscribe)
	map_mesh=() map_train=()
fi
for v in $(compgen -e | grep '^SNAP_' || true); do common+=(-x "$v"); done

mesh_pid='' train_pid=''
# Each mpirun started here gets a session folder of its own under
# OMPI_MCA_orte_tmpdir_base, when the caller set one: Open MPI creates
# ompi.HOST.UID there at the first start and removes it when the last
# session ends, and a relaunch starting while the old mpirun ends can lose
# that race (orte_init: "mkdir ... File exists"; seen in launch.mpirun).
session_env() { # run in $(...): BASHPID differs per launch
	if [ -n "${OMPI_MCA_orte_tmpdir_base:-}" ]; then
		echo "OMPI_MCA_orte_tmpdir_base=${OMPI_MCA_orte_tmpdir_base%/}/launch.$BASHPID"
	else
		echo "MPIRUN_SH_LAUNCH=$BASHPID"
	fi
}
start_mesh() {
	local st=$store args=(--ec "$ec" --slots 3)
	[ -n "$mem_limit" ] && args+=(--mem-limit "$mem_limit")
	if [ "$simulate" = 1 ]; then
		mkdir -p "$store"
		st=$store/node%n
	fi
	echo "mpirun.sh: starting the mesh: $nodes x snapsmp --ec $ec --store $st" >&2
	local sess
	sess=$(session_env)
	if [ -n "$logdir" ]; then
		mkdir -p "$logdir"
		env "$sess" "$mpirun" "${common[@]}" -np "$nodes" "${map_mesh[@]}" --bind-to none \
			"$snapsmp" "${args[@]}" --store "$st" >>"$logdir/snapsmp.log" 2>&1 &
	else
		env "$sess" "$mpirun" "${common[@]}" -np "$nodes" "${map_mesh[@]}" --bind-to none \
			"$snapsmp" "${args[@]}" --store "$st" &
	fi
	mesh_pid=$!
}

start_trainers() {
	local sess
	sess=$(session_env)
	if [ "$simulate" = 1 ]; then
		# shellcheck disable=SC2016 # expanded by the rank's own shell
		env "$sess" "$mpirun" "${common[@]}" -np $((nodes * rpn)) \
			bash -c 'export SNAP_STORE="$1/node$((OMPI_COMM_WORLD_RANK / $2))"; shift 2; exec "$@"' \
			trainer "$store" "$rpn" "$@" &
	else
		env "$sess" SNAP_STORE="$store" "$mpirun" "${common[@]}" -x SNAP_STORE -np $((nodes * rpn)) \
			"${map_train[@]}" "$@" &
	fi
	train_pid=$!
}

stop() { # pid: SIGTERM (mpirun forwards it to every rank), then its status
	local rc=0
	kill -TERM "$1" 2>/dev/null || true
	wait "$1" || rc=$?
	return $rc
}
# shellcheck disable=SC2317 # called by the trap
cleanup() {
	local p
	for p in $train_pid $mesh_pid; do kill -TERM "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

rc=1
for ((attempt = 0; attempt <= restarts; attempt++)); do
	start_mesh
	echo "mpirun.sh: launching $((nodes * rpn)) trainer ranks (job $SNAP_JOB, attempt $((attempt + 1)) of $((restarts + 1)))" >&2
	start_trainers "$@"
	rc=0
	wait -n "$mesh_pid" "$train_pid" || rc=$?
	if kill -0 "$mesh_pid" 2>/dev/null; then
		wait "$train_pid" || rc=$?   # it is the one that exited: collect its status
		train_pid=''
		[ "$rc" -eq 0 ] && break
		echo "mpirun.sh: the trainers exited with status $rc" >&2
	else
		echo "mpirun.sh: the mesh exited (status $rc): a node or a daemon died" >&2
		rc=1
	fi
	# Relaunch both: whichever side failed first, the other may be failing
	# too (trainers lose their daemon; a daemon's death takes the whole mesh
	# down, as Debian's Open MPI has no fault tolerance), and a fresh mesh
	# rebuilds a lost store before that node serves. Snapshots stay in the stores.
	if [ -n "$train_pid" ]; then stop "$train_pid" || true; fi
	stop "$mesh_pid" || true
	train_pid='' mesh_pid=''
done
if [ -n "$mesh_pid" ]; then
	mrc=0
	stop "$mesh_pid" || mrc=$?
	mesh_pid=''
	echo "mpirun.sh: the mesh is stopped (mpirun status $mrc)" >&2
fi
trap - EXIT
echo "mpirun.sh: done (trainer status $rc)" >&2
exit "$rc"
