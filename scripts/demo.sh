#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The README's demo command: builds libsnap, starts a node's snapsmp, runs a
# 4-rank training job that snapshots every step, SIGKILLs one rank mid-run
# (the rest of the job dies with it, as under mpirun), restarts the job and
# shows it resumed from the newest committed step with identical state.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build/gcc -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/gcc -j"$(nproc)" --target snapsmp trainer snaptool >/dev/null

B=build/gcc
STORE=/dev/shm/libsnap-demo
LOGS=$(mktemp -d)
RANKS=4
export SNAP_STORE=$STORE SNAP_JOB=demo SNAP_WORLD_SIZE=$RANKS
# The demo starts (and at the end stops) snapsmp itself: trainers wait for
# it rather than start one of their own (docs/deploy.md, "Autostart").
export SNAP_AUTOSTART=0
rm -rf "$STORE"
trap 'kill $SMP 2>/dev/null; wait 2>/dev/null; rm -rf "$STORE" "$LOGS"' EXIT

say() { printf '\033[1m%s\033[0m\n' "$*"; }
last() { grep '^committed' "$1" 2>/dev/null | tail -1 | cut -d' ' -f2; }

say "1. start snapsmp, the node's snapshot daemon, on $STORE"
$B/smp/snapsmp --store "$STORE" --quiet &
SMP=$!
until [ -S "$STORE/smp.sock" ]; do   # serving once its socket exists
  kill -0 $SMP 2>/dev/null || { echo "snapsmp did not start"; exit 1; }
  sleep 0.05
done

say "2. run a $RANKS-rank job (64 MiB of state per rank, a snapshot every step, 50 ms of compute per step)"
pids=()
for r in $(seq 0 $((RANKS - 1))); do
  SNAP_RANK=$r $B/integration/trainer --steps 100000 --bytes 64M --compute-us 50000 --quiet \
    --log "$LOGS/rank$r.log" & pids+=($!)
done
victim=2
# Let the job run until the victim has committed 20 steps (about 2 s).
until [ "$(last "$LOGS/rank$victim.log")" ] && [ "$(last "$LOGS/rank$victim.log")" -ge 20 ]; do
  [ $SECONDS -lt 600 ] || { echo "rank $victim committed no 20 steps in 10 minutes"; exit 1; }
  sleep 0.1
done
say "3. kill -9 rank $victim (at its step $(($(last "$LOGS/rank$victim.log") + 1)), mid-run); the job dies with it"
kill -9 "${pids[$victim]}"
sleep 0.2
for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
wait "${pids[@]}" 2>/dev/null || true
for r in $(seq 0 $((RANKS - 1))); do echo "   rank $r had reported step $(last "$LOGS/rank$r.log") committed"; done

say "4. what the node store holds now (snaptool status)"
$B/tools/snaptool status | sed 's/^/   /'

say "5. restart the job: each rank restores the newest step every rank committed, checks it bit-exact, runs 3 more steps"
for r in $(seq 0 $((RANKS - 1))); do
  SNAP_RANK=$r $B/integration/trainer --resume --steps $(($(last "$LOGS/rank0.log") + 3)) --bytes 64M \
    --log "$LOGS/rank$r.log" | grep -E 'restored|nothing' | sed 's/^/   /' &
done
wait $(jobs -p | grep -v "^$SMP$") 2>/dev/null || true
say "6. done: no step was lost beyond the one in flight, and the restored state is identical"
