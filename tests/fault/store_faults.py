#!/usr/bin/python3
"""Bad input to a node store, with real snapsmp, trainer and snaptool
processes: a flipped byte in a chunk, a truncated slot file, a corrupted or
missing manifest, a region-size mismatch at restore, and store roots that are
read-only or full. Each must give a clear error naming what is wrong, and
leave every other committed snapshot restorable."""
import glob
import os
import shutil
import subprocess
import sys
import time

BUILD = sys.argv[1]
SMP = os.path.join(BUILD, "smp", "snapsmp")
TRAINER = os.path.join(BUILD, "integration", "trainer")
SNAPTOOL = os.path.join(BUILD, "tools", "snaptool")
BASE = f"/dev/shm/snaptest-faults-{os.getpid()}"
failures = 0
passed = 0


def check(cond, what):
    global failures, passed
    if cond:
        passed += 1
    else:
        failures += 1
        print(f"FAILED: {what}")


class Smp:
    def __init__(self, store, *extra):
        self.store = store
        self.p = subprocess.Popen([SMP, "--store", store, *extra], stderr=subprocess.PIPE, text=True)
        sock = os.path.join(store, "smp.sock")
        deadline = time.time() + 10
        while not os.path.exists(sock):
            if self.p.poll() is not None or time.time() > deadline:
                break
            time.sleep(0.005)

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
        _, err = self.p.communicate(timeout=10)
        return self.p.returncode, err


def trainer(store, rank, *args, world=2, job="j", size="1M"):
    env = dict(os.environ, SNAP_STORE=store, SNAP_JOB=job, SNAP_RANK=str(rank), SNAP_WORLD_SIZE=str(world),
               SNAP_TIMEOUT_MS="2000")
    return subprocess.run([TRAINER, "--bytes", size, *args], env=env, capture_output=True, text=True, timeout=60)


def run_job(store, *args, world=2, **kw):
    """All ranks at once (they wait for each other's commits)."""
    env = lambda r: dict(os.environ, SNAP_STORE=store, SNAP_JOB=kw.get("job", "j"), SNAP_RANK=str(r),
                         SNAP_WORLD_SIZE=str(world), SNAP_TIMEOUT_MS="3000")
    ps = [subprocess.Popen([TRAINER, "--bytes", kw.get("size", "1M"), *args], env=env(r), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for r in range(world)]
    return [(p.wait(timeout=60), *p.communicate()) for p in ps]


def snaptool(store, *args):
    env = dict(os.environ, SNAP_STORE=store, SNAP_JOB="j")
    return subprocess.run([SNAPTOOL, *args], env=env, capture_output=True, text=True, timeout=60)


def slot_of(store, rank, step):
    """Path of the slot file holding `step` for `rank`, via snaptool inspect."""
    out = snaptool(store, "inspect", str(step)).stdout
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
    r1 = trainer(store, 1, "--resume", "--steps", "3")
    check(r1.returncode == 3 and "model.weight" in r1.stderr and "CRC32C" in r1.stderr,
          f"restore refuses the corrupt step, naming region and chunk: {r1.stderr}")
    res = run_job(store, "--restore-step", "2", "--steps", "2")
    check(all(rc == 0 and "restored step 2 (verified" in out for rc, out, _ in res), "step 2 still restores")
    smp.stop()


def test_truncated_slot():
    store, smp = fresh("trunc")
    path = slot_of(store, 0, 3)
    os.truncate(path, 4096)
    r0 = trainer(store, 0, "--resume", "--steps", "3")
    check(r0.returncode != 0 and "truncated" in r0.stderr, f"restore reports the truncated slot: {r0.stderr}")
    _, err = smp.stop()
    smp = Smp(store)   # the restart scan discards it
    res = run_job(store, "--resume", "--steps", "2")
    check(all(rc == 0 and "restored step 2 (verified" in out for rc, out, _ in res),
          "after a restart, step 2 is the newest restorable")
    _, err = smp.stop()
    check("truncated" in err, f"snapsmp says why it discarded step 3: {err}")


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


def can_mount():
    probe = os.path.join(BASE, "probe")
    os.makedirs(probe, exist_ok=True)
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", probe], capture_output=True).returncode == 0
    if ok:
        subprocess.run(["umount", probe])
    return ok


def test_read_only_and_full_roots():
    if not can_mount():
        print("SKIP read-only/full store roots: mount is not permitted here")
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
        check(big.returncode == 1 and "is full" in big.stderr, f"full store: clear error: {big.stderr}")
        again = run_job(store, "--resume", "--steps", "2", world=1, job="small", size="256K")
        check(again[0][0] == 0 and "restored step 2" in again[0][1], "the small job's snapshot survives")
        smp.stop()
    finally:
        subprocess.run(["umount", full])


def main():
    shutil.rmtree(BASE, ignore_errors=True)
    os.makedirs(BASE)
    try:
        for t in (test_corrupt_chunk, test_truncated_slot, test_manifest_damage, test_size_mismatch,
                  test_read_only_and_full_roots):
            t()
    finally:
        shutil.rmtree(BASE, ignore_errors=True)
    print(f"{passed} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
