#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Self-healing on an erasure-coded mesh (docs/self-healing.md): corruption
trials with real processes, `mpirun -np 6 snapsmp --ec 4+2`, one trainer
rank per node, and (in about half the trials) the mesh's flush directory.

A job saves STEPS steps; the newest is protected (its parity on every node)
and persisted. Each trial starts the mesh on a pristine copy of the stores
(and of the flush directory, when the trial has that level), damages them
once every node serves (random bit flips, zeroed 4 KiB pages, truncated or
deleted slot files and parity files of the newest step, on one node or
several), and relaunches the trainers with --resume; each checks every
restored byte against the step it reports (exit 3 on a wrong byte).

The oracle is computed here, independently of ec/, from the placement rules
(ec/README.md: node i's segment t feeds stripe (i - m - t) mod n, its parity
row p is of stripe (i - p) mod n; a piece is one chunk of a segment): the
pieces whose bytes differ from the pristine copy (a missing byte reads as
zero) are erasures.

  - every (stripe, chunk) has at most m erasures: every rank restores the
    newest step, bit-exact; a rank whose slot was damaged says its chunks
    were "repaired from parity", and afterwards every node's slot and
    parity files of that step are the pristine bytes again (the repair
    rewrote damaged parity pieces too);
  - more than m, with the flush: the newest step, repaired from the flush;
  - more than m, no flush: a rank whose slot was damaged restores an older
    step, bit-exact, and says it fell back; the others the newest or that.

Never a wrong byte, never a failed restore. Usage:
mesh_heal.py --build DIR [--trials N] [--seed S] [--mpiexec P]."""
import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from damage import damage_file  # noqa: E402
from events import Waiter  # noqa: E402
from mesh_trials import JOB, Mesh, man_step, restored_of, setup  # noqa: E402

STEPS = 4
EC_CHUNK = 256 << 10   # ec/'s default chunk: the unit a CRC covers


def trainers(a, mesh, logdir, tag, last):
    launch = f"{tag}-{os.getpid()}-{time.monotonic_ns()}"
    procs = []
    for r in range(a.world):
        env = dict(os.environ, SNAP_STORE=mesh.root(r % a.nodes), SNAP_JOB=JOB, SNAP_RANK=str(r),
                   SNAP_LAUNCH=launch, SNAP_WORLD_SIZE=str(a.world), SNAP_TIMEOUT_MS="30000",
                   SNAP_COPY_THREADS="1", SNAP_SLOTS="3", SNAP_CHUNK_SIZE="32768")
        log = os.path.join(logdir, f"{tag}-r{r}.log")
        out = open(os.path.join(logdir, f"{tag}-r{r}.out"), "w")
        procs.append((subprocess.Popen([a.trainer, "--steps", str(last), "--bytes", a.bytes, "--resume",
                                        "--log", log], env=env, stdout=out, stderr=subprocess.STDOUT),
                      log, out.name))
        out.close()
    return procs


def slot_of(root, rank, step):
    d = os.path.join(root, JOB, f"rank-{rank:05d}")
    for f in sorted(os.listdir(d)):
        if f.endswith(".man") and man_step(os.path.join(d, f)) == step:
            return os.path.join(d, f[:-4])
    return None


def read_padded(path, size):
    try:
        with open(path, "rb") as f:
            b = f.read(size)
    except FileNotFoundError:
        b = b""
    return b + bytes(size - len(b))


class Layout:
    """The step's pieces on each node, from the pristine files."""

    def __init__(self, a, pristine):
        self.a, self.n, self.k, self.m = a, a.nodes, a.k, a.m
        self.slot, self.man, self.data, self.par, self.rec = {}, {}, {}, {}, {}
        for i in range(self.n):
            root = os.path.join(pristine, f"node{i}")
            sp = slot_of(root, i, STEPS)
            if sp is None:
                raise RuntimeError(f"node {i} holds no slot of step {STEPS}")
            self.slot[i] = os.path.relpath(sp, root)
            self.man[i] = open(sp + ".man", "rb").read()
            self.data[i] = self.man[i] + open(sp, "rb").read()
            self.par[i] = open(os.path.join(root, JOB, "ec", f"step-{STEPS}.parity"), "rb").read()
            self.rec[i] = open(os.path.join(root, self.rec_path()), "rb").read()
        self.seg = -(-max(len(d) for d in self.data.values()) // self.k)
        for i in range(self.n):   # the model must be ec/'s: its parity files have m * seg bytes
            if len(self.par[i]) != self.m * self.seg:
                raise RuntimeError(f"node {i}: parity of {len(self.par[i])} bytes, the model says "
                                   f"{self.m} x {self.seg}")

    @staticmethod
    def rec_path():
        return os.path.join(JOB, "ec", f"step-{STEPS}.rec")

    def file_of(self, i, what):
        """Node i's file of the step, relative to its store: "slot", "man" (the
        slot's manifest, the head of the node's data blob), "parity", "rec"
        (its erasure-coding record: the CRC32C of every piece)."""
        return {"slot": self.slot[i], "man": self.slot[i] + ".man", "rec": self.rec_path(),
                "parity": os.path.join(JOB, "ec", f"step-{STEPS}.parity")}[what]

    def pieces(self, blob, base):
        """(offset, length) of each chunk of each segment or row of blob."""
        for t in range(len(blob) // self.seg if base == "parity" else self.k):
            for q in range(0, self.seg, EC_CHUNK):
                yield t, q // EC_CHUNK, t * self.seg + q, min(EC_CHUNK, self.seg - q)

    def erasures(self, root_of):
        """{(stripe, chunk): count} of the pieces that differ from the pristine ones."""
        cnt = {}
        for i in range(self.n):
            root = root_of(i)
            d = (read_padded(os.path.join(root, self.file_of(i, "man")), len(self.man[i])) +
                 read_padded(os.path.join(root, self.slot[i]), len(self.data[i]) - len(self.man[i])))
            p = read_padded(os.path.join(root, JOB, "ec", f"step-{STEPS}.parity"), len(self.par[i]))
            # A record that is not the pristine one: its CRCs cannot vouch for
            # any of the node's pieces, so every one of them is an erasure.
            lost = read_padded(os.path.join(root, self.rec_path()), len(self.rec[i]) + 1) != self.rec[i] + b"\0"
            if lost:
                d, p = b"", b""
            for t, q, off, ln in self.pieces(self.data[i], "data"):
                a, b = self.data[i][off:off + ln], d[off:off + ln]
                if lost or a.ljust(ln, b"\0") != b.ljust(ln, b"\0"):
                    s = (i - self.m - t) % self.n
                    cnt[(s, q)] = cnt.get((s, q), 0) + 1
            for r, q, off, ln in self.pieces(self.par[i], "parity"):
                if lost or self.par[i][off:off + ln] != p[off:off + ln]:
                    s = (i - r) % self.n
                    cnt[(s, q)] = cnt.get((s, q), 0) + 1
        return cnt


def scrub_check(a, rng, mesh, lay, pristine, run, logdir, waiter, fail):
    """The scrub on an idle mesh: a bit flipped in one node's slot and one in
    another node's parity file are found and repaired from parity (waiting on
    the daemons' log lines, one generous deadline for a hang); the files are
    the pristine bytes again."""
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(pristine, run, symlinks=True)
    mesh.extra = ["--scrub-rate", "4M"]
    mesh.start(os.path.join(logdir, "scrub.log"))
    i, j = rng.sample(range(a.nodes), 2)
    sp = os.path.join(mesh.root(i), lay.slot[i])
    pp = os.path.join(mesh.root(j), JOB, "ec", f"step-{STEPS}.parity")
    slot_line = re.compile(rf"job {JOB} rank {i} step {STEPS} \(scrub\): \d+ bad chunks repaired from parity")
    # One at a time: the repair of a slot rebuilds every bad piece of the
    # group, a parity piece found bad at the same moment included.
    damage_file(rng, pp, "flip", rng.randint(1, 3))
    ok = waiter.until(lambda: re.search(rf"scrub: job {JOB} step {STEPS}: parity row \d+ chunk \d+ repaired from "
                                        rf"parity", mesh.text()) or mesh.proc.poll() is not None, limit=120)
    if ok and mesh.proc.poll() is None:
        damage_file(rng, sp, "flip", rng.randint(1, 3))
        ok = waiter.until(lambda: slot_line.search(mesh.text()) or mesh.proc.poll() is not None, limit=120)
    if not ok or mesh.proc.poll() is not None:
        fail(f"scrub: the flipped bits in node {i}'s slot and node {j}'s parity were not repaired; see {mesh.log}")
    elif (open(sp, "rb").read() != lay.data[i][len(lay.man[i]):] or open(pp, "rb").read() != lay.par[j]):
        fail(f"scrub: node {i}'s slot or node {j}'s parity differs from the pristine bytes after the repair")
    else:
        print(f"scrub: a flipped bit in node {i}'s slot and one in node {j}'s parity repaired from parity",
              flush=True)
    mesh.kill()


def verify_repair_check(a, rng, mesh, lay, pristine, run, logdir, fail):
    """snaptool verify --repair --json against one node of the mesh: its
    truncated slot of the protected step comes back from parity."""
    import json
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(pristine, run, symlinks=True)
    mesh.extra = ["--scrub-rate", "0"]
    mesh.start(os.path.join(logdir, "verify.log"))
    i = rng.randrange(a.nodes)
    sp = os.path.join(mesh.root(i), lay.slot[i])
    os.truncate(sp, 1000)
    tool = os.path.join(a.build, "tools", "snaptool")
    r = subprocess.run([tool, "verify", str(STEPS), "--repair", "--json", "--store", mesh.root(i), "--job", JOB],
                       capture_output=True, text=True, timeout=120)
    try:
        rep = json.loads(r.stdout).get("repair") or {}
    except ValueError:
        rep = {}
    if (rep.get("mended_files") != 1 or not rep.get("repaired_chunks") or
            rep.get("repaired_chunks") != rep.get("bad_chunks") or "from parity" not in rep.get("how", "") or
            rep.get("repaired_from_parity") != rep.get("repaired_chunks") or rep.get("repaired_from_flush") != 0):
        fail(f"verify --repair on node {i}: {r.returncode} {r.stdout[-800:]} {r.stderr[-400:]}")
    elif open(sp, "rb").read() != lay.data[i][len(lay.man[i]):]:
        fail(f"verify --repair on node {i}: the slot differs from the pristine bytes")
    else:
        print(f"verify --repair: node {i}'s truncated slot repaired from parity "
              f"({rep['repaired_chunks']} chunks)", flush=True)
        # The text summary names the level the daemon counted, not the flush.
        os.truncate(sp, 1000)
        r = subprocess.run([tool, "verify", str(STEPS), "--repair", "--store", mesh.root(i), "--job", JOB],
                           capture_output=True, text=True, timeout=120)
        head = r.stdout.splitlines()[0] if r.stdout else ""
        # (exit 3: this node's store holds one rank of the step, "incomplete")
        if f"{rep['repaired_chunks']} repaired from parity," not in head:
            fail(f"verify --repair (text) on node {i}: {r.returncode} {head!r} {r.stderr[-400:]}")
    mesh.kill()


def give_up_check(a, rng, mesh, lay, pristine, run, logdir, waiter, fail):
    """The scrub meets damage no level can repair (the slot files of M+1
    neighbouring nodes deleted, no flush): each copy is given up and reported once, not
    again on every pass (counted through snaptool status --json)."""
    import json
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(pristine, run, symlinks=True)
    mesh.extra = ["--scrub-rate", "64M"]
    mesh.start(os.path.join(logdir, "giveup.log"))
    # M+1 neighbours: the stripe whose parity rows sit just past them has
    # M+1 of its data pieces there (each stripe spans the n nodes once); M+1
    # nodes picked at random can leave every stripe within M (e.g. 1, 3, 5).
    first = rng.randrange(a.nodes)
    lost = [(first + d) % a.nodes for d in range(a.m + 1)]
    for i in lost:
        os.unlink(os.path.join(mesh.root(i), lay.slot[i]))
    gave = re.compile(rf"job {JOB} rank (\d+) step {STEPS}: damaged beyond repair \(scrub\)")
    if not waiter.until(lambda: len(gave.findall(mesh.text())) >= len(lost) or mesh.proc.poll() is not None,
                        limit=120) or mesh.proc.poll() is not None:
        fail(f"give-up: the scrub did not give up the copies of nodes {lost}; see {mesh.log}")
        mesh.kill()
        return
    tool = os.path.join(a.build, "tools", "snaptool")

    def passes():
        p = subprocess.run([tool, "status", "--json", "--store", mesh.root(lost[0])], capture_output=True, text=True)
        try:
            return json.loads(p.stdout).get("scrub_passes") or 0
        except ValueError:
            return 0
    # Three more passes over the node's store (a count the daemon reports;
    # each status call is a round trip, no timer), then the log is compared.
    first, deadline = passes(), time.monotonic() + 60
    while passes() < first + 3 and time.monotonic() < deadline and mesh.proc.poll() is None:
        pass
    got = sorted(int(r) for r in gave.findall(mesh.text()))
    if got != sorted(lost) or passes() < first + 3:
        fail(f"give-up: copies given up {got} (expected {sorted(lost)} once each), scrub passes {first} -> "
             f"{passes()}; see {mesh.log}")
    else:
        print(f"give-up: the copies of nodes {sorted(lost)} given up once each by the scrub, not again in 3 "
              f"more passes", flush=True)
    # The mesh view shows each node store's damage record, as status does one store's.
    pat = os.path.join(mesh.base, "node%n")
    view = subprocess.run([tool, "status", "--nodes", str(a.nodes), "--store", pat, "--job", JOB, "--json"],
                          capture_output=True, text=True)
    text = subprocess.run([tool, "status", "--nodes", str(a.nodes), "--store", pat, "--job", JOB],
                          capture_output=True, text=True)
    try:
        dmg = json.loads(view.stdout).get("damage")
    except ValueError:
        dmg = None
    want = {(i, f"rank {i} step {STEPS}") for i in lost}   # one trainer rank per node
    got = {(d.get("node"), d.get("what")) for d in dmg or []}
    lines = [ln for ln in text.stdout.splitlines() if "last damage beyond repair (recorded in the store)" in ln]
    if view.returncode != 0 or not want <= got or len(lines) != len(lost) or not all(
            ln.startswith(f"node{i}: ") for i, ln in zip(sorted(lost), lines)):
        fail(f"status --nodes: damage records {sorted(got)} (expected {sorted(want)}), text lines {lines}; "
             f"{view.stderr[-400:]}")
    else:
        print(f"status --nodes: the damage records of nodes {sorted(lost)} shown (text and --json)", flush=True)
    mesh.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--seed", type=int, default=34)
    ap.add_argument("--shape", default="4+2")
    ap.add_argument("--nodes", type=int, default=6)
    ap.add_argument("--bytes", default="96K")
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    a = ap.parse_args()
    a.world = a.nodes   # rank r on node r
    base, logdir = setup(a, "snaptest-meshheal")
    rng = random.Random(a.seed)
    run, pristine, flush0 = (os.path.join(base, d) for d in ("run", "pristine", "flush0"))
    flush = os.path.join(base, "flush")
    mesh = Mesh(a, run)
    waiter = Waiter()
    waiter.watch(logdir)
    failures, tally = [], {}

    def fail(msg):
        print("FAIL:", msg, flush=True)
        failures.append(msg)

    def protected(step):
        return len(re.findall(rf"job {JOB} step {step} protected", mesh.text()))

    try:
        # ---- baseline: STEPS steps, the newest protected and persisted ----
        mesh.extra = ["--flush-dir", flush0, "--flush-every", "1000", "--scrub-rate", "0"]
        mesh.start(os.path.join(logdir, "base.log"))
        procs = trainers(a, mesh, logdir, "base", STEPS)
        for p, _, out in procs:
            if p.wait(timeout=300) != 0:
                raise RuntimeError(f"baseline trainer exited {p.returncode}; see {out}")
        if not waiter.until(lambda: protected(STEPS) >= a.nodes, limit=120):
            raise RuntimeError(f"step {STEPS} was not protected on every node; see {mesh.log}")
        if mesh.stop() != 0:   # SIGTERM flushes the newest protected step first
            raise RuntimeError(f"the mesh did not stop cleanly; see {mesh.log}")
        if not os.path.exists(os.path.join(flush0, JOB, f"step-{STEPS}", "MANIFEST")):
            raise RuntimeError(f"step {STEPS} was not persisted in {flush0}")
        shutil.copytree(run, pristine, symlinks=True)
        lay = Layout(a, pristine)
        print(f"mesh_heal: {a.shape} over {a.nodes} nodes, step {STEPS}: {len(lay.data[0])} data bytes a node, "
              f"segments of {lay.seg} bytes, trials={a.trials} seed={a.seed}", flush=True)

        for t in range(a.trials):
            shutil.rmtree(run, ignore_errors=True)
            shutil.rmtree(flush, ignore_errors=True)
            shutil.copytree(pristine, run, symlinks=True)
            with_flush = rng.random() < 0.5
            mesh.extra = ["--scrub-rate", "0"]
            if with_flush:
                shutil.copytree(flush0, flush, symlinks=True)
                mesh.extra += ["--flush-dir", flush, "--flush-every", "1000"]
            mesh.start(os.path.join(logdir, f"t{t}.log"))
            # Damage once every node serves: the relaunch's rebuild ran before.
            # Data slots and parity pieces, and what vouches for them: the
            # slot's manifest and the node's erasure-coding record.
            targets = rng.sample([(i, w) for i in range(a.nodes) for w in ("slot", "parity", "man", "rec")],
                                 rng.choice([1, 1, 2, 2, 3, 4, 5]))
            done = []
            for i, w in targets:
                root = mesh.root(i)
                path = os.path.join(root, lay.file_of(i, w))
                how = rng.choice(["flip", "flip", "zero", "truncate", "delete"])
                damage_file(rng, path, how, rng.randint(1, 3) if how == "flip" else 1)
                done.append(f"node {i} {w} {how}")
            cnt = lay.erasures(mesh.root)
            parity_ok = all(c <= a.m for c in cnt.values())
            hit = {i for i in range(a.nodes)
                   if read_padded(os.path.join(mesh.root(i), lay.slot[i]), len(lay.data[i]) - len(lay.man[i]))
                   != lay.data[i][len(lay.man[i]):]}
            what = f"trial {t} ({'flush, ' if with_flush else ''}{', '.join(done)}; erasures {sorted(cnt.items())})"
            procs = trainers(a, mesh, logdir, f"t{t}", STEPS)
            got, outs = {}, {}
            for r, (p, log, out) in enumerate(procs):
                p.wait(timeout=300)
                outs[r] = open(out).read()
                got[r] = restored_of(log) if os.path.exists(log) else None
                if "MISMATCH" in outs[r]:
                    fail(f"WRONG BYTES on rank {r}: {what}: {outs[r][-600:]}")
                elif p.returncode != 0:
                    fail(f"rank {r} exited {p.returncode}: {what}: {outs[r][-600:]}")
            kind = "intact"
            if parity_ok or with_flush:
                for r in range(a.world):
                    if got[r] != STEPS:
                        fail(f"rank {r} restored {got[r]}, expected {STEPS}: {what}: {outs[r][-600:]}")
                    elif r in hit and "repaired" in outs[r] and "repaired meanwhile" not in outs[r]:
                        # ("repaired meanwhile": another rank's repair mended this copy too)
                        # Parity first; beyond m erasures the flush, which may bring a
                        # stripe back within m for the next rank's repair from parity.
                        src = ("from parity",) if parity_ok else ("from the flush", "from parity")
                        if not any(x in outs[r] for x in src):
                            fail(f"rank {r}: the repair does not say {' or '.join(src)!r}: {what}: {outs[r][-600:]}")
                        kind = "parity" if parity_ok else "flush"
                if parity_ok and any("repaired from parity" in o for o in outs.values()):
                    # The repair rewrote every damaged piece, data and parity, on every node.
                    for i in range(a.nodes):
                        root = mesh.root(i)
                        sp = os.path.join(root, lay.slot[i])
                        pp = os.path.join(root, JOB, "ec", f"step-{STEPS}.parity")
                        if not os.path.exists(sp) or open(sp, "rb").read() != lay.data[i][len(lay.man[i]):]:
                            fail(f"node {i}: slot of step {STEPS} not repaired bit-exact: {what}")
                        if not os.path.exists(pp) or open(pp, "rb").read() != lay.par[i]:
                            fail(f"node {i}: parity of step {STEPS} not repaired bit-exact: {what}")
                        for w, want in (("man", lay.man[i]), ("rec", lay.rec[i])):
                            fp = os.path.join(root, lay.file_of(i, w))
                            if not os.path.exists(fp) or open(fp, "rb").read() != want:
                                fail(f"node {i}: {w} of step {STEPS} not repaired bit-exact: {what}")
                if hit and kind == "intact":
                    # A damaged slot whose chunks all still pass (only zeros lost): nothing to say.
                    kind = "unnoticed"
            elif not hit:
                # Only parity pieces damaged: the data restores as it is.
                for r in range(a.world):
                    if got[r] != STEPS:
                        fail(f"rank {r} restored {got[r]}, expected {STEPS}: {what}: {outs[r][-600:]}")
            else:
                kind = "fallback"
                for r in range(a.world):
                    if got[r] is None or got[r] > STEPS:
                        fail(f"rank {r} restored {got[r]}: {what}: {outs[r][-600:]}")
                # A damaged rank that restored the newest step without a repair: its
                # damage missed every chunk (bytes past the last one); the trainer
                # checked every restored byte.
                noticed = [r for r in hit if not (got[r] == STEPS and "repaired" not in outs[r])]
                # The first rank to find its copy beyond repair falls back and says so;
                # once its copy is given up the agreement no longer counts the newest
                # step, and the ranks that ask after that get the older one silently
                # (as on one node, where the copy is withdrawn).
                if noticed and not any(got[r] < STEPS and "fell back to step" in outs[r] for r in noticed):
                    fail(f"no rank says it fell back: {what}: {[outs[r][-300:] for r in sorted(hit)]}")
            tally[kind] = tally.get(kind, 0) + 1
            mesh.kill()
            if mesh.sanitizer_errors():
                fail(f"sanitizer report in {mesh.log}")
        scrub_check(a, rng, mesh, lay, pristine, run, logdir, waiter, fail)
        verify_repair_check(a, rng, mesh, lay, pristine, run, logdir, fail)
        give_up_check(a, rng, mesh, lay, pristine, run, logdir, waiter, fail)
    finally:
        mesh.kill()
        waiter.close()
    print(f"mesh_heal: {a.trials} trials (seed {a.seed}): {tally}; {len(failures)} failures")
    if failures:
        print(f"logs in {logdir}")
        return 1
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(logdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
