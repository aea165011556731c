#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The whole protection hierarchy with real processes: `mpirun -np NODES
snapsmp --ec K+M --flush-dir DISK` (one store per node on this machine, one
flush directory they all write into; with --layout node, DISK/node%n: each
node writes and seals its part in its own directory, and a directory past
the mesh holds stale parts of steps 1-120 that node 0 must withdraw before
each flush), example trainers spread over the nodes.

Each trial relaunches the mesh over the previous trial's stores and flush
directory, after one of these ends:
  quiet  (--flush-every 1000: only signals flush)
         the trainers ran to a target step and exited; the test waits until
         every node holds that step's protect record, sometimes sends SIGUSR1
         (a preemption notice: the mesh must persist that step) and waits for
         it to be persisted (sometimes first with a directory where one rank's
         file goes: that node's part fails, every node logs the failure, the
         step is not persisted and what was stays), then SIGKILLs the mesh or stops it with SIGTERM
         (which must persist the newest protected step, then exit 0);
  busy   the trainers keep committing with --flush-every 1; the test waits
         until a flush that began after the restore has been persisted and
         measures it, then waits for the next flush to begin and SIGKILLs the
         whole mesh within that measured time (mid-flush), or within a step
         (mid-protect).
Then stores are lost: none (level 1: the local stores), up to M per group
(level 2: rebuilt from parity), M+1 of group 0 or every store (level 3: the
newest persisted step on disk), or M+1 and the job's flush directory too
(level 4: a clear error naming what is lost, trainers exit 1).
Checks: every rank restores the same step, bit-exact (the trainer verifies
its state, exit 3 otherwise); from the level the mesh logs; exactly the
target step after a quiet end at levels 1-2, exactly the newest persisted
step at level 3, never older than the newest step logged protected (levels
1-2) or persisted (level 3); a persisted step has every rank file and a
MANIFEST, and never more than --flush-keep persisted steps stay; before each
relaunch, `snaptool recover --nodes` (offline, from the stores and the flush
directory) names the level and step the relaunch then restores.
"""
import argparse
import glob
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

from events import Waiter, strike_within
from mesh_trials import (JOB, Mesh, committed_after_restore, groups_of, have_record, restored_of, setup,
                         start_trainers, wait_restored)

KEEP = 2


def step_files(dirs):
    """{step: {rank: path of its file}} of the steps whose MANIFESTs (whole,
    or a node's parts) under dirs list every rank of their world once, read
    here independently of io/ (docs/io-format.md)."""
    seen = {}
    for d in dirs:
        jd = os.path.join(d, JOB)
        for e in os.listdir(jd) if os.path.isdir(jd) else []:
            if not (e.startswith("step-") and e[5:].isdigit()):
                continue
            try:
                with open(os.path.join(jd, e, "MANIFEST")) as f:
                    text = f.read()
            except FileNotFoundError:
                continue   # never sealed, or a part withdrawn for a new try
            world = int(re.search(r"^world (\d+)$", text, re.M)[1])
            w, ranks = seen.setdefault(int(e[5:]), (world, {}))
            for r in re.findall(r"^rank (\d+) ", text, re.M):
                if int(r) in ranks or w != world:
                    ranks[-1] = "twice"   # never persisted
                ranks[int(r)] = os.path.join(jd, e, f"rank-{r}.h5")
    return {s: ranks for s, (w, ranks) in seen.items() if sorted(ranks) == list(range(w))}


def parts_not_withdrawn(text, target):
    """Per node (snapsmp pid), the tries of target's flush in the order they
    began; a "sealed" or "failed" line ends the oldest try still open (a
    retry can begin while the failed try's part is being written), and a
    "withdrew" line belongs to the oldest open try, which does it before it
    writes. Every part sealed by a try that another try followed must be
    withdrawn by that next try. Returns (such parts, pids where one was not).
    A retry the mesh starts itself (a node's SIGUSR1 that came after the
    round took another's) counts like the test's own."""
    tries = {}
    for m in re.finditer(r"snapsmp\[(\d+)\]: (.*)", text):
        pid, msg = m.groups()
        mine = tries.setdefault(pid, [])
        open_ = [x for x in mine if not x["ended"]]
        if re.search(rf"step {target}: flushing \d+ rank file", msg):
            mine.append({"sealed": False, "withdrew": False, "ended": False})
        elif open_ and re.search(rf"of step {target} of job {JOB} and sealed them", msg):
            open_[0].update(sealed=True, ended=True)
        elif open_ and f"ranks of step {target} of job {JOB} failed" in msg:
            open_[0]["ended"] = True
        elif open_ and f"withdrew this node's earlier part of step {target} of job {JOB}" in msg:
            open_[0]["withdrew"] = True
    n, kept = 0, []
    for pid, mine in tries.items():
        for a, b in zip(mine, mine[1:]):
            if a["sealed"]:
                n += 1
                if not b["withdrew"]:
                    kept.append(int(pid))
    return n, kept


def persisted_steps(dirs):
    return sorted(step_files(dirs))


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def plant_stale_parts(d, world, steps):
    """A node directory past the mesh (one that had more nodes before) with
    a sealed part of every step in steps, listing rank 0: unless the mesh
    withdraws it before flushing such a step, the union lists rank 0 twice
    and the step is never persisted."""
    for s in steps:
        sd = os.path.join(d, JOB, f"step-{s}")
        os.makedirs(sd)
        with open(os.path.join(sd, "rank-0.h5"), "wb") as f:
            f.write(b"stale")
        body = f"snapio-manifest 1\njob {JOB}\nstep {s}\nworld {world}\npart 1\nrank 0 5 1 5 00000000\n"
        with open(os.path.join(sd, "MANIFEST"), "w") as f:
            f.write(body + f"end {crc32c(body.encode()):08x}\n")


def logged(text, what):
    return [int(x) for x in re.findall(rf"job {JOB} step (\d+) {what}", text)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--shape", default="3+1")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--bytes", default="256K")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    ap.add_argument("--layout", choices=["shared", "node"], default="shared",
                    help="one flush directory for the mesh, or one per node (DISK/node%%n)")
    a = ap.parse_args()
    base, logdir = setup(a, "snaptest-meshflush")
    disk = os.path.join(base, "disk")
    # What the mesh and snaptool are given, and the directories that exist behind it.
    disk_arg = disk if a.layout == "shared" else os.path.join(disk, "node%n")
    dirs = [disk] if a.layout == "shared" else [os.path.join(disk, f"node{n}") for n in range(a.nodes)]
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    groups = groups_of(a.nodes, a.k, a.m)
    print(f"mesh_flush: {a.shape} nodes={a.nodes} world={a.world} trials={a.trials} layout={a.layout} seed={seed}")
    if a.layout == "node":
        plant_stale_parts(os.path.join(disk, f"node{a.nodes}"), a.world, range(1, 121))
    mesh = Mesh(a, base)
    waiter = Waiter()
    waiter.watch(logdir)
    failures, seen = [], set()

    def fail(msg):
        print("FAIL:", msg)
        failures.append(msg)

    # What the next launch must restore: ("exact", s), ("atleast", s) or ("error", None) / ("fresh", None).
    expect, level, step, flush_time = ("fresh", None), 1, 0, None
    try:
        last_on_disk = []
        for t in range(a.trials + 1):
            busy = 0 < t < a.trials and expect[0] != "error" and rng.random() < 0.5
            mid_flush = False
            # Busy: a flush of every protected step, to strike in one. Quiet:
            # only the signals flush, so SIGUSR1 and SIGTERM are what is tested.
            mesh.extra = ["--flush-dir", disk_arg, "--flush-every", "1" if busy else "1000", "--flush-keep", str(KEEP)]
            mesh.start(os.path.join(logdir, f"mesh{t}.log"))
            target = step + rng.randint(4, 6)
            procs = start_trainers(a, mesh, logdir, f"t{t}", 10**8 if busy else target)
            pp = [p for p, _, _ in procs]
            if busy:
                if not wait_restored(waiter, procs):
                    fail(f"trial {t}: the ranks did not log their restore")
                restored_at = time.monotonic()
                waiter.until(lambda: any(committed_after_restore(log) for _, log, _ in procs), procs=pp)
                step_time = time.monotonic() - restored_at
                mid_flush = rng.random() < 0.6
                if mid_flush:
                    # One whole flush begun after the restore, measured; then the next one's start.
                    n0 = len(logged(mesh.text(), "persisted"))
                    began = time.monotonic()
                    if not waiter.until(lambda: len(logged(mesh.text(), "persisted")) > n0, procs=pp):
                        fail(f"trial {t}: no flush was persisted while the trainers ran; see {mesh.log}")
                    flush_time = time.monotonic() - began
                    starts = len(re.findall(r"flushing \d+ rank file", mesh.text()))
                    waiter.until(lambda: len(re.findall(r"flushing \d+ rank file", mesh.text())) > starts, procs=pp)
                    strike_within(rng, flush_time)
                else:
                    strike_within(rng, 3 * step_time)
                mesh.kill()
                for p in pp:
                    p.kill()
            for p in pp:
                p.wait()
            # ---- what this launch restored ----
            restored, codes = set(), set()
            for r, (p, log, err) in enumerate(procs):
                codes.add(p.returncode)
                if expect[0] == "error":
                    with open(err) as f:
                        e = f.read()
                    if p.returncode != 1 or "cannot be rebuilt" not in e or "no step of it is persisted" not in e:
                        fail(f"trial {t} rank {r}: level 4 (nothing left) gave exit {p.returncode}, {e!r}")
                    continue
                if p.returncode not in ((0,) if not busy else (0, 1, -signal.SIGKILL)):
                    fail(f"trial {t} rank {r}: trainer exited {p.returncode}; see {err}")
                restored.add(restored_of(log))
            text = mesh.text()
            if expect[0] != "error":
                if len(restored) != 1:
                    fail(f"trial {t}: ranks restored different steps {sorted(restored, key=str)}")
                got = restored.pop() if len(restored) == 1 else None
                want = expect[1]
                if expect[0] == "exact" and got != want:
                    fail(f"trial {t}: level {level}: restored {got}, expected exactly {want} (seed {seed})")
                if expect[0] == "atleast" and (got is None or got < want):
                    fail(f"trial {t}: level {level}: restored {got}, expected at least {want} (seed {seed})")
                if expect[0] == "fresh" and got not in (0, None):
                    fail(f"trial {t}: restored {got} from nothing")
                disk_line = "(level: disk)" in text
                if t > 0 and expect[0] != "fresh" and disk_line != (level == 3):
                    fail(f"trial {t}: level {level} but the mesh log says{'' if disk_line else ' not'} "
                         f"'level: disk'; see {mesh.log}")
                seen.add(level)
            else:
                seen.add(4)
                # Start over from nothing: the next launch is a fresh job.
                mesh.kill()
                for n in range(a.nodes):
                    shutil.rmtree(mesh.root(n), ignore_errors=True)
                expect, level, step = ("fresh", None), 1, 0
                print(f"trial {t}: level 4 -> every rank refused clearly")
                continue
            if t == a.trials:
                break
            # ---- how this launch ends ----
            ended = "kill mid-flush" if busy and mid_flush else "kill"
            if busy:
                committed = [0]
                for _, log, _ in procs:
                    with open(log) as f:
                        committed += [int(x) for x in re.findall(r"^committed (\d+)$", f.read(), re.M)]
                step = max(committed)
                # Protected before this launch's kill: what it logged, or what it restored from
                # the stores. A step restored from disk (level 3) is protected only once the mesh
                # encodes it again, which the kill may have beaten.
                prot = max(logged(text, "protected") + [got or 0 if level != 3 else 0])
                unprotected = level == 3 and not logged(text, "protected")
            else:
                if not waiter.until(lambda: have_record(mesh, a, target), limit=60,
                                    dirs=lambda: [os.path.join(mesh.root(n), JOB, "ec") for n in range(a.nodes)]):
                    fail(f"trial {t}: step {target} was not protected")
                prot, step, unprotected = target, target, False
                if rng.random() < 0.4:
                    blocked_try = rng.random() < 0.5
                    if blocked_try:
                        # One node's part fails: a directory where one rank's file goes. The
                        # step must not count as persisted, what is on disk stays, and the
                        # next request persists it once the obstacle is gone.
                        before = persisted_steps(dirs)
                        rank = rng.randrange(a.world)
                        blocked = [os.path.join(d, JOB, f"step-{target}", f"rank-{rank}.h5") for d in dirs]
                        for b in blocked:
                            os.makedirs(b)
                        failed = rf"flush of step {target} of job {JOB} failed on node \d+"
                        mesh.signal_all(signal.SIGUSR1)
                        if not waiter.until(lambda: len(re.findall(failed, mesh.text())) >= a.nodes):
                            fail(f"trial {t}: a blocked rank file did not fail the flush of {target} on every "
                                 f"node; see {mesh.log}")
                        if target in persisted_steps(dirs) or not set(before) <= set(persisted_steps(dirs)):
                            fail(f"trial {t}: after a failed flush of {target}: persisted {persisted_steps(dirs)}, "
                                 f"before {before}")
                        for b in blocked:
                            os.rmdir(b)
                        print(f"trial {t}: the flush of {target} failed on the node holding rank {rank}, "
                              f"as it should", flush=True)
                    # Per node: the parts the failed try sealed (logged before the retry) must each
                    # be withdrawn by the retry before it writes, never joined to the new parts.
                    sealed = rf"of step {target} of job {JOB} and sealed them"
                    if blocked_try and a.layout == "node" and a.world > 1 and rng.random() < 0.5:
                        # The mesh agrees on the failure as soon as one node reports it; the
                        # other nodes' flush threads may still be writing their parts (seen in
                        # CI under ASan: sealed 11 ms after the failure was agreed). Half the
                        # time, wait until every node that started a part has reported it, so
                        # the retry has sealed parts to withdraw; else retry at once, behind
                        # the parts still being written.
                        began = len(re.findall(rf"step {target}: flushing \d+ rank file", mesh.text()))
                        done_re = rf"(?:{sealed}|flush of this node's ranks of step {target} of job {JOB} failed)"
                        if not waiter.until(lambda: len(re.findall(done_re, mesh.text())) >= began):
                            fail(f"trial {t}: {began} nodes began parts of step {target}, not all ended; "
                                 f"see {mesh.log}")
                        if not re.findall(sealed, mesh.text()):
                            fail(f"trial {t}: the failed flush of {target} sealed no part on the nodes without "
                                 f"rank {rank}; see {mesh.log}")
                    mesh.signal_all(signal.SIGUSR1)
                    if not waiter.until(lambda: target in persisted_steps(dirs) and
                                        len(re.findall(rf"job {JOB} step {target} persisted", mesh.text())) >= a.nodes):
                        fail(f"trial {t}: SIGUSR1 did not persist protected step {target}; see {mesh.log}")
                    # Each node's line for its rank files says how they reached the disk.
                    wrote = re.findall(rf"wrote \d+ rank file\(s\) of step {target} of job {JOB}.*", mesh.text())
                    how = (", O_DIRECT", ", through the page cache", ", O_DIRECT for some rank files")
                    if not wrote or not all(w.endswith(how) for w in wrote):
                        fail(f"trial {t}: nodes' rank-file lines for step {target} do not say how they were "
                             f"written: {wrote[:3]}; see {mesh.log}")
                    nsealed, kept = parts_not_withdrawn(mesh.text(), target)
                    if kept:
                        fail(f"trial {t}: {len(kept)} of the {nsealed} part(s) of step {target} sealed by a try "
                             f"that another followed were not withdrawn by it (snapsmp pids {kept}); see {mesh.log}")
                    elif nsealed:
                        print(f"trial {t}: the retry withdrew the {nsealed} part(s) the failed try sealed",
                              flush=True)
                if rng.random() < 0.4:
                    ended = "term"
                    rc = mesh.stop()
                    if rc != 0:
                        fail(f"trial {t}: mesh exited {rc} on SIGTERM")
                    if target not in persisted_steps(dirs):
                        fail(f"trial {t}: SIGTERM did not persist protected step {target} "
                             f"(persisted: {persisted_steps(dirs)})")
                else:
                    mesh.kill()
            files = step_files(dirs)
            on_disk = sorted(files)
            # Node 0 applies retention right after each seal (per node: the last part's), before
            # "persisted" is logged. A kill between the two leaves the step sealed and the old ones
            # kept; busy trials flush every step, so any of their kills may land there, quiet ones
            # wait for "persisted". So: a launch that persisted no step leaves what it found (seed
            # 2: a busy kill left [4, 6, 10], the next launch persisted nothing); one that persisted
            # one step may have run no retention at all (seed 222 in CI: [6, 9, 13] left, then 14
            # sealed and killed: [6, 9, 13, 14]); one that persisted two or more ran the retention
            # of the one before the last.
            new = set(on_disk) - set(last_on_disk)
            if not new:
                keep = max(KEEP, len(last_on_disk))
            elif busy and len(new) == 1:
                keep = max(KEEP, len(last_on_disk)) + 1
            else:
                keep = KEEP + busy
            if len(on_disk) > keep:
                fail(f"trial {t}: {len(on_disk)} persisted steps kept, --flush-keep {KEEP}, found {last_on_disk} at "
                     f"launch: {on_disk}")
            for s in on_disk:
                missing = [p for p in files[s].values() if not os.path.isfile(p)]
                if missing or len(files[s]) != a.world:
                    fail(f"trial {t}: persisted step {s} lacks rank files: {missing} of {sorted(files[s])}")
            if a.layout == "node":
                # every node directory that holds a step holds only its own part, never a whole step
                for d in dirs:
                    for m in glob.glob(os.path.join(d, JOB, "step-*", "MANIFEST")):
                        with open(m) as f:
                            if not re.search(r"^part \d+$", f.read(), re.M):
                                fail(f"trial {t}: {m} is not a part")
            pers = max(logged(mesh.text(), "persisted") or [0])
            if on_disk and pers > on_disk[-1]:
                fail(f"trial {t}: step {pers} was logged persisted, the disk's newest is {on_disk[-1]}")
            # ---- what is lost ----
            level = rng.choice([1, 2, 2, 3, 3, 4]) if on_disk else rng.choice([1, 2])
            if unprotected and level == 2:
                level = 3   # no parity of this launch: losing a node leaves the disk
            lost = []
            if level == 2:
                for g in groups:
                    lost += rng.sample(g, rng.randint(1, a.m))
            elif level >= 3:
                lost = list(range(a.nodes)) if rng.random() < 0.5 else groups[0][:a.m + 1]
                if level == 4:
                    lost = groups[0][:a.m + 1]   # survivors hold data; only the job is lost
                    for d in dirs:
                        shutil.rmtree(os.path.join(d, JOB), ignore_errors=True)
            for n in lost:
                shutil.rmtree(mesh.root(n), ignore_errors=True)
            last_on_disk = sorted(step_files(dirs))   # what the next launch finds
            if level <= 2:
                expect = ("exact", prot) if not busy else ("atleast", prot)
            elif level == 3:
                expect = ("exact", on_disk[-1])
                step = on_disk[-1]
            else:
                expect = ("error", None)
            # snaptool's offline view must predict the level (and the exact step) the relaunch restores from.
            rec = subprocess.run([a.snaptool, "recover", "--nodes", str(a.nodes), "--store",
                                  os.path.join(base, "node%n"), "--flush-dir", disk_arg, "--job", JOB],
                                 capture_output=True, text=True)
            said = re.search(r"a relaunch restores step (\d+) from .* \(level (\d)\)", rec.stdout)
            if level == 4 or (expect == ("atleast", 0) and rec.returncode == 3):
                if rec.returncode != 3 or "NOTHING IS RECOVERABLE" not in rec.stdout:
                    fail(f"trial {t}: snaptool recover --nodes said {rec.stdout!r} (exit {rec.returncode}), "
                         f"expected nothing recoverable")
            elif rec.returncode != 0 or not said or int(said[2]) != level or \
                    (expect[0] == "exact" and int(said[1]) != expect[1]):
                fail(f"trial {t}: level {level}, expect {expect}: snaptool recover --nodes said {rec.stdout!r} "
                     f"(exit {rec.returncode})")
            print(f"trial {t}: {'busy' if busy else 'quiet'}, ended by {ended}, protected {prot}, persisted "
                  f"{on_disk}, level {level} (lost nodes {sorted(lost)}) -> expect {expect}")
        rc = mesh.stop() if mesh.proc else 0
        if rc != 0:
            fail(f"mesh exited {rc} on the final SIGTERM")
        if mesh.sanitizer_errors():
            fail(f"sanitizer report in {mesh.log}")
    finally:
        mesh.kill()
    if not failures and seen != {1, 2, 3, 4}:
        print(f"mesh_flush: note: levels exercised {sorted(seen)} (seed {seed})")
    if failures:
        print(f"mesh_flush: {len(failures)} failures (seed {seed}); logs in {logdir}")
        return 1
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(logdir, ignore_errors=True)
    print(f"mesh_flush: ok, levels {sorted(seen)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
