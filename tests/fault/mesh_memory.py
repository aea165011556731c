#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Memory stays bounded in an erasure-coded mesh, protect after protect.

Each protect maps slots, rotates the parity file through the spare, gathers
records and exchanges pieces over MPI, and every 5th step each node flushes
its part to its own directory (keeping 2); none of it may accumulate. A 2+1
mesh of 3 nodes serves a 3-rank job: a first launch saves WARM steps and
exits, a second resumes and saves MORE. After each, once its last step is
protected on every node, its trainers' disconnections logged, and (asked
with SIGUSR1) the newest step persisted (the daemons' log lines: events,
never a timer), every snapsmp is sampled from /proc: anonymous resident
memory (RssAnon), open descriptors, threads (io_uring's kernel workers
aside); and each node's count against its budget must equal what its files
hold (mesh_trials' budget check, after the samples). Between the samples none may grow beyond a small allowance.
usage: mesh_memory.py --build DIR [--mpiexec P]
"""
import argparse
import glob
import os
import re
import shutil
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from events import Waiter  # noqa: E402
from mesh_trials import JOB, Mesh, budget_mismatch, setup, start_trainers  # noqa: E402
from procstat import compare, sample, sanitized  # noqa: E402

WARM, MORE = 40, 300
# Bytes of RssAnon growth allowed per daemon over MORE steps (150-260
# protects). The gcc build grows 0-4 KiB (VmData by 0 or 140 KiB, the same
# with or without a leak: one step of malloc's heap, untouched), and a 1 KiB
# leak planted in each protect grew it 124-144 KiB: that must fail. Under ASan the
# daemons grow 170-230 KiB, the same over 900 steps as over 300: its
# allocator settling, not a leak per protect.
ALLOW, ALLOW_ASAN = 64 << 10, 512 << 10


def daemons(mesh):
    """node -> pid of its snapsmp (the session's processes running it)."""
    out = {}
    for pid in mesh.session():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"snapsmp" and b"OMPI_COMM_WORLD_RANK" in env:
            out[int(env[b"OMPI_COMM_WORLD_RANK"])] = pid
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    a = ap.parse_args()
    a.shape, a.nodes, a.world, a.bytes = "2+1", 3, 3, "1M"
    base, logdir = setup(a, "snaptest-meshmem")
    a.world = a.nodes
    allow = ALLOW_ASAN if sanitized(a.snapsmp) else ALLOW
    flush = os.path.join(logdir, "flush")
    mesh = Mesh(a, base, extra=["--flush-dir", os.path.join(flush, "node%n"), "--flush-every", "5",
                                "--flush-keep", "2"])
    failures = []

    def fail(msg):
        print("FAIL:", msg, flush=True)
        failures.append(msg)

    def protected(step):
        return len(re.findall(rf"job {JOB} step {step} protected", mesh.text()))

    def persisted(step):
        return len(re.findall(rf"job {JOB} step {step} persisted", mesh.text()))

    def launch(tag, last):
        """The launch run to `last`, then each daemon's sample once the log
        says (events, never a timer): `last` protected on every node, each
        trainer disconnected (logged once its descriptor is closed), and,
        asked with SIGUSR1, the newest protected step persisted (node 0
        sealed it and ran retention before the nodes log it). The budget
        check runs after the samples: its snaptool connections would be in
        them."""
        procs = start_trainers(a, mesh, logdir, tag, last)
        for p, _, err in procs:
            if p.wait(timeout=300) != 0:
                fail(f"{tag}: a trainer exited {p.returncode}; see {err}")
        mesh.signal_all(signal.SIGUSR1)
        w = Waiter()
        try:
            ok = w.until(lambda: protected(last) >= a.nodes and persisted(last) >= a.nodes and
                         all(f"(pid {p.pid}) disconnected" in mesh.text() for p, _, _ in procs),
                         limit=300, dirs=lambda: [logdir])
        finally:
            w.close()
        if not ok:
            fail(f"{tag}: step {last} not protected and persisted on every node, or a trainer's disconnection "
                 f"not logged; see {mesh.log}")
        pids = daemons(mesh)
        if len(pids) != a.nodes:
            fail(f"{tag}: found snapsmp on nodes {sorted(pids)}")
        got = {n: sample(pid) for n, pid in pids.items()}
        bad = budget_mismatch(mesh, a)
        if bad:
            fail(f"{tag}: {bad}")
        return got

    try:
        mesh.start(os.path.join(logdir, "mesh.log"))
        first = launch("warm", WARM)
        last = launch("more", WARM + MORE)
        # A round protects the newest step every rank completed, so a fast
        # job has fewer protects than steps: count what was measured.
        done = {int(s) for s in re.findall(rf"job {JOB} step (\d+) protected", mesh.text()) if int(s) > WARM}
        print(f"{len(done)} steps protected between the samples", flush=True)
        if len(done) < 20:
            fail(f"only {len(done)} steps were protected between the samples")
        for n in sorted(first):
            if n not in last:
                continue
            line, problems = compare(f"node {n}", first[n], last[n], MORE, allow)
            print(line, flush=True)
            for msg in problems:
                fail(msg)
        parts = sorted(glob.glob(os.path.join(flush, "node*", JOB, "step-*", "MANIFEST*")))
        print(f"{len(parts)} sealed parts in the flush directories", flush=True)
        if not parts:
            fail("no node flushed a part")
        mesh.stop()
        if mesh.sanitizer_errors():
            fail(f"sanitizer report in {mesh.log}")
    finally:
        mesh.kill()
    if failures:
        print(f"mesh_memory: {len(failures)} failure(s); logs in {logdir}")
        return 1
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(logdir, ignore_errors=True)
    print("mesh_memory: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
