#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""SIGKILL of snapsmp while it reserves slot files (smp/store/reserve.c).

REGISTER counts a job's slots against the budget and leaves their files to
the store's reservation thread, which grows each one in 64 MiB pieces with
posix_fallocate; an ACQUIRE that needs a file first reserves it itself or
takes it over. The promise (reserve.h): a kill at any moment leaves no slot
file that claims bytes it does not hold, and the next REGISTER queues the
unfinished files again. Each trial:

1. starts snapsmp (--slots 3) and a 2-rank job of 128 MiB per rank, which
   REGISTERs 6 slots of ~128 MiB (12 pieces) and saves 2 steps;
2. waits for a random number of pieces to be reserved (inotify: every
   fallocate that succeeds is an IN_MODIFY of the slot file) and strikes at
   a random moment within the next one (the time one piece took, measured
   in a first trial that runs to the end), then SIGKILLs the daemon and the
   ranks;
3. checks that no slot file's size exceeds the bytes allocated to it;
4. restarts snapsmp and resumes the job: every rank restores the newest
   step all ranks committed (not older than what they logged committed),
   bit-exact (the trainer checks), and saves on; once the daemon reserves
   nothing, what it counts against its budget equals what its slot files
   hold, every slot file fully allocated; SIGTERM stops it cleanly.

A trial whose slot files changed size in step 4 was struck mid-reservation;
at least one must be (the count is printed).
usage: reserve_kill.py BUILD [TRIALS [SEED]]
"""
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

from checks import Checks
from events import IN_MODIFY, Waiter, strike_within, wait_socket

BUILD = sys.argv[1]
TRIALS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
SMP = os.path.join(BUILD, "smp", "snapsmp")
TRAINER = os.path.join(BUILD, "integration", "trainer")
SNAPTOOL = os.path.join(BUILD, "tools", "snaptool")
BASE = f"/dev/shm/snaptest-reserve-{os.getpid()}"
LOGS = f"/tmp/snaptest-reserve-{os.getpid()}"
JOB = "rk"
check = Checks()


def start_smp(store):
    sock = os.path.join(store, "smp.sock")
    if os.path.exists(sock):
        os.unlink(sock)   # the killed daemon's: wait for the new one's
    p = subprocess.Popen([SMP, "--store", store, "--slots", "3", "--quiet"])
    if not wait_socket(store, p):
        raise RuntimeError(f"snapsmp did not start on {store}")
    return p


def start_job(store, trial, run, *args):
    procs = []
    for r in range(2):
        env = dict(os.environ, SNAP_STORE=store, SNAP_JOB=JOB, SNAP_RANK=str(r), SNAP_WORLD_SIZE="2",
                   SNAP_TIMEOUT_MS="30000", SNAP_LAUNCH=f"t{trial}-{run}")
        log = os.path.join(LOGS, f"t{trial}-{run}-r{r}.log")
        err = open(os.path.join(LOGS, f"t{trial}-{run}-r{r}.err"), "w")
        procs.append((subprocess.Popen([TRAINER, "--bytes", "128M", "--steps", "2", "--quiet", "--log", log, *args],
                                       env=env, stdout=subprocess.DEVNULL, stderr=err), log))
        err.close()
    return procs


def logged(log, what):
    """The last step the trainer logged as `what` (restored, committed), or None."""
    step = None
    try:
        with open(log) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[1].isdigit() and parts[0] == what:
                    step = int(parts[1])
                elif len(parts) == 2 and parts[0] == "fresh" and what == "restored":
                    step = 0
    except FileNotFoundError:
        pass
    return step


def slot_files(store):
    return sorted(f for f in glob.glob(os.path.join(store, JOB, "rank-*", "slot-*")) if not f.endswith(".man"))


def rank_dirs(store):
    return [store, os.path.join(store, JOB), *glob.glob(os.path.join(store, JOB, "rank-*"))]


def overclaimed(store):
    """Slot files whose size exceeds the bytes allocated to them."""
    out = []
    for f in slot_files(store):
        st = os.stat(f)
        if st.st_size > 512 * st.st_blocks:
            out.append(f"{f}: {st.st_size} bytes, {512 * st.st_blocks} allocated")
    return out


def status(store):
    p = subprocess.run([SNAPTOOL, "status", "--json", "--store", store], capture_output=True, text=True,
                       env=dict(os.environ, SNAP_JOB=JOB))
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {"error": p.stdout + p.stderr}


def settled(store):
    """The daemon's status once it reserves nothing in the background (the
    thread closes each slot file after publishing it: IN_CLOSE_WRITE)."""
    w = Waiter()
    try:
        return w.until(lambda: (lambda st: st if st.get("daemon_reserving", 1) == 0 or "error" in st else None)
                       (status(store)), limit=60, dirs=lambda: rank_dirs(store))
    finally:
        w.close()


def run_until_pieces(store, procs, smp, target):
    """Waits until `target` pieces were reserved (IN_MODIFY of slot files)
    or every rank has exited; returns the times of the pieces seen."""
    seen = []

    def on_event(d, mask, name):
        if mask & IN_MODIFY and name.startswith("slot-") and not name.endswith(".man"):
            seen.append(time.monotonic())

    w = Waiter()
    try:
        w.until(lambda: len(seen) >= target or all(p.poll() is not None for p, _ in procs),
                dirs=lambda: rank_dirs(store), procs=[smp, *(p for p, _ in procs)], on_event=on_event)
    finally:
        w.close()
    return seen


def kill(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
    for p in procs:
        p.wait()


def calibrate():
    """One job run to the end: how many pieces it makes and how long one takes."""
    store = os.path.join(BASE, "calibrate")
    smp = start_smp(store)
    procs = start_job(store, "cal", 0)
    seen = run_until_pieces(store, procs, smp, 1 << 30)
    rcs = [p.wait() for p, _ in procs]
    check(rcs == [0, 0], f"calibration: the job ran: exit codes {rcs}")
    st = settled(store)
    check(st and st.get("daemon_reserving") == 0, f"calibration: the daemon settled: {st}")
    smp.terminate()
    smp.wait()
    shutil.rmtree(store, ignore_errors=True)
    gaps = sorted(b - a for a, b in zip(seen, seen[1:]))
    piece = gaps[len(gaps) // 2] if gaps else 0.05
    print(f"calibration: {len(seen)} pieces reserved, one piece {piece * 1e3:.1f} ms (median)")
    check(len(seen) >= 4, f"calibration: the job's slot files were reserved in pieces ({len(seen)} seen)")
    return max(len(seen), 1), piece


def trial(t, rng, pieces, piece):
    store = os.path.join(BASE, f"t{t}")
    smp = start_smp(store)
    procs = start_job(store, t, 0)
    target = rng.randrange(0, pieces)
    run_until_pieces(store, procs, smp, target)
    strike_within(rng, piece)
    kill([smp])
    kill([p for p, _ in procs])
    bad = overclaimed(store)
    check(not bad, f"trial {t}: slot files claim bytes they do not hold after the kill: {bad}")
    after_kill = {f: os.path.getsize(f) for f in slot_files(store)}
    committed = [logged(log, "committed") for _, log in procs]
    floor = min((c or 0) for c in committed)

    smp = start_smp(store)
    procs = start_job(store, t, 1, "--resume")
    rcs = [p.wait() for p, _ in procs]
    restored = [logged(log, "restored") for _, log in procs]
    errs = "".join(open(log[:-4] + ".err").read() for _, log in procs)
    check(rcs == [0, 0], f"trial {t}: the resumed job ran (exit codes {rcs}): {errs[-800:]}")
    check(all(r is not None and r >= floor for r in restored),
          f"trial {t}: restored {restored}, every rank had committed {floor} (logged {committed})")
    st = settled(store)
    held = sum(os.path.getsize(f) for f in slot_files(store))
    check(st and st.get("daemon_mem_used") == held,
          f"trial {t}: the daemon counts {st and st.get('daemon_mem_used')} bytes, its slot files hold {held}")
    short = [f for f in slot_files(store) if os.stat(f).st_size > 512 * os.stat(f).st_blocks]
    check(not short, f"trial {t}: slot files not fully allocated after the restart: {short}")
    smp.terminate()
    check(smp.wait() == 0, f"trial {t}: snapsmp stopped cleanly")
    hit = {f: os.path.getsize(f) for f in slot_files(store)} != after_kill
    shutil.rmtree(store, ignore_errors=True)
    return hit


def main():
    shutil.rmtree(BASE, ignore_errors=True)
    os.makedirs(BASE)
    os.makedirs(LOGS, exist_ok=True)
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else random.randrange(1 << 30)
    print(f"reserve_kill: seed {seed} (replay: {sys.argv[0]} {' '.join(sys.argv[1:3])} {seed})", flush=True)
    rng = random.Random(seed)
    hits = 0
    try:
        pieces, piece = calibrate()
        for t in range(TRIALS):
            hits += trial(t, rng, pieces, piece)
    finally:
        shutil.rmtree(BASE, ignore_errors=True)
    print(f"{TRIALS} trials, {hits} struck while slot files were being reserved")
    check(hits > 0, "some trial struck while slot files were being reserved")
    return check.result(LOGS)


if __name__ == "__main__":
    sys.exit(main())
