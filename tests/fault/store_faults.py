#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Bad input to a node store, with real snapsmp, trainer and snaptool
processes: a flipped byte in a chunk, a truncated slot file, a corrupted or
missing manifest, a region-size mismatch at restore, and store roots that are
read-only or full. Each must give a clear error naming what is wrong, and
leave every other committed snapshot restorable."""
import json
import os
import shutil
import subprocess
import sys
import time

from events import wait_socket
from checks import Checks

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from skiprule import Skips, can_mount, is_root  # noqa: E402

BUILD = sys.argv[1]
SMP = os.path.join(BUILD, "smp", "snapsmp")
TRAINER = os.path.join(BUILD, "integration", "trainer")
SNAPTOOL = os.path.join(BUILD, "tools", "snaptool")
BASE = f"/dev/shm/snaptest-faults-{os.getpid()}"
check = Checks()   # counts the checks, prints each failure
skips = Skips()
# Decided before any case runs, from what this process has: with it, a
# failing mount or setuid is a failure of the case.
MOUNT = skips.optional("read-only/full store roots", "CAP_SYS_ADMIN to mount a tmpfs", can_mount())
ROOT = skips.optional("foreign uid", "root, to run snaptool as another user", is_root())
# One generous deadline for ranks that wait on each other, for hangs only;
# each process's own deadline is longer still.
WAIT_MS = "60000"


class Smp:
    def __init__(self, store, *extra):
        self.store = store
        # No background scrub: these trials damage the store and restore at once.
        self.p = subprocess.Popen([SMP, "--store", store, "--scrub-rate", "0", *extra], stderr=subprocess.PIPE,
                                  text=True)
        wait_socket(store, self.p)

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
        _, err = self.p.communicate(timeout=10)
        return self.p.returncode, err


def trainer(store, rank, *args, world=2, job="j", size="1M", **extra):
    env = dict(os.environ, SNAP_STORE=store, SNAP_JOB=job, SNAP_RANK=str(rank), SNAP_WORLD_SIZE=str(world),
               SNAP_TIMEOUT_MS=WAIT_MS, **extra)
    return subprocess.run([TRAINER, "--bytes", size, *args], env=env, capture_output=True, text=True, timeout=300)


def run_job(store, *args, world=2, **kw):
    """All ranks of one launch (SNAP_LAUNCH), started at once. They do not
    wait for each other, so on a loaded machine one may finish before the
    next connects: the launch keeps them one incarnation."""
    launch = f"store_faults-{os.getpid()}-{time.monotonic_ns()}"
    env = lambda r: dict(os.environ, SNAP_STORE=store, SNAP_JOB=kw.get("job", "j"), SNAP_RANK=str(r),
                         SNAP_WORLD_SIZE=str(world), SNAP_TIMEOUT_MS=WAIT_MS, SNAP_LAUNCH=launch)
    ps = [subprocess.Popen([TRAINER, "--bytes", kw.get("size", "1M"), *args], env=env(r), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for r in range(world)]
    return [(p.wait(timeout=300), *p.communicate()) for p in ps]


def snaptool(store, *args):
    env = dict(os.environ, SNAP_STORE=store, SNAP_JOB="j")
    return subprocess.run([SNAPTOOL, *args], env=env, capture_output=True, text=True, timeout=60)


def slot_of(store, rank, step):
    """Path of the slot file holding `step` for `rank`, via snaptool inspect."""
    p = snaptool(store, "inspect", str(step))
    out = p.stdout + p.stderr
    for line in out.splitlines():
        if line.startswith(f"job j step {step} rank {rank}/"):
            slot = line.split(" slot ")[1].split(":")[0]
            return os.path.join(store, "j", f"rank-{rank:05d}", f"slot-{slot}")
    raise RuntimeError(f"step {step} rank {rank} not in store:\n{out}")


def fresh(name):
    store = os.path.join(BASE, name)
    smp = Smp(store)
    res = run_job(store, "--steps", "3")
    check(all(rc == 0 for rc, _, _ in res), f"{name}: the job runs 3 steps")
    return store, smp


def flip(path, off):
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x10]))


def test_corrupt_chunk():
    store, smp = fresh("chunk")
    flip(slot_of(store, 1, 3), 4096 + 1000)
    v = snaptool(store, "verify", "3")
    check(v.returncode == 3 and "rank 1: region \"model.weight\" chunk 0: CRC32C mismatch" in v.stdout,
          f"verify names the corrupt chunk: {v.stdout}")
    check(snaptool(store, "verify", "2").returncode == 0, "verify of step 2 passes")
    # No flush directory: no other level holds step 3. An explicit step never falls back.
    r1 = trainer(store, 1, "--restore-step", "3", "--steps", "3")
    check(r1.returncode == 3 and "model.weight" in r1.stderr and "CRC32C" in r1.stderr and
          "no level holds a good copy" in r1.stderr,
          f"restore of step 3 refuses the corrupt step, naming region and chunk: {r1.stderr}")
    # That withdrew step 3 of rank 1: the newest restorable step is 2 (docs/self-healing.md).
    r1 = trainer(store, 1, "--resume", "--steps", "3")
    check(r1.returncode == 0 and "restored step 2 (verified" in r1.stdout,
          f"--resume then restores step 2: {r1.stdout} {r1.stderr}")
    res = run_job(store, "--restore-step", "2", "--steps", "2")
    check(all(rc == 0 and "restored step 2 (verified" in out for rc, out, _ in res), "step 2 still restores")
    _, err = smp.stop()
    check("withdrew step 3" in err and "damaged beyond repair" in err, f"snapsmp withdrew step 3 of rank 1: {err}")


def test_truncated_slot():
    store, smp = fresh("trunc")
    path = slot_of(store, 0, 3)
    os.truncate(path, 4096)
    r0 = trainer(store, 0, "--resume", "--steps", "3")
    check(r0.returncode == 0 and "restored step 2" in r0.stdout and "truncated" in r0.stdout,
          f"restore falls back past the truncated slot and says so: {r0.stdout} {r0.stderr}")
    _, err = smp.stop()
    check("truncated" in err, f"snapsmp says why it withdrew step 3: {err}")
    smp = Smp(store)
    res = run_job(store, "--resume", "--steps", "2")
    check(all(rc == 0 and "restored step 2 (verified" in out for rc, out, _ in res),
          "after a restart, step 2 is the newest restorable")
    smp.stop()


def test_manifest_damage():
    store, smp = fresh("manifest")
    smp.stop()
    man = slot_of(store, 0, 3) + ".man"
    flip(man, 40)
    os.unlink(slot_of(store, 1, 2) + ".man")  # rank 1's step 2: missing manifest
    smp = Smp(store)
    st = snaptool(store, "status")
    check("newest restorable step none" in st.stdout, f"no step is complete now: {st.stdout}")
    res = run_job(store, "--resume", "--steps", "1")
    check(all(rc == 0 and "starting fresh" in out for rc, out, _ in res),
          "with step 3 (corrupt manifest) and step 2 (missing) incomplete, nothing is restored")
    _, err = smp.stop()
    check("checksum mismatch" in err, f"snapsmp names the corrupt manifest: {err}")


def test_size_mismatch():
    store, smp = fresh("mismatch")
    r = trainer(store, 0, "--resume", "--steps", "3", size="2M")
    check(r.returncode == 1 and "region \"model.weight\": registered as" in r.stderr,
          f"restore with another region size names the region: {r.stderr}")
    res = run_job(store, "--resume", "--steps", "3")
    check(all(rc == 0 and "restored step 3 (verified" in out for rc, out, _ in res),
          "the snapshot is intact for a matching layout")
    smp.stop()


def test_read_only_and_full_roots():
    if not MOUNT:
        return
    ro = os.path.join(BASE, "ro")
    os.makedirs(ro)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4M,ro", "tmpfs", ro], check=True)
    try:
        p = subprocess.run([SMP, "--store", os.path.join(ro, "store")], capture_output=True, text=True, timeout=10)
        check(p.returncode == 1 and "Read-only file system" in p.stderr,
              f"read-only root: clear error: {p.stderr}")
    finally:
        subprocess.run(["umount", ro])

    full = os.path.join(BASE, "full")
    os.makedirs(full)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3M", "tmpfs", full], check=True)
    try:
        store = os.path.join(full, "store")
        smp = Smp(store)
        small = run_job(store, "--steps", "2", world=1, job="small", size="256K")
        check(small[0][0] == 0, "a small job fits")
        big = trainer(store, 0, "--steps", "2", world=1, job="big", size="2M")
        # REGISTER counts the budget, the files are reserved in the background: the big job
        # fails at the ACQUIRE that cannot reserve its slot, or at the COMMIT whose manifest
        # no longer fits; "is full" either way.
        check(big.returncode == 1 and "is full" in big.stderr, f"full store: clear error: {big.stderr}")
        print(f"full store, as expected: {big.stderr.strip().splitlines()[-1:]}")
        again = run_job(store, "--resume", "--steps", "2", world=1, job="small", size="256K")
        check(again[0][0] == 0 and "restored step 2" in again[0][1], "the small job's snapshot survives")
        smp.stop()
    finally:
        subprocess.run(["umount", full])


def test_snaptool_usage():
    """Issue 10 item 2: inspect without a STEP crashed (strtoull(NULL)): usage, exit 2, like verify."""
    store = os.path.join(BASE, "usage")
    for args in (["inspect"], ["inspect", "--store", store], ["verify"], ["verify", "--store", store]):
        p = snaptool(store, *args)
        check(p.returncode == 2 and "usage: snaptool" in p.stderr,
              f"snaptool {' '.join(args)}: usage and exit 2, got {p.returncode}: {p.stderr!r}")


def within(secs, argv, **kw):
    """Run argv; None if it did not finish in `secs` (a hang), else the CompletedProcess."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=secs, **kw)
    except subprocess.TimeoutExpired:
        return None


def test_fifo_in_store_and_flush_dir():
    """Issue 10 item 4: a FIFO where a manifest (or a rank file) belongs hung
    snaptool status/ls/inspect/recover and snapsmp's start. Now it is skipped
    with a message, and the rest of the store is served."""
    store, flush = os.path.join(BASE, "fifo"), os.path.join(BASE, "fifo-disk")
    # Two slots keep the ranks in step: with three, rank 0 could finish before
    # rank 1 connects, and rank 1 would then start a new generation.
    smp = Smp(store, "--flush-dir", flush, "--flush-every", "1", "--slots", "2")
    res = run_job(store, "--steps", "3")
    check(all(rc == 0 for rc, _, _ in res), "fifo: the job runs 3 steps")
    smp.stop()
    # Step 3 is persisted; plant FIFOs: rank 0's other manifest, a newer step's
    # MANIFEST, and the persisted step's rank-1 file.
    slot3 = slot_of(store, 0, 3)
    other = slot3[:-1] + ("0" if slot3.endswith("1") else "1")
    os.replace(other + ".man", other + ".man.bak") if os.path.exists(other + ".man") else None
    os.mkfifo(other + ".man")
    os.makedirs(os.path.join(flush, "j", "step-9"))
    os.mkfifo(os.path.join(flush, "j", "step-9", "MANIFEST"))
    os.makedirs(os.path.join(flush, "j", "step-10"))
    os.symlink(os.path.join(flush, "j", "step-3", "MANIFEST"), os.path.join(flush, "j", "step-10", "MANIFEST"))
    for cmd in (["status", "--flush-dir", flush], ["ls"], ["inspect", "3"], ["verify", "3"],
                ["recover", "--flush-dir", flush]):
        p = within(20, [SNAPTOOL, *cmd, "--store", store],
                   env=dict(os.environ, SNAP_JOB="j"))
        check(p is not None, f"fifo: snaptool {cmd[0]} finishes")
        if p is not None:
            check(p.returncode == 0 and "not a regular file" in p.stderr,
                  f"fifo: snaptool {cmd[0]} exit 0 and says what it skipped: {p.returncode} {p.stderr!r}")
    # Step 10's MANIFEST (a link) is damage, as restore from disk says below: recover offers
    # the disk's step 3 only with --allow-older, and the node store's step 3 either way.
    p = within(20, [SNAPTOOL, "recover", "--store", store, "--flush-dir", flush, "--json"],
               env=dict(os.environ, SNAP_JOB="j"))
    check(p is not None and '"store_step":3' in p.stdout and '"persisted_step":null' in p.stdout and
          "step 10 is damaged" in p.stderr,
          f"fifo: recover finds step 3 in memory and names step 10 damaged: {p and (p.stdout, p.stderr)!r}")
    p = within(20, [SNAPTOOL, "recover", "--store", store, "--flush-dir", flush, "--json", "--allow-older"],
               env=dict(os.environ, SNAP_JOB="j"))
    check(p is not None and '"store_step":3' in p.stdout and '"persisted_step":3' in p.stdout,
          f"fifo: recover --allow-older finds step 3 in memory and on disk: {p and p.stdout!r}")
    # Two slots and two steps keep the ranks in step again: rank 0 cannot
    # save step 5 before rank 1 has committed 4. With one step, rank 0 could
    # finish and disconnect before rank 1 connects; rank 1 would then be a
    # new incarnation, and its restore would withdraw rank 0's step 4.
    smp = Smp(store, "--flush-dir", flush, "--slots", "2")
    check(smp.p.poll() is None and os.path.exists(os.path.join(store, "smp.sock")), "fifo: snapsmp starts and serves")
    again = run_job(store, "--resume", "--steps", "5")
    check(all(rc == 0 and "restored step 3" in out for rc, out, _ in again),
          f"fifo: the job restores step 3: {again}")
    _, err = smp.stop()
    mid_err = err
    check("not a regular file" in err, "fifo: snapsmp says what it skipped")
    # The flush directory alone (node store gone): restore from disk must not
    # hang on them. Newer step directories whose MANIFEST is not a file are
    # damaged steps: refused by name, and used only with --allow-older.
    shutil.rmtree(store)
    smp = Smp(store, "--flush-dir", flush)
    again = run_job(store, "--resume", "--steps", "4")
    check(all(rc == 3 and "not a regular file" in err for rc, _, err in again),
          f"fifo: restore from disk names the non-file MANIFEST: {again}")
    smp.stop()
    smp = Smp(store, "--flush-dir", flush, "--allow-older")
    again = run_job(store, "--resume", "--steps", "5")
    # (step 5 was persisted when the previous snapsmp stopped: SIGTERM flushes)
    check(all(rc == 0 and "restored step 5" in out for rc, out, _ in again),
          f"fifo: with --allow-older, restore from disk next to FIFOs gives step 5: {again}; the snapsmp "
          f"that should have flushed it said {mid_err!r}; this one said {smp.stop()[1]!r}")


def test_foreign_uid():
    """Issue 10 item 5: a user who cannot read the store was told NOTHING IS
    RECOVERABLE (recover, exit 3), and status/ls showed an empty store (exit 0)."""
    store, flush = os.path.join(BASE, "perm"), os.path.join(BASE, "perm-disk")
    if not ROOT:
        return
    smp = Smp(store, "--flush-dir", flush, "--flush-every", "1", "--slots", "2")
    res = run_job(store, "--steps", "3")
    check(all(rc == 0 for rc, _, _ in res), "perm: the job runs")
    smp.stop()
    os.chmod(BASE, 0o755)
    os.chmod(flush, 0o700)

    def as_nobody():
        os.setgid(65534)
        os.setuid(65534)
    for cmd in (["status"], ["ls"], ["recover"], ["recover", "--flush-dir", flush]):
        p = within(20, [SNAPTOOL, *cmd, "--store", store], env=dict(os.environ, SNAP_JOB="j"),
                   preexec_fn=as_nobody)
        check(p is not None and p.returncode == 1 and "ermission denied" in p.stderr and store in p.stderr
              and "NOTHING IS RECOVERABLE" not in p.stdout,
              f"perm: snaptool {' '.join(cmd)} as another uid: a permission error naming the store, exit 1: "
              f"{p and p.returncode} {p and p.stderr!r} {p and p.stdout!r}")
    os.chmod(store, 0o755)   # the store readable, the flush directory not
    p = within(20, [SNAPTOOL, "recover", "--store", os.path.join(BASE, "nostore"), "--flush-dir", flush],
               env=dict(os.environ, SNAP_JOB="j"), preexec_fn=as_nobody)
    check(p is not None and p.returncode == 1 and "ermission denied" in p.stderr and flush in p.stderr,
          f"perm: recover with an unreadable flush directory: exit 1 naming it: {p and p.returncode} "
          f"{p and p.stderr!r}")


def test_status_budget():
    """Issue 10 item 8: snaptool status printed its own default budget, not
    the running daemon's --mem-limit. It asks the daemon, or says it cannot."""
    store = os.path.join(BASE, "budget")
    smp = Smp(store, "--mem-limit", "7M")
    p = snaptool(store, "status", "--store", store)
    check(p.returncode == 0 and "against its budget of 7.0 MiB (--mem-limit)" in p.stdout, f"budget: the daemon's: {p.stdout!r}")
    p = snaptool(store, "status", "--store", store, "--json")
    check(p.returncode == 0 and json.loads(p.stdout)["mem_limit"] == 7 << 20, f"budget: json: {p.stdout!r}")
    smp.stop()
    p = snaptool(store, "status", "--store", store)
    check(p.returncode == 0 and "budget is unknown" in p.stdout, f"budget: no daemon: {p.stdout!r}")


def test_launch():
    """A rank that starts after its peers ran and exited (CI: a loaded
    machine ran rank 0's whole job before rank 1 connected). Without a
    launch snapsmp takes it for a relaunch and its restore withdraws rank
    0's steps; with the same SNAP_LAUNCH it joins rank 0's incarnation."""
    for name, launch in (("guess", None), ("launch", "run-1")):
        store = os.path.join(BASE, name)
        smp = Smp(store)
        extra = {"SNAP_LAUNCH": launch} if launch else {}
        r0 = trainer(store, 0, "--steps", "2", **extra)
        r1 = trainer(store, 1, "--steps", "2", **extra)
        check(r0.returncode == 0 and r1.returncode == 0, f"launch {name}: ranks 0 then 1 run: {r0.stderr}{r1.stderr}")
        ok = "restored step 2" in trainer(store, 0, "--resume", "--steps", "2", SNAP_LAUNCH="run-2").stdout
        _, log = smp.stop()
        if launch:
            check(ok and "joins generation 1 of its launch run-1" in log,
                  f"launch: rank 1 of the same launch joined rank 0's incarnation: {log[-1500:]}")
        else:
            check(not ok and "withdrew step 2" in log, f"launch: without one rank 1 starts anew: {log[-1500:]}")
    bad = trainer(os.path.join(BASE, "launch"), 0, "--steps", "1", SNAP_LAUNCH="a\tb")
    check(bad.returncode != 0 and "SNAP_LAUNCH" in bad.stderr, f"launch: a control character is refused: {bad.stderr}")


def main():
    shutil.rmtree(BASE, ignore_errors=True)
    os.makedirs(BASE)
    try:
        for t in (test_corrupt_chunk, test_truncated_slot, test_manifest_damage, test_size_mismatch,
                  test_read_only_and_full_roots, test_snaptool_usage, test_fifo_in_store_and_flush_dir,
                  test_foreign_uid, test_status_budget, test_launch):
            t()
    finally:
        shutil.rmtree(BASE, ignore_errors=True)
    print(f"{check.passed} passed, {check.failed} failed, {skips.summary()}")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
