#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""SIGKILL fault injection with real processes: a multi-rank example trainer
and snapsmp are killed at random moments; every restart must restore a step
that is committed by every rank, bit-exact (or within the bound, with
--codec and a lossy codec), and never older than the newest step the ranks
had reported committed.

Modes:
  trainer  kill one random rank at a random moment (during copy, commit or
           between steps), then the rest of the job (as MPI would), restart.
  smp      kill snapsmp at a random moment, then the trainers, restart both.
  smp-live kill snapsmp at a random moment while the trainers keep running,
           restart it, and let the trainers reconnect by themselves (issue
           10). Each trial waits for the job to commit (the event it wants
           to interrupt), strikes at a random file-system event of the
           next step (a manifest the daemon writes, a trainer's log line;
           as many as one step showed before the first trial),
           freezes the trainers (SIGSTOP), restarts snapsmp and checks with
           `snaptool status` that the newest restorable step is not below
           the newest step every rank had logged committed (no committed
           step lost); then it resumes the trainers and requires every rank
           to commit a newer step (no stall) and no trainer to fail. A
           quarter of the trials strike a second time right after the
           restart, while the trainers reconnect and recommit. After
           the last kill the job is killed and restarted once to check the
           restore as in the other modes.

The trainer's state is a deterministic function of (rank, region, step) and
it checks a restored state itself (exit 3 on mismatch). This script checks
the step number against the logs:
  lower bound L = min over ranks of the newest step each rank logged as
                  committed since the job's last restore (a restore of p
                  starts a new timeline: older steps past p are withdrawn);
                  every rank committed L, so L or newer is restorable:
                  retention never drops it before a newer one;
  upper bound U = max over ranks of that + 1 (a commit may land just before
                  the kill, after the daemon published it but before the
                  trainer wrote its log line).

A trainer's exit is accepted only where the trial caused it: SIGKILL always;
exit 1 only in a trial that SIGKILLed snapsmp, and only with the error of a
lost daemon (SNAP_ESMP: "lost connection to snapsmp", "not connected to
snapsmp", "cannot connect to snapsmp"); any other exit 1 (a failed restore,
a refused save) is a failure. Coverage floor (trainer, smp): at least 3 in 4
of the possible restores (ranks x (trials + 1)) were verified; a build whose
restores fail cannot meet it. The seed is printed with the command that
replays the run (--seed).
--plant-restore-failure T (test-only): trial T's trainers find no daemon
(an empty store directory, SNAP_TIMEOUT_MS 100), which a trainer-mode trial
did not cause: the run must fail.
"""
import argparse
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

from events import Waiter, strike_within, wait_socket

# snapsmp gone (SNAP_ESMP), as libsnap words it (libsnap/src/conn.c).
LOST_DAEMON = ("lost connection to snapsmp", "not connected to snapsmp", "cannot connect to snapsmp")


def parse_log(path):
    """(restored step or None, newest committed step or None) of one run."""
    restored, committed = None, None
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) != 2 or not parts[1].isdigit():
                    continue  # a line torn by the kill
                if parts[0] == "restored":
                    restored = int(parts[1])
                elif parts[0] == "fresh":
                    restored = 0
                elif parts[0] == "committed":
                    committed = int(parts[1])
    except FileNotFoundError:
        pass
    return restored, committed


class Job:
    def __init__(self, args, store):
        self.args, self.store = args, store
        self.smp = None
        self.procs = []

    def start_smp(self):
        sock = os.path.join(self.store, "smp.sock")
        if os.path.exists(sock):
            os.unlink(sock)   # the dead daemon's: wait for the new one's
        self.smp = subprocess.Popen([self.args.snapsmp, "--store", self.store, "--quiet"])
        if not wait_socket(self.store, self.smp):
            raise RuntimeError("snapsmp did not start")

    def kill_smp(self):
        if self.smp and self.smp.poll() is None:
            self.smp.send_signal(signal.SIGKILL)
        if self.smp:
            self.smp.wait()

    def start_trainers(self, logdir, trial):
        self.procs = []
        planted = trial == self.args.plant_restore_failure
        for r in range(self.args.ranks):
            # One generous deadline, for hangs only: ranks wait on each other
            # and on a daemon restart (slow under ASan on 2 cores); the trials
            # kill them long before it.
            timeout = "100" if planted else "60000"
            store = os.path.join(logdir, "no-daemon") if planted else self.store
            env = dict(os.environ, SNAP_STORE=store, SNAP_JOB="kt", SNAP_RANK=str(r),
                       SNAP_WORLD_SIZE=str(self.args.ranks), SNAP_TIMEOUT_MS=timeout,
                       SNAP_COPY_THREADS="1")
            if self.args.codec:
                # The trainer's check then allows the lossy bound (trainer.c).
                env["SNAP_CODEC_PARAM"], env["SNAP_CODEC_OPTIM"] = self.args.codec.split(",")
            log = os.path.join(logdir, f"t{trial}-r{r}.log")
            err = open(os.path.join(logdir, f"t{trial}-r{r}.err"), "w")
            p = subprocess.Popen([self.args.trainer, "--steps", "100000000", "--bytes", self.args.bytes,
                                  "--resume", "--quiet", "--log", log], env=env, stdout=subprocess.DEVNULL,
                                 stderr=err)
            err.close()
            self.procs.append((p, log))

    def wait_restored(self, waiter):
        """Until every live rank has logged its restore (or its start from
        scratch): the event a kill must not race, however slow the build."""
        return waiter.until(lambda: all(p.poll() is not None or parse_log(log)[0] is not None
                                        for p, log in self.procs),
                            procs=[p for p, _ in self.procs])

    def commits(self):
        n = 0
        for _, log in self.procs:
            try:
                with open(log) as f:
                    n += sum(line.startswith("committed ") for line in f)
            except FileNotFoundError:
                pass
        return n

    def kill_trainers(self):
        for p, _ in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p, _ in self.procs:
            p.wait()


def snaptool_latest(args, store):
    """Newest restorable step of job kt in the store (0: none), read offline."""
    out = subprocess.run([args.snaptool, "status", "--store", store, "--job", "kt", "--json"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"snaptool status failed: {out.stderr}")
    jobs = json.loads(out.stdout)["jobs"]
    return jobs[0]["latest"] or 0 if jobs else 0


def live_trials(args, rng, store, logdir):
    """Daemon SIGKILLs under a live job; see the module docstring (smp-live)."""
    job = Job(args, store)
    job.start_smp()
    job.start_trainers(logdir, 0)
    logs = [log for _, log in job.procs]
    newest = lambda: [parse_log(log)[1] or 0 for log in logs]
    lost, stalls, failures, kills = 0, 0, 0, 0
    procs = [p for p, _ in job.procs]
    # Strikes land on file-system events of the job: the daemon writing a
    # rank's manifest at its commit, a trainer logging it. seen[0] counts
    # them; until() wakes on each.
    seen = [0]
    w = Waiter()

    def count(_dir, _mask, _name):
        seen[0] += 1

    def until(cond):
        return w.until(cond, args.stall_s, dirs=lambda: [logdir, *glob.glob(os.path.join(store, "kt", "rank-*"))],
                       procs=procs, on_event=count)

    def past(before):
        return lambda: all(n > b for n, b in zip(newest(), before))

    per_step = args.strike_events
    if per_step is None:
        # How many events one step shows (every rank commits once more,
        # twice; the second is counted, the first includes the start).
        for _ in range(2):
            before = newest()
            w.drain(count)
            base = seen[0]
            if not until(past(before)):
                print(f"calibration: STALL: ranks' newest committed steps stayed at {newest()}")
                job.kill_trainers()
                job.kill_smp()
                return 1
        per_step = max(1, seen[0] - base)
        print(f"one step shows {per_step} events in the store and the logs: strikes fall on one of them",
              flush=True)
    for t in range(args.trials):
        # The event to interrupt: the job is committing. Every rank must go
        # past what it had committed before the previous kill (no stall).
        before = newest()
        if not until(past(before)):
            print(f"trial {t}: STALL: ranks' newest committed steps stayed at {newest()} for {args.stall_s} s"
                  f" (snapsmp {'alive' if job.smp.poll() is None else f'exited {job.smp.returncode}'})")
            stalls += 1
            break
        dead = [r for r, (p, _) in enumerate(job.procs) if p.poll() is not None]
        if dead:
            break
        # At the j-th event of the next step or so (0: now, as the ranks
        # start copying it): a copy, a commit, or between steps. Sometimes
        # strike again right after the restart, at one of the first events
        # of the trainers reconnecting and recommitting.
        for strike in range(2 if rng.random() < 0.25 else 1):
            j = rng.randint(0, per_step if strike == 0 else max(1, per_step // 4))
            w.drain(count)
            base = seen[0]
            until(lambda: seen[0] - base >= j)   # a stalled job is struck after stall_s all the same
            job.kill_smp()
            kills += 1
            for p, _ in job.procs:
                p.send_signal(signal.SIGSTOP)
            committed = newest()
            lo = min(committed)
            job.start_smp()
            latest = snaptool_latest(args, store)
            if latest < lo:
                print(f"trial {t}: LOST: every rank had committed step {lo} (newest per rank {committed}), "
                      f"but the newest restorable step after the restart is {latest}")
                lost += 1
            for p, _ in job.procs:
                p.send_signal(signal.SIGCONT)
    for r, (p, log) in enumerate(job.procs):
        if p.poll() is not None:
            print(f"rank {r}: trainer exited {p.returncode} under a live daemon restart; see {log[:-4]}.err")
            failures += 1
    # Last: the job dies; its restart must restore a step every rank committed.
    committed = newest()
    job.kill_trainers()
    committed = newest()
    lo, hi = min(committed), max(committed) + 1
    job.start_trainers(logdir, 1)
    ok = w.until(lambda: all(parse_log(log)[0] is not None for _, log in job.procs), args.stall_s,
                 dirs=lambda: [logdir], procs=[p for p, _ in job.procs])
    w.close()
    job.kill_trainers()
    restored = {parse_log(log)[0] for _, log in job.procs}
    if not ok or len(restored) != 1 or not all(x is not None and lo <= x <= hi for x in restored):
        print(f"final restart: ranks restored {sorted(restored, key=str)}, expected one step within [{lo}, {hi}]")
        failures += 1
    job.kill_smp()
    print(f"kill_trials: {kills} daemon SIGKILLs under a live {args.ranks}-rank job, newest step "
          f"{max(committed)}: {lost} committed steps lost, {stalls} stalls, {failures} other failures")
    bad = lost + stalls + failures + (kills < args.trials)
    if kills < args.trials:
        print(f"only {kills} of {args.trials} kills happened")
    if bad == 0:
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(logdir, ignore_errors=True)
    else:
        print(f"kept {store} and {logdir} for inspection")
        print(args.replay)
    print(f"{'PASS' if bad == 0 else 'FAIL'}")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--mode", choices=["trainer", "smp", "smp-live"], required=True)
    ap.add_argument("--stall-s", type=float, default=45.0,
                    help="smp-live: a rank that commits nothing new for this long is a stall")
    ap.add_argument("--strike-events", type=int, default=None,
                    help="smp-live: strike at one of this many file-system events after a commit (default: "
                         "as many as one step showed before the first trial)")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--bytes", default="2M")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--plant-restore-failure", type=int, default=None, metavar="T",
                    help="test-only: trial T's trainers find no daemon; the run must fail")
    ap.add_argument("--codec", default=None, metavar="PARAM,OPTIM",
                    help="codecs for the trainer's regions, e.g. lossless,abs:1e-3 (SNAP_CODEC_PARAM/OPTIM)")
    args = ap.parse_args()
    args.snapsmp = os.path.join(args.build, "smp", "snapsmp")
    args.trainer = os.path.join(args.build, "integration", "trainer")
    args.snaptool = os.path.join(args.build, "tools", "snaptool")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    store = f"/dev/shm/snaptest-kill-{args.mode}-{os.getpid()}"
    logdir = f"/tmp/snaptest-kill-{args.mode}-{os.getpid()}"
    shutil.rmtree(store, ignore_errors=True)
    os.makedirs(logdir, exist_ok=True)
    print(f"kill_trials: mode={args.mode} trials={args.trials} ranks={args.ranks} seed={seed} codec={args.codec}")
    args.replay = (f"replay: {sys.argv[0]} --build {args.build} --mode {args.mode} --trials {args.trials} "
                   f"--ranks {args.ranks} --bytes {args.bytes} --seed {seed}"
                   + (f" --codec {args.codec}" if args.codec else ""))
    print(args.replay, flush=True)
    if args.plant_restore_failure is not None:
        os.makedirs(os.path.join(logdir, "no-daemon"), exist_ok=True)
    if args.mode == "smp-live":
        return live_trials(args, rng, store, logdir)

    job = Job(args, store)
    job.start_smp()
    waiter = Waiter()
    waiter.watch(logdir)
    restore_time = None    # how long the last start-to-restore took
    newest = [0] * args.ranks          # newest committed step per rank, current timeline
    failures, restores, steps_seen = 0, 0, 0
    # Trial t runs trainers that restore what trial t-1 left, then get killed.
    for t in range(args.trials + 1):
        lo, hi = min(newest), max(newest) + 1
        start = time.monotonic()
        job.start_trainers(logdir, t)
        # Never race the clock. Most trials wait until every rank logged its
        # restore, then for the next commit, and strike within the next two
        # steps as long as that step took. One in four strikes during start
        # and restore instead, within the last restore's measured time.
        if t == args.trials or restore_time is None or rng.random() >= 0.25:
            if not job.wait_restored(waiter):
                print(f"trial {t}: the ranks did not log their restore within 120 s")
                failures += 1
            restored_at = time.monotonic()
            restore_time = restored_at - start
            if t < args.trials:
                before = job.commits()
                waiter.until(lambda: job.commits() > before, procs=[p for p, _ in job.procs])
                strike_within(rng, 2 * (time.monotonic() - restored_at))
        else:
            strike_within(rng, restore_time)
        smp_killed = not (args.mode == "trainer" or t == args.trials)
        if not smp_killed:
            victim = rng.randrange(args.ranks)
            p = job.procs[victim][0]
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            time.sleep(rng.uniform(0, 0.02))
            job.kill_trainers()
        else:
            job.kill_smp()
            time.sleep(rng.uniform(0, 0.02))
            job.kill_trainers()
            job.start_smp()
        results = [parse_log(log) for _, log in job.procs]
        for r, (p, log) in enumerate(job.procs):
            if p.returncode == -signal.SIGKILL:
                continue
            with open(log[:-4] + ".err") as f:
                err = f.read().strip()
            lost_daemon = any(m in err for m in LOST_DAEMON)
            if p.returncode == 1 and smp_killed and lost_daemon:
                continue   # the daemon this trial killed: SNAP_ESMP
            # 3 = restored state differs from the step; 1 = a libsnap error
            # this trial did not cause; anything else is a crash
            why = ("" if p.returncode != 1 else " (a lost daemon's error, but this trial killed no daemon)"
                   if lost_daemon else " (not the error of a lost daemon, SNAP_ESMP)")
            print(f"trial {t} rank {r}: trainer exited {p.returncode}{why}: {err[-300:]!r}; see {log[:-4]}.err")
            failures += 1
        restored_set = {res for res, _ in results if res is not None}
        if len(restored_set) > 1:
            print(f"trial {t}: ranks restored different steps {sorted(restored_set)}")
            failures += 1
        for r, (restored, _) in enumerate(results):
            if restored is None:
                continue
            restores += 1
            if restored == 0 and t > 0 and lo > 0:
                print(f"trial {t} rank {r}: started fresh although step {lo} was committed by all ranks")
                failures += 1
            elif restored and not (lo <= restored <= hi):
                print(f"trial {t} rank {r}: restored step {restored}, expected within [{lo}, {hi}]")
                failures += 1
        if restored_set:
            # A restore starts a new timeline for the whole job: snapsmp withdraws
            # the older incarnation's steps past it on every rank.
            newest = [max(restored_set)] * args.ranks
        for r, (_, committed) in enumerate(results):
            if committed is not None:
                newest[r] = committed
                steps_seen = max(steps_seen, committed)
    job.kill_smp()
    waiter.close()
    print(f"kill_trials: {args.trials} kills, {restores} verified restores, newest step {steps_seen}, "
          f"{failures} failures (seed {seed})")
    if failures == 0:
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(logdir, ignore_errors=True)
    else:
        print(f"kept {store} and {logdir} for inspection")
    possible = args.ranks * (args.trials + 1)
    floor = -(-3 * possible // 4)
    print(f"coverage: {restores} of {possible} possible restores verified (floor {floor}: 3 in 4)")
    if restores < floor:
        print("too few restores were checked: the trials did not exercise recovery")
        failures += 1
    if failures:
        print(args.replay)
    print(f"{args.trials - min(failures, args.trials)} passed, {min(failures, args.trials)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
