#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Erasure-coded mesh with real processes: `mpirun -np NODES snapsmp --ec K+M`
(one store root and socket per node, on one machine), example trainers spread
over the nodes, SIGKILL of the whole mesh, random loss of up to M nodes per
group (their store directories deleted), random byte flips in survivors, and
a relaunch that must rebuild every lost byte before the trainers resume.

Each trial relaunches the mesh over the previous trial's stores:
  quiet trial: the trainers ran to a target step and exited; the test waits
               until every node has the record of that step (protected), then
               kills the mesh. Expected after the loss: every rank restores
               exactly that step (as it would have without the loss), the lost
               nodes' files of that step (slot, manifest, parity, record) come
               back bit-exact, and flipped bytes are repaired.
  busy trial:  the mesh is killed while trainers commit and the mesh encodes.
               Expected: every rank restores the same step, not older than the
               newest step the daemons logged as protected (a node lost in the
               middle of an encode must not cost the previous protected step).
The trainer checks restored state itself (exit 3 on a mismatch).
Then a protect fails on node 0 (its parity file cannot be created): no newer
step may be reported protected, every node keeps the previous protected step's
files, and after a relaunch that loses a node the ranks restore that step.
Then a new incarnation of the trainers starts while the mesh stays up, and
the one rank of the last node reconnects last: that node still holds the dead
incarnation's step S+1, which only that rank had committed. The others restore
S and commit a new S+1; the two must never add up to a restorable S+1 (the
late rank would restore a step no incarnation ever had): all restore S.
Finally (--final-loss) M+1 nodes of group 0 are lost: the relaunch must name
the group and its lost nodes, refuse the restore (SNAP_ELOST), and leave the
surviving stores byte-identical.
"""
import argparse
import glob
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

from events import Waiter, strike_within
from mesh_proc import Mesh

JOB = "mt"


def md5(path):
    with open(path, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


def tree_md5(root):
    """path -> md5 of every file under root that holds a step's data:
    sockets, the lock and the parity pool files the warm-up makes ahead
    (ec/warm-N.parity: no step's bytes yet; a daemon's start may make, touch
    or drop them) are left out."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".sock") or f == "smp.lock" or (f.startswith("warm-") and f.endswith(".parity")):
                continue
            p = os.path.join(d, f)
            out[os.path.relpath(p, root)] = md5(p)
    return out


def groups_of(nodes, k, m):
    """Contiguous groups with ec/'s tail policy (mirrors snap_ec_group_of)."""
    n = k + m
    full, r = divmod(nodes, n)
    gs = [list(range(i * n, (i + 1) * n)) for i in range(full)]
    if r >= m + 1:
        gs.append(list(range(full * n, nodes)))
    elif r:
        gs[-1].extend(range(full * n, nodes))
    return gs


def setup(a, tag):
    """The derived settings of a mesh run (k, m, world, program paths) into a,
    and fresh store and log directories named tag-PID: (base, logdir)."""
    a.k, a.m = map(int, a.shape.split("+"))
    a.world = getattr(a, "world", 0) or a.nodes + 2
    a.codec = getattr(a, "codec", None)
    a.snapsmp = os.path.join(a.build, "smp", "snapsmp")
    a.trainer = os.path.join(a.build, "integration", "trainer")
    a.snaptool = os.path.join(a.build, "tools", "snaptool")
    base, logdir = f"/dev/shm/{tag}-{os.getpid()}", f"/tmp/{tag}-{os.getpid()}"
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(logdir, exist_ok=True)
    os.makedirs(base)
    return base, logdir


def start_trainers(a, mesh, logdir, tag, steps, ranks=None, extra=(), env_over=None, extra_of=None):
    """steps: the last step for every rank, or a dict rank -> last step.
    extra: more trainer flags (extra_of(rank): a rank's own); env_over:
    variables to set (None: unset).
    The ranks started by one call are one launch (SNAP_LAUNCH): a rank that
    connects after its node's other ranks of the call exited joins their
    incarnation instead of starting a new one."""
    procs = []
    launch = f"{tag}-{os.getpid()}-{time.monotonic_ns()}"
    for r in (range(a.world) if ranks is None else ranks):
        node = r % a.nodes
        env = dict(os.environ, SNAP_STORE=mesh.root(node), SNAP_JOB=JOB, SNAP_RANK=str(r), SNAP_LAUNCH=launch,
                   SNAP_WORLD_SIZE=str(a.world), SNAP_TIMEOUT_MS="20000", SNAP_COPY_THREADS="1", SNAP_SLOTS="3")
        if a.codec:   # frames in the slots: parity and rebuild treat them as bytes
            env["SNAP_CODEC_PARAM"], env["SNAP_CODEC_OPTIM"] = a.codec.split(",")
        for k, v in (env_over or {}).items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        log = os.path.join(logdir, f"{tag}-r{r}.log")
        err = open(os.path.join(logdir, f"{tag}-r{r}.err"), "w")
        last = steps[r] if isinstance(steps, dict) else steps
        args = [a.trainer, "--steps", str(last), "--bytes", a.bytes, "--resume", "--quiet", "--log", log, *extra,
                *(extra_of(r) if extra_of else ())]
        procs.append((subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=err), log, err.name))
        err.close()
    return procs


def wait_restored(waiter, procs):
    """Until every rank logged its restore (or exited); False after the waiter's limit."""
    return waiter.until(lambda: all(p.poll() is not None or os.path.exists(log) and restored_of(log) is not None
                                    for p, log, _ in procs), procs=[p for p, _, _ in procs])


def restored_of(log):
    res = None
    with open(log) as f:
        for line in f:
            p = line.split()
            if len(p) == 2 and p[0] in ("restored", "fresh") and p[1].isdigit():
                res = int(p[1]) if p[0] == "restored" else 0
    return res


def committed_after_restore(log):
    """Has this rank logged a commit since its restore?"""
    seen = False
    with open(log) as f:
        for line in f:
            if line.startswith(("restored ", "fresh ")):
                seen = True
            elif seen and line.startswith("committed "):
                return True
    return False


def have_record(mesh, a, step):
    return all(os.path.exists(os.path.join(mesh.root(n), JOB, "ec", f"step-{step}.rec")) for n in range(a.nodes))


def daemon_status(a, root):
    """snaptool status --json of the daemon serving root, or a message (str) when it fails."""
    p = subprocess.run([a.snaptool, "status", "--json", "--store", root], capture_output=True, text=True)
    try:
        st = json.loads(p.stdout)
        return st if st["daemon_mem_used"] is not None else f"no daemon answers: {p.stdout!r}"
    except (ValueError, KeyError):
        return f"snaptool status failed: {p.stdout!r} {p.stderr!r}"


def budget_mismatch(mesh, a):
    """Each live node's count against its budget (snaptool status --json,
    daemon_mem_used) must equal the bytes its files hold: slot files plus
    every non-record file in <job>/ec (the protected step's parity and the
    spare), once it reserves no slot file in the background (those bytes
    are counted before they are in a file; the reservation thread closes a
    slot file once its result is published, an inotify event). Returns the
    first node that differs, as a message, or None."""
    def settled(root):
        st = daemon_status(a, root)
        return st if isinstance(st, str) or st["daemon_reserving"] == 0 else None

    waiter = Waiter()
    try:
        for n in range(a.nodes):
            root = mesh.root(n)
            st = waiter.until(lambda: settled(root), limit=60,
                              dirs=lambda: glob.glob(os.path.join(root, JOB, "rank-*")))
            if st is None:
                return f"node {n}: still reserving slot files after 60 s"
            if isinstance(st, str):
                return f"node {n}: {st}"
            counted = st["daemon_mem_used"]
            held, ec = 0, []
            for d, _, files in os.walk(mesh.root(n)):
                for f in files:
                    path = os.path.join(d, f)
                    if os.path.basename(d) == "ec" and not f.endswith(".rec"):
                        held += os.path.getsize(path)
                        ec.append(f)
                    elif f.startswith("slot-") and not f.endswith(".man"):
                        held += os.path.getsize(path)
            if counted != held:
                return f"node {n}: the daemon counts {counted} bytes, its files hold {held} (ec files: {sorted(ec)})"
        # Nor may a daemon keep a deleted store file mapped (its pages would be
        # memory no budget counts): store/slotmap.c drops such mappings every round.
        stale = [f for f in mapped_store_files(mesh) if f.endswith("(deleted)")]
        return f"snapsmp keeps deleted store files mapped: {stale[:3]}" if stale else None
    finally:
        waiter.close()


def mapped_store_files(mesh):
    """The files under the mesh's stores that some snapsmp process maps."""
    out = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"snapsmp" not in f.read():
                    continue
            with open(f"/proc/{pid}/maps") as f:
                out += [ln.split(None, 5)[-1].strip() for ln in f if mesh.base in ln]
        except OSError:
            continue
    return out


def man_step(path):
    """The step a manifest describes (proto/src/manifest.c: header 24 bytes, job, rank, world, step)."""
    with open(path, "rb") as f:
        b = f.read()
    n = int.from_bytes(b[24:26], "little")
    o = 26 + n + 8
    return int.from_bytes(b[o:o + 8], "little")


def step_files(root, step):
    """Files that must come back bit-exact: ec files of step, slots whose manifest is for step."""
    out = {}
    ec = os.path.join(root, JOB, "ec")
    for ext in ("parity", "rec"):
        p = os.path.join(ec, f"step-{step}.{ext}")
        if os.path.exists(p):
            out[os.path.relpath(p, root)] = md5(p)
    jd = os.path.join(root, JOB)
    for d in sorted(os.listdir(jd)) if os.path.isdir(jd) else []:
        if not d.startswith("rank-"):
            continue
        for f in os.listdir(os.path.join(jd, d)):
            p = os.path.join(jd, d, f)
            if f.endswith(".man") and man_step(p) == step:
                out[os.path.relpath(p, root)] = md5(p)
                out[os.path.relpath(p[:-4], root)] = md5(p[:-4])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--shape", default="4+2")
    ap.add_argument("--nodes", type=int, default=6)
    ap.add_argument("--world", type=int, default=0, help="trainer ranks (default nodes + 2)")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--bytes", default="96K")
    ap.add_argument("--final-loss", action="store_true")
    ap.add_argument("--no-failed-protect", dest="failed_protect", action="store_false",
                    help="skip the failed-protect phase (about 3 s)")
    ap.add_argument("--no-late-rank", dest="late_rank", action="store_false",
                    help="skip the late-rank phase (about 3 s)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--codec", default=None, metavar="PARAM,OPTIM",
                    help="codecs for the trainer's regions (SNAP_CODEC_PARAM/OPTIM), e.g. lossless,abs:1e-3")
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    a = ap.parse_args()
    base, logdir = setup(a, "snaptest-mesh")
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    groups = groups_of(a.nodes, a.k, a.m)
    print(f"mesh_trials: {a.shape} nodes={a.nodes} groups={groups} world={a.world} trials={a.trials} seed={seed}")
    mesh = Mesh(a, base)
    waiter = Waiter()
    waiter.watch(logdir)
    failures = []

    def fail(msg):
        print("FAIL:", msg)
        failures.append(msg)

    step, expect_exact, lower = 0, 0, 0
    want_files = {}   # node -> the files a relaunch must rebuild bit-exact (set by each trial)
    try:
        for t in range(a.trials + 1):
            mesh.start(os.path.join(logdir, f"mesh{t}.log"))
            # Recovery ran before the sockets appeared: check the rebuilt files now.
            if t > 0 and expect_exact is not None:
                for n, files in want_files.items():
                    got = step_files(mesh.root(n), expect_exact)
                    for f, h in files.items():
                        if got.get(f) != h:
                            fail(f"trial {t}: node {n} {f} not rebuilt bit-exact (seed {seed})")
                    hosted = len([r for r in range(a.world) if r % a.nodes == n])
                    if sum(f.endswith(".man") for f in got) != hosted:
                        fail(f"trial {t}: node {n}: {sorted(got)} after the rebuild, expected {hosted} manifests")
                # Older steps and leftovers (orphans planted below) are gone;
                # the spare parity file stays for the next protect to reuse.
                keep = {f"step-{expect_exact}.rec", f"step-{expect_exact}.parity"}
                for n in range(a.nodes):
                    ec = os.path.join(mesh.root(n), JOB, "ec")
                    left = set(os.listdir(ec)) if os.path.isdir(ec) else set()
                    if left - {"spare.parity"} != keep:
                        fail(f"trial {t}: node {n} ec/ holds {sorted(left)} after the relaunch, expected {sorted(keep)}")
            busy = 0 < t < a.trials and rng.random() < 0.35
            # >= slots + 1 steps: a rank cannot finish before the others connect
            # (retention holds it back), so all ranks share one incarnation.
            target = step + rng.randint(4, 6)
            procs = start_trainers(a, mesh, logdir, f"t{t}", 10**8 if busy else target)
            if busy:
                # Never race the clock: every rank restores first (the check
                # below needs its line), then the mesh dies within the next
                # few steps, as long as the first step after the restore took.
                pp = [p for p, _, _ in procs]
                if not wait_restored(waiter, procs):
                    fail(f"trial {t}: the ranks did not log their restore within 120 s")
                restored_at = time.monotonic()
                waiter.until(lambda: any(committed_after_restore(log) for _, log, _ in procs), procs=pp)
                strike_within(rng, 3 * (time.monotonic() - restored_at))
                mesh.kill()
                for p, _, _ in procs:
                    p.kill()
            for p, _, _ in procs:
                p.wait()
            restored = set()
            for r, (p, log, err) in enumerate(procs):
                if p.returncode not in ((0,) if not busy else (0, 1, -signal.SIGKILL)):
                    fail(f"trial {t} rank {r}: trainer exited {p.returncode}; see {err}")
                restored.add(restored_of(log))
            if len(restored) != 1:
                fail(f"trial {t}: ranks restored different steps {sorted(restored, key=str)}")
            got = restored.pop() if len(restored) == 1 else None
            if t > 0 and expect_exact is not None and got != expect_exact:
                fail(f"trial {t}: restored {got}, expected exactly {expect_exact}")
            if t > 0 and expect_exact is None and (got is None or got < lower):
                fail(f"trial {t}: restored {got}, expected at least protected step {lower}")
            if t == a.trials:
                break
            if busy:
                prot = [int(x) for x in re.findall(r"job mt step (\d+) protected", mesh.text())]
                lower, expect_exact = max(prot) if prot else 0, None
                committed = [0]
                for _, log, _ in procs:
                    with open(log) as f:
                        committed += [int(x) for x in re.findall(r"^committed (\d+)$", f.read(), re.M)]
                step = max(committed)  # nothing newer can be restored
            else:
                # each node writes its record before it logs the step
                # protected: the log's growth wakes the waiter
                if not waiter.until(lambda: have_record(mesh, a, target), limit=30):
                    fail(f"trial {t}: step {target} was not protected within 30 s")
                # Quiescent (trainers gone, target protected everywhere):
                # the budget must count exactly what the files hold.
                done = re.compile(rf"job {JOB} step {target} protected")
                if not waiter.until(lambda: len(done.findall(mesh.text())) >= a.nodes):
                    fail(f"trial {t}: not every node logged step {target} protected; see {mesh.log}")
                why = budget_mismatch(mesh, a)
                if why:
                    fail(f"trial {t}: memory budget: {why}")
                mesh.kill()
                expect_exact, step = target, target
            # Lose up to M nodes per group, maybe flip a byte in a survivor.
            want_files, lost_all = {}, []
            for g in groups:
                lost = rng.sample(g, rng.randint(0, a.m))
                lost_all += lost
                if expect_exact is not None:
                    for n in lost:
                        want_files[n] = step_files(mesh.root(n), expect_exact)
                for n in lost:
                    shutil.rmtree(mesh.root(n))
                if expect_exact is not None and len(lost) < a.m and rng.random() < 0.5:
                    n = rng.choice([x for x in g if x not in lost])
                    files = step_files(mesh.root(n), expect_exact)
                    victims = [f for f in files if f.endswith((".parity", ".rec")) or f.split("/")[-1].startswith("slot-")]
                    par = [f for f in files if f.endswith(".parity")]
                    if par and rng.random() < 0.3:
                        # parity deleted or truncated while its record stays:
                        # one erased piece per stripe from this node, rebuilt
                        f = par[0]
                        p = os.path.join(mesh.root(n), f)
                        if rng.random() < 0.5:
                            os.unlink(p)
                        else:
                            os.truncate(p, os.path.getsize(p) // 2)
                        want_files.setdefault(n, {})[f] = files[f]
                    elif victims:
                        f = rng.choice(victims)
                        p = os.path.join(mesh.root(n), f)
                        size = os.path.getsize(p)
                        if size:
                            with open(p, "r+b") as fh:
                                off = rng.randrange(size)
                                fh.seek(off)
                                b = fh.read(1)
                                fh.seek(off)
                                fh.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
                            want_files.setdefault(n, {})[f] = files[f]
            if expect_exact is not None:
                # Leftovers of killed encodes on one survivor: a parity file
                # without record, half-written tmp files.
                alive = [n for n in range(a.nodes) if n not in lost_all]
                n = rng.choice(alive)
                ec = os.path.join(mesh.root(n), JOB, "ec")
                for f in (f"step-{expect_exact + 1000}.parity", f"step-{expect_exact}.parity.tmp",
                          f"step-{expect_exact + 1}.rec.tmp"):
                    with open(os.path.join(ec, f), "wb") as fh:
                        fh.write(os.urandom(4096))
            print(f"trial {t}: {'busy' if busy else 'quiet'} restored={got} lost={sorted(lost_all)}"
                  f" next expect={expect_exact if expect_exact is not None else f'>={lower}'}")
        if a.failed_protect:
            # A protect that fails on one node (its parity file cannot be
            # created) fails everywhere; the previous protected step P stays
            # protected on every node and is what a relaunch rebuilds.
            waiter.until(lambda: have_record(mesh, a, target), limit=30)
            P = target
            ec0 = os.path.join(mesh.root(0), JOB, "ec")
            blocks = [os.path.join(ec0, f"step-{P + i}.parity.tmp") for i in range(1, 12)]
            for b in blocks:
                os.mkdir(b)
            procs = start_trainers(a, mesh, logdir, "fp", P + 3)
            for p, _, err in procs:
                if p.wait() != 0:
                    fail(f"failed protect: trainer exited {p.returncode}; see {err}")
            # The mesh goes on trying to protect the newest step, P + 3: wait
            # until every node has logged that attempt's failure (no encode
            # still writing a .parity.tmp), never a fixed sleep.
            last_fail = re.compile(rf"node \d+: job {JOB} step {P + 3}: protect failed")
            if not waiter.until(lambda: len(last_fail.findall(mesh.text())) >= a.nodes):
                fail(f"failed protect: step {P + 3}'s protect did not fail on every node; see {mesh.log}")
            text = mesh.text()
            if "protect failed on node 0" not in text:
                fail(f"failed protect: no failure logged; see {mesh.log}")
            if any(re.findall(rf"job mt step {x} protected", text) for x in range(P + 1, P + 4)):
                fail("failed protect: a step after the blocked one was reported protected")
            for n in range(a.nodes):
                ec = os.path.join(mesh.root(n), JOB, "ec")
                left = {f for f in os.listdir(ec) if not f.endswith(".parity.tmp") or n != 0}
                if left != {f"step-{P}.rec", f"step-{P}.parity"}:
                    fail(f"failed protect: node {n} ec/ holds {sorted(left)}, expected step {P} only")
            mesh.kill()
            for b in blocks:
                os.rmdir(b)
            lost = groups[0][-1]
            shutil.rmtree(mesh.root(lost))
            mesh.start(os.path.join(logdir, "fp-relaunch.log"))
            procs = start_trainers(a, mesh, logdir, "fp2", P + 4)
            restored = set()
            for p, log, err in procs:
                p.wait()
                restored.add(restored_of(log))
            if restored != {P}:
                fail(f"failed protect: after losing node {lost} ranks restored {sorted(restored, key=str)}, "
                     f"expected the protected step {P}")
            print(f"failed protect: steps after {P} refused on node 0, {P} stayed protected and was restored")
            last = P + 4
        else:
            last = target
        if a.late_rank:
            alone = [r for r in range(a.world) if sum(x % a.nodes == r % a.nodes for x in range(a.world)) == 1]
            late = alone[-1]
            others = [r for r in range(a.world) if r != late]
            S = last + 3
            steps = {r: S for r in others}
            steps[late] = S + 1   # the dead incarnation's partial step S + 1
            procs = start_trainers(a, mesh, logdir, "late1", steps)
            for p, _, err in procs:
                if p.wait() != 0:
                    fail(f"late rank: trainer exited {p.returncode}; see {err}")
            procs = start_trainers(a, mesh, logdir, "late2", S + 3, others)
            pp = [p for p, _, _ in procs]

            def committed(log, s):
                try:
                    with open(log) as f:
                        return f"committed {s}\n" in f.read()
                except FileNotFoundError:   # not started yet
                    return False
            # The others' new S + 1 and a round that saw it: without the fix
            # that round protects a mixed S + 1; with it, node `late` drops
            # its old S + 1 as soon as a new incarnation's restore is announced.
            node = late % a.nodes
            if not waiter.until(lambda: all(p.poll() is not None or committed(log, S + 1) for p, log, _ in procs)
                                and (f"step {S + 1} protected" in mesh.text() or
                                     f"node {node}: job {JOB}: a new incarnation rewound it" in mesh.text()),
                                procs=pp):
                fail(f"late rank: the other ranks did not commit step {S + 1}")
            procs += start_trainers(a, mesh, logdir, "late2", S + 3, [late])
            restored = set()
            for p, log, err in procs:
                if p.wait() != 0:
                    fail(f"late rank: trainer exited {p.returncode}; see {err}")
                restored.add(restored_of(log))
            if restored != {S}:
                fail(f"late rank: ranks restored {sorted(restored, key=str)}, expected step {S} (rank {late} "
                     f"alone on node {node} reconnected last holding the dead incarnation's step {S + 1})")
            print(f"late rank: rank {late} reconnected last; every rank restored {S}, not the mixed {S + 1}")
        # A job's directories removed under the running mesh (an operator's
        # rm -rf): no daemon may keep its slot or parity files mapped, or
        # their pages would be memory no budget counts (store/slotmap.c, protect.c
        # drop such mappings every round).
        def mapped(job):
            return [f for f in mapped_store_files(mesh) if f"/{job}/" in f]
        procs = start_trainers(a, mesh, logdir, "sweep", 4, env_over={"SNAP_JOB": "sweep"})
        for p, _, err in procs:
            if p.wait() != 0:
                fail(f"sweep: trainer exited {p.returncode}; see {err}")
        done = re.compile(r"job sweep step 4 protected")
        if not waiter.until(lambda: len(done.findall(mesh.text())) >= a.nodes):
            fail(f"sweep: step 4 of job sweep was not protected on every node; see {mesh.log}")
        before = mapped("sweep")
        if not any("/ec/" in f for f in before) or not any("/slot-" in f for f in before):
            fail(f"sweep: the daemons map none of job sweep's slot or parity files: {before}")
        for n in range(a.nodes):
            shutil.rmtree(os.path.join(mesh.root(n), "sweep"))
        # each daemon logs "dropped N mapping(s)" after it unmapped them:
        # the log's growth wakes the waiter (60 s: the failure verdict only)
        if not waiter.until(lambda: not mapped("sweep"), limit=60):
            fail(f"sweep: 60 s after job sweep's directories were removed, still mapped: {mapped('sweep')[:3]}")
        print(f"sweep: {len(before)} mappings of job sweep's files dropped after its directories were removed")
        if a.final_loss:
            mesh.kill()
            g = groups[0]
            lost = g[: a.m + 1]
            survivors = {n: tree_md5(mesh.root(n)) for n in range(a.nodes) if n not in lost}
            for n in lost:
                shutil.rmtree(mesh.root(n))
            mesh.start(os.path.join(logdir, "final.log"))
            after = {n: tree_md5(mesh.root(n)) for n in survivors}
            for n in survivors:
                if after[n] != survivors[n]:
                    fail(f"M+1 loss: surviving node {n}'s store changed")
            procs = start_trainers(a, mesh, logdir, "final", 1)
            for p, _, _ in procs:
                p.wait()
            text = mesh.text()
            names = ",".join(str(x) for x in lost)
            if f"group 0 (nodes {g[0]}-{g[-1]}" not in text or f"lost nodes {names}" not in text:
                fail(f"M+1 loss: no error naming group 0 and lost nodes {names}; see {mesh.log}")
            for r, (p, log, err) in enumerate(procs):
                with open(err) as f:
                    e = f.read()
                if p.returncode != 1 or "cannot be rebuilt" not in e:
                    fail(f"M+1 loss: trainer rank {r} exited {p.returncode} without the clear error: {e!r}")
            print(f"final: lost {names} of group 0 -> refused clearly, survivors untouched")
        rc = mesh.stop() if mesh.proc else 0
        if mesh.sanitizer_errors():
            fail(f"sanitizer report in {mesh.log}")
        if rc != 0:
            fail(f"mesh exited {rc} on SIGTERM")
    finally:
        mesh.kill()
    if failures:
        print(f"mesh_trials: {len(failures)} failures (seed {seed}); logs in {logdir}")
        return 1
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(logdir, ignore_errors=True)
    print("mesh_trials: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
