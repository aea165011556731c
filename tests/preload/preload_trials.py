#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Captured files (LD_PRELOAD=libsnap_preload.so) with real processes: a real
snapsmp, the preload in unmodified programs, SIGKILL at random moments.

  --mode calls     pl_calls exercises every call on a captured directory under
                   the preload; snapsmp's SIGTERM flushes; without the preload
                   the real directory then holds exactly the final files.
  --mode kill      pl_writer checkpoints with write()/pwrite(), rename, unlink;
                   each trial SIGKILLs it at a random moment within a step it
                   measured (mid write, mid pwrite, at the commit, mid rename,
                   mid unlink); the relaunch must see only complete files, the
                   newest reported commit at least, and resume. Some trials
                   SIGKILL snapsmp instead (the writer must go on: files whose
                   commit is lost go to the file system). At the end snapsmp's
                   SIGTERM flushes and the files on disk, read without the
                   preload, are byte-identical to the checkpoints.
  --mode torch     an unmodified PyTorch script (torch.save to a temporary,
                   os.replace, os.listdir, torch.load) SIGKILLed at random
                   moments, half of them while torch.save or the rename runs;
                   each relaunch resumes from the newest complete checkpoint
                   and the losses equal an uninterrupted run's bit for bit;
                   after the flush the checkpoints on disk are the store's
                   bytes and torch.load reads them without the preload.
  --mode ends      SIGTERM to a preloaded writer: snapsmp (flushing only on
                   request) flushes its files; an MPI job's MPI_Finalize returns
                   only once its files are on disk.
  --mode fallback  no snapsmp: one warning, the files go to the file system;
                   a full store (SNAP_MEM_LIMIT): one warning, files that do not
                   fit go to the file system; with flushing on, flushed files
                   are evicted instead and stay readable.
  --mode memory    the preloaded pl_writer and snapsmp over 450 checkpoints:
                   neither one's anonymous RSS, descriptors nor threads grow
                   (the writer stops itself between checkpoints to be read).
"""
import argparse
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
from events import Waiter, strike_within, wait_socket  # noqa: E402
from checks import Checks  # noqa: E402
from procstat import compare, sample  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--build", required=True)
ap.add_argument("--mode", required=True, choices=["calls", "kill", "fallback", "torch", "ends", "memory"])
ap.add_argument("--mpiexec", default="mpiexec")
ap.add_argument("--steps", type=int, default=0, help="torch: training steps (default: enough that no trial "
                "reaches the end, (trials + 2) x 2 x every)")
ap.add_argument("--every", type=int, default=4, help="torch: steps between checkpoints")
ap.add_argument("--trials", type=int, default=40)
ap.add_argument("--seed", type=int, default=13)
ap.add_argument("--bytes", type=int, default=4 << 20)
ap.add_argument("--asan-runtime", default="", help="preloaded before the preload in sanitizer builds")
args = ap.parse_args()

BUILD = args.build
SMP = os.path.join(BUILD, "smp", "snapsmp")
PRELOAD = os.path.join(BUILD, "integration", "libsnap_preload.so")
WRITER = os.path.join(BUILD, "tests", "preload", "pl_writer")
CALLS = os.path.join(BUILD, "tests", "preload", "pl_calls")
TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_train.py")
BASE = f"/dev/shm/snaptest-preload-{os.getpid()}"
DISK = f"/tmp/snaptest-preload-{os.getpid()}"
check = Checks()   # counts the checks, prints each failure


def env(store, capture, preload=True, python=False, **extra):
    """python: the program is not built with the sanitizers, so a sanitizer
    build of the preload needs their runtime loaded first (the test programs
    carry their own)."""
    e = dict(os.environ, SNAP_STORE=store, SNAP_CAPTURE=capture, SNAP_JOB="pj", SNAP_TIMEOUT_MS="5000",
             ASAN_OPTIONS="detect_leaks=0")
    e.pop("LD_PRELOAD", None)
    # For the uninstrumented programs a test program execs (pl_calls' shell).
    e["PL_ASAN_RUNTIME"] = args.asan_runtime
    if preload:
        e["LD_PRELOAD"] = ":".join(p for p in (args.asan_runtime if python else "", os.path.abspath(PRELOAD)) if p)
    e.update(extra)
    return e


def start_smp(store, *extra, env=None):
    os.makedirs(os.path.dirname(store), exist_ok=True)   # snapsmp makes the store, not its parents
    p = subprocess.Popen([SMP, "--store", store, *extra], stderr=subprocess.PIPE, text=True, env=env)
    if not wait_socket(store, p):
        raise RuntimeError(f"snapsmp did not start: {p.stderr.read()}")
    return p


def stop_smp(p, sig=signal.SIGTERM):
    """SIGTERM: snapsmp flushes every captured file, then exits 0."""
    p.send_signal(sig)
    try:
        _, err = p.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    return p.returncode, err


def fresh(name):
    store, disk = f"{BASE}/{name}", f"{DISK}/{name}"
    shutil.rmtree(store, ignore_errors=True)
    shutil.rmtree(disk, ignore_errors=True)
    os.makedirs(disk)
    return store, disk


def writer_check(store, disk, preload=True):
    r = subprocess.run([WRITER, "check", disk, str(args.bytes)], env=env(store, disk, preload),
                       capture_output=True, text=True, timeout=300)
    try:
        return r.returncode, json.loads(r.stdout.strip().splitlines()[-1]), r.stderr
    except (ValueError, IndexError):
        return r.returncode, {"newest": -1, "bad": [r.stdout + r.stderr], "names": []}, r.stderr


class Lines:
    """A child's stdout read line by line; waiting blocks in select() on the pipe and the child's pidfd."""

    def __init__(self, p):
        self.p, self.buf, self.lines = p, b"", []
        os.set_blocking(p.stdout.fileno(), False)
        self.pidfd = os.pidfd_open(p.pid)

    def pump(self, timeout):
        r, _, _ = select.select([self.p.stdout.fileno(), self.pidfd], [], [], timeout)
        if self.p.stdout.fileno() in r:
            try:
                chunk = os.read(self.p.stdout.fileno(), 65536)
            except BlockingIOError:
                chunk = b""
            self.buf += chunk
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                self.lines.append((time.monotonic(), line.decode()))
            return bool(chunk)
        return False

    def wait_for(self, pred, limit=300, start=0):
        """The first (time, line) from index `start` on that satisfies pred, or None if the child ends first."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            for t, line in self.lines[start:]:
                if pred(line):
                    return t, line
            if self.p.poll() is not None and not self.pump(0):
                return None
            self.pump(max(0.0, deadline - time.monotonic()))
        return None

    def close(self):
        os.close(self.pidfd)


def committed(lines):
    steps = [int(l.split()[1]) for _, l in lines if l.startswith("committed ")]
    return max(steps, default=-1)


# ---- calls -------------------------------------------------------------------

def test_calls():
    store, disk = fresh("calls")
    with open(os.path.join(disk, "pre.txt"), "w") as f:
        f.write("pre")
    smp = start_smp(store, "--flush-files", "0")   # nothing on disk before the SIGTERM
    r = subprocess.run([CALLS, "use", disk], env=env(store, disk), capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, f"pl_calls use under the preload: rc {r.returncode}\n{r.stdout}{r.stderr}")
    print(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "(no output)", flush=True)
    on_disk = sorted(n for n in os.listdir(disk) if not n.startswith("."))
    # The two files open across a fork (9: d.bin, later renamed c.bin) and a
    # system() (17: x.bin) are the documented fallback: a child shares their
    # descriptor, so they become real files at once, with one warning.
    check(on_disk == ["c.bin", "pre.txt", "x.bin"],
          f"with --flush-files 0 only the files shared with a child reach the disk before the flush: {on_disk}")
    check("a child process shares its descriptor" in r.stderr,
          f"the fallback of a file shared with a child is said once: {r.stderr[-2000:]}")
    rc, err = stop_smp(smp)
    check(rc == 0, f"snapsmp exits 0 after SIGTERM: {rc} {err}")
    r = subprocess.run([CALLS, "disk", disk], env=env(store, disk, preload=False), capture_output=True, text=True,
                       timeout=300)
    check(r.returncode == 0, f"pl_calls disk without the preload after the flush: rc {r.returncode}\n{r.stdout}{r.stderr}")
    leftovers = [n for n in os.listdir(disk) if n.startswith(".")]
    check(not leftovers, f"no temporary files left on disk: {leftovers}")
    # A restarted snapsmp finds the store consistent with the disk: nothing to flush again.
    smp = start_smp(store)
    rc, err = stop_smp(smp)
    check(rc == 0 and "flushed captured file" not in err, f"a restart re-flushes nothing already on disk: {err}")


# ---- kill trials ---------------------------------------------------------------

def test_kill(rng):
    store, disk = fresh("kill")
    smp = start_smp(store, "--quiet")
    newest_reported, smp_kills = -1, 0
    for t in range(args.trials):
        kill_smp = t % 8 == 7
        w = subprocess.Popen([WRITER, "run", disk, str(args.bytes)], env=env(store, disk), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        lines = Lines(w)
        got = lines.wait_for(lambda l: l.startswith("resumed "))
        if not check(got is not None, f"trial {t}: writer resumed ({w.stderr.read().decode() if w.poll() is not None else 'no line'})"):
            w.kill()
            w.wait()
            lines.close()
            break
        resumed = int(got[1].split()[1])
        check(resumed >= newest_reported,
              f"trial {t}: resumed from step {resumed}, but step {newest_reported} had been reported committed")
        # Measure one step, then strike at a random moment within the next.
        first = lines.wait_for(lambda l: l.startswith("committed "))
        second = lines.wait_for(lambda l: l.startswith("committed ") and l != first[1]) if first else None
        if not check(first and second, f"trial {t}: writer commits ({w.stderr.read().decode() if w.poll() is not None else ''})"):
            w.kill()
            w.wait()
            lines.close()
            break
        strike_within(rng, second[0] - first[0])
        if kill_smp:
            smp.kill()
            smp.wait()
            smp_kills += 1
            # The writer carries on without it (files go to the file system), then with a new one.
            is_commit = lambda l: l.startswith("committed ")  # noqa: E731
            check(lines.wait_for(is_commit, start=len(lines.lines)) is not None,
                  f"trial {t}: the writer commits on without snapsmp")
            smp = start_smp(store, "--quiet")
            check(lines.wait_for(is_commit, start=len(lines.lines)) is not None,
                  f"trial {t}: the writer commits on with a new snapsmp")
        w.kill()
        w.wait()
        lines.pump(0)
        newest_reported = max(newest_reported, committed(lines.lines))
        err = w.stderr.read().decode()
        check(w.returncode == -signal.SIGKILL, f"trial {t}: writer died by our SIGKILL, not on its own: {w.returncode} {err}")
        check(kill_smp or "libsnap preload" not in err, f"trial {t}: with snapsmp up, no file fell back: {err}")
        check(smp.poll() is None, f"trial {t}: snapsmp is alive")
        lines.close()
        rc, res, cerr = writer_check(store, disk)
        check(rc == 0 and not res["bad"], f"trial {t}: every visible file is complete: {res} {cerr}")
        check(res["newest"] >= newest_reported,
              f"trial {t}: newest visible checkpoint {res['newest']} >= newest reported committed {newest_reported}")
    # Flush everything, then read the disk without the preload.
    rc, res_pre, _ = writer_check(store, disk)
    rc, err = stop_smp(smp)
    check(rc == 0, f"snapsmp exits 0 after SIGTERM (flushing): {rc} {err}")
    rc, res, cerr = writer_check(store, disk, preload=False)
    check(rc == 0 and not res["bad"], f"on disk without the preload: every file complete: {res} {cerr}")
    check(res["newest"] == res_pre["newest"] and sorted(res["names"]) == sorted(res_pre["names"]),
          f"on disk the same checkpoints as in the store: disk {res} store {res_pre}")
    print(f"kill: {args.trials} trials ({smp_kills} of snapsmp), newest step {res['newest']}", flush=True)


# ---- memory ---------------------------------------------------------------------

def test_memory():
    """The preloaded writer and snapsmp over 450 checkpoints (a file
    written, renamed, and the one two steps older unlinked, each in the
    store): neither one's anonymous RSS, descriptors nor threads may grow
    between its commits 100 and 550 (the writer's own lines: events), nor
    the daemon's count against its budget. snapsmp flushes nothing before
    its SIGTERM (--flush-files 0), so no file it writes is open then."""
    store, disk = fresh("memory")
    # ASan's quarantine keeps freed blocks resident: off for both processes.
    no_quarantine = "quarantine_size_mb=0:thread_local_quarantine_size_kb=0"
    smp = start_smp(store, "--quiet", "--flush-files", "0", env=dict(os.environ, ASAN_OPTIONS=":".join(
        filter(None, [os.environ.get("ASAN_OPTIONS"), no_quarantine]))))
    w = subprocess.Popen([WRITER, "run", disk, str(args.bytes), "600"], env=env(store, disk, PL_PAUSE_AT="100,550",
                         ASAN_OPTIONS="detect_leaks=0:" + no_quarantine), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    lines = Lines(w)
    at = []
    for step in (100, 550):
        # The writer stops itself between checkpoints (PL_PAUSE_AT): its
        # files closed, it is read from /proc, then it goes on.
        got = lines.wait_for(lambda l: l == f"paused {step}")
        if not check(got is not None and w.poll() is None, f"memory: the writer paused after step {step}"):
            break
        _, st = os.waitpid(w.pid, os.WUNTRACED)   # blocks until the stop took effect
        if not check(os.WIFSTOPPED(st), f"memory: the writer stopped after step {step}: status {st}"):
            break
        # snapsmp too: the writer's every request (the unlink last) was
        # answered, and the daemon finishes a request before it reads the
        # next; it flushes nothing before its SIGTERM (--flush-files 0).
        at.append((sample(w.pid), sample(smp.pid)))
        w.send_signal(signal.SIGCONT)
    w.wait(timeout=300)
    lines.close()
    check(w.returncode == 0, f"memory: the writer finished: {w.returncode} {w.stderr.read().decode()[-500:]}")
    if len(at) == 2:
        # Both grow 0 bytes (gcc and ASan builds); a 256-byte leak planted
        # in each commit, the writer's and the daemon's, grew each 120 KiB
        # and must fail.
        for i, (who, allow) in enumerate((("writer", 32 << 10), ("snapsmp", 32 << 10))):
            line, problems = compare(who, at[0][i], at[1][i], 450, allow, "checkpoints")
            print(f"memory: {line}", flush=True)
            check(not problems, f"memory: {'; '.join(problems)}")
    rc, err = stop_smp(smp)
    check(rc == 0, f"memory: snapsmp exits 0 after SIGTERM (flushing): {rc} {err}")
    rc, res, cerr = writer_check(store, disk, preload=False)
    check(rc == 0 and not res["bad"] and res["newest"] == 599, f"memory: on disk, complete up to step 599: {res} {cerr}")


# ---- fallback -------------------------------------------------------------------

def warnings(stderr, what):
    return [l for l in stderr.splitlines() if "libsnap preload" in l and what in l]


def test_fallback():
    # 1. No snapsmp at all.
    store, disk = fresh("absent")
    # SNAP_AUTOSTART=0: the preload would otherwise start a snapsmp of its own.
    r = subprocess.run([WRITER, "run", disk, str(args.bytes), "5"], env=env(store, disk, SNAP_AUTOSTART="0"),
                       capture_output=True,
                       text=True, timeout=300)
    check(r.returncode == 0, f"absent: writer succeeds without snapsmp: {r.returncode} {r.stderr}")
    check(len(warnings(r.stderr, "not running")) == 1, f"absent: exactly one warning: {r.stderr!r}")
    rc, res, _ = writer_check(store, disk, preload=False)
    check(rc == 0 and res["newest"] == 4, f"absent: checkpoints on disk, readable without the preload: {res}")

    # 2. A full store, nothing flushed (so nothing evictable): files that do not fit go to the disk.
    store, disk = fresh("full")
    mb = args.bytes >> 20
    smp = start_smp(store, "--quiet", "--flush-files", "0", "--mem-limit", f"{2 * mb + mb // 2 + 1}M")
    r = subprocess.run([WRITER, "run", disk, str(args.bytes), "6"], env=env(store, disk), capture_output=True,
                       text=True, timeout=300)
    check(r.returncode == 0, f"full: writer succeeds: {r.returncode} {r.stderr}")
    check(len(warnings(r.stderr, "full")) == 1, f"full: exactly one warning: {r.stderr!r}")
    rc, res, _ = writer_check(store, disk)
    check(rc == 0 and res["newest"] == 5 and not res["bad"], f"full: every checkpoint complete under the preload: {res}")
    real = sorted(n for n in os.listdir(disk) if not n.startswith("."))
    check(len(real) >= 1, f"full: some files went to the file system: {real}")
    rc, err = stop_smp(smp)
    rc2, res2, _ = writer_check(store, disk, preload=False)
    check(rc == 0 and rc2 == 0 and res2["newest"] == 5, f"full: after the flush all on disk: {res2} {err}")

    # 3. A full store with flushing on: flushed files are evicted, nothing falls back.
    store, disk = fresh("evict")
    smp = start_smp(store, "--flush-files", "1", "--mem-limit", f"{2 * mb + mb // 2 + 1}M")
    r = subprocess.run([WRITER, "run", disk, str(args.bytes), "6"], env=env(store, disk), capture_output=True,
                       text=True, timeout=300)
    check(r.returncode == 0, f"evict: writer succeeds: {r.returncode} {r.stderr}")
    rc, res, _ = writer_check(store, disk)
    check(rc == 0 and res["newest"] == 5 and not res["bad"], f"evict: every checkpoint complete under the preload: {res}")
    rc, err = stop_smp(smp)
    check("evicting captured file" in err or warnings(r.stderr, "full"),
          f"evict: the store made room by evicting flushed files (or fell back): {err[-2000:]}")
    rc2, res2, _ = writer_check(store, disk, preload=False)
    check(rc == 0 and rc2 == 0 and res2["newest"] == 5,
          f"evict: after the flush all on disk: {res2}; snapsmp exit {rc}, check exit {rc2}: {err[-3000:]}")


# ---- torch ---------------------------------------------------------------------

def sha(path):
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def losses_of(lines):
    return {int(l.split()[1]): l.split()[2] for _, l in lines if l.startswith("loss ")}


def test_torch(rng):
    every = args.every
    steps = args.steps or (args.trials + 2) * 2 * every   # each trial advances about two checkpoints
    ref_dir = f"{DISK}/torch-ref"
    os.makedirs(ref_dir)
    r = subprocess.run([sys.executable, TRAIN, ref_dir, str(steps), str(every)], env=env("", "", preload=False),
                       capture_output=True, text=True, timeout=600)
    check(r.returncode == 0 and r.stdout.strip().endswith("done"), f"uninterrupted run: {r.returncode} {r.stderr[-2000:]}")
    ref = {int(l.split()[1]): l.split()[2] for l in r.stdout.splitlines() if l.startswith("loss ")}
    check(len(ref) == steps, f"uninterrupted run logged {len(ref)} of {steps} losses")

    store, disk = fresh("torch")
    smp = start_smp(store, "--quiet")
    seen, newest_saved, save_s, step_s, mid_save = {}, 0, None, None, 0
    t = 0
    while True:
        last = t >= args.trials
        p = subprocess.Popen([sys.executable, TRAIN, disk, str(steps), str(every)], env=env(store, disk, python=True),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        lines = Lines(p)
        got = lines.wait_for(lambda l: l.startswith("resumed "), limit=600)
        if not check(got is not None, f"torch trial {t}: the script resumed: {p.stderr.read().decode()[-3000:] if p.poll() is not None else ''}"):
            p.kill()
            p.wait()
            lines.close()
            break
        resumed = int(got[1].split()[1])
        check(resumed >= newest_saved, f"torch trial {t}: resumed from {resumed}, but {newest_saved} had been saved")
        if last:
            end = lines.wait_for(lambda l: l == "done", limit=600)
            check(end is not None, f"torch: the last run completes: {p.stderr.read().decode()[-3000:]}")
            p.wait()
        else:
            # Measure a save and a step in this run, then strike inside the next save or step.
            s0 = lines.wait_for(lambda l: l.startswith("saving "), limit=600)
            s1 = lines.wait_for(lambda l: l.startswith("saved "), limit=600)
            if s0 and s1:
                save_s = s1[0] - s0[0]
                n = len(lines.lines)
                l0 = lines.wait_for(lambda l: l.startswith("loss "), start=n)
                l1 = lines.wait_for(lambda l: l.startswith("loss "), start=len(lines.lines))
                step_s = l1[0] - l0[0] if l0 and l1 else 0.05
                if rng.random() < 0.5:
                    hit = lines.wait_for(lambda l: l.startswith("saving "), start=len(lines.lines))
                    mid_save += hit is not None
                    strike_within(rng, save_s)
                else:
                    strike_within(rng, step_s)
            check(p.poll() is None, f"torch trial {t}: the script was still training when killed "
                                    f"(raise --steps): {p.stderr.read().decode()[-2000:] if p.poll() is not None else ''}")
            p.kill()
            p.wait()
        lines.pump(0)
        for k, v in losses_of(lines.lines).items():
            if k in seen:
                check(seen[k] == v, f"torch trial {t}: step {k} recomputed after a resume gives {v}, first {seen[k]}")
            seen[k] = v
        newest_saved = max([newest_saved] + [int(l.split()[1]) for _, l in lines.lines if l.startswith("saved ")])
        lines.close()
        if last:
            break
        t += 1
    check(seen == ref, f"torch: the interrupted runs' losses equal the uninterrupted run's bit for bit "
                       f"(differ at {sorted(k for k in ref if seen.get(k) != ref[k])[:10]})")
    # The store's checkpoints, then the disk's after snapsmp flushed them, read without the preload.
    probe = ("import hashlib,os,sys\n"
             "d=sys.argv[1]\n"
             "for n in sorted(os.listdir(d)):\n"
             "    print(n, hashlib.sha256(open(os.path.join(d,n),'rb').read()).hexdigest())\n")
    r = subprocess.run([sys.executable, "-c", probe, disk], env=env(store, disk, python=True), capture_output=True,
                       text=True, timeout=300)
    in_store = dict(l.split() for l in r.stdout.splitlines())
    # The preload was loaded and captured: the newest checkpoint has its
    # manifest in the store's namespace (a listing alone would match the
    # disk's if the preload never loaded).
    manifest = f"{store}/pj/files/ns{os.path.abspath(disk)}/ckpt-{steps}.pt"
    check(os.path.isfile(manifest) and f"ckpt-{steps}.pt" in in_store,
          f"torch: the checkpoints went to the node store (manifest {manifest}: {os.path.isfile(manifest)})")
    rc, err = stop_smp(smp)
    check(rc == 0, f"torch: snapsmp exits 0 after SIGTERM (flushing): {rc} {err}")
    on_disk = {n: sha(os.path.join(disk, n)) for n in sorted(os.listdir(disk)) if not n.startswith(".")}
    check(in_store == on_disk and f"ckpt-{steps}.pt" in on_disk,
          f"torch: the disk holds the store's checkpoints byte for byte: store {in_store} disk {on_disk}")
    load = ("import torch,sys\n"
            "s=torch.load(sys.argv[1])\n"
            "print(s['step'])\n")
    r = subprocess.run([sys.executable, "-c", load, os.path.join(disk, f"ckpt-{steps}.pt")],
                       env=env("", "", preload=False), capture_output=True, text=True, timeout=300)
    check(r.returncode == 0 and r.stdout.strip() == str(steps), f"torch: torch.load without the preload: {r.stdout} {r.stderr[-1000:]}")
    print(f"torch: {args.trials} kills ({mid_save} aimed inside torch.save/os.replace), {len(seen)} losses equal", flush=True)


# ---- the job's ends ------------------------------------------------------------------

def test_ends():
    # SIGTERM: the preload's handler asks snapsmp to flush, then the writer dies of it.
    store, disk = fresh("term")
    smp = start_smp(store, "--quiet", "--flush-files", "0")
    w = subprocess.Popen([WRITER, "hold", disk, str(args.bytes), "3"], env=env(store, disk), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    lines = Lines(w)
    check(lines.wait_for(lambda l: l == "holding") is not None, f"term: the writer committed 3 steps: {w.stderr.read() if w.poll() is not None else ''}")
    lines.close()
    real = lambda: sorted(n for n in os.listdir(disk) if n.startswith("ckpt-"))  # noqa: E731
    check(real() == [], f"term: with --flush-files 0 nothing is on disk before the signal: {real()}")
    w.send_signal(signal.SIGTERM)
    w.wait()
    check(w.returncode == -signal.SIGTERM, f"term: the writer died of SIGTERM as without the preload: {w.returncode}")
    wt = Waiter()
    got = wt.until(lambda: real() == ["ckpt-1", "ckpt-2"], limit=120, dirs=lambda: [disk])
    wt.close()
    check(got, f"term: snapsmp flushed the files after the writer's SIGTERM: {real()}")
    rc, res, _ = writer_check(store, disk, preload=False)
    check(rc == 0 and res["newest"] == 2, f"term: the flushed files are complete without the preload: {res}")
    rc, err = stop_smp(smp)
    check(rc == 0, f"term: snapsmp exits 0: {err}")

    # MPI_Finalize: returns once the job's files are on disk.
    store, disk = fresh("mpi")
    smp = start_smp(store, "--quiet", "--flush-files", "0")
    e = env(store, disk, preload=False, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    xs = []
    for k, v in env(store, disk).items():
        if k in ("LD_PRELOAD", "SNAP_STORE", "SNAP_CAPTURE", "SNAP_JOB", "SNAP_TIMEOUT_MS", "ASAN_OPTIONS"):
            xs += ["-x", f"{k}={v}"]
    r = subprocess.run([args.mpiexec, "-np", "2", "--oversubscribe", *xs, os.path.join(BUILD, "tests", "preload", "pl_mpi"),
                        disk], env=e, capture_output=True, text=True, timeout=240)
    check(r.returncode == 0, f"mpi: the job succeeds: {r.returncode} {r.stdout} {r.stderr}")
    for rank in range(2):
        path = os.path.join(disk, f"rank-{rank}.bin")
        want = bytes((i * 13 + rank * 101) & 0xFF for i in range(1 << 20))
        ok = os.path.exists(path) and open(path, "rb").read() == want
        check(ok, f"mpi: rank {rank}'s file is on disk, byte for byte, when mpirun returns")
    rc, err = stop_smp(smp)
    check(rc == 0, f"mpi: snapsmp exits 0: {err}")


def main():
    rng = random.Random(args.seed)
    try:
        if args.mode == "calls":
            test_calls()
        elif args.mode == "kill":
            test_kill(rng)
        elif args.mode == "torch":
            test_torch(rng)
        elif args.mode == "ends":
            test_ends()
        elif args.mode == "memory":
            test_memory()
        else:
            test_fallback()
    finally:
        shutil.rmtree(BASE, ignore_errors=True)
        shutil.rmtree(DISK, ignore_errors=True)
    print(f"{check.passed} checks passed, {check.failed} failed", flush=True)
    sys.exit(1 if check.failed else 0)


main()
