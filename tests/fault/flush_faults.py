#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Persistence under faults, with real snapsmp, trainer, snaptool, h5py:

1. SIGKILL snapsmp at random moments while it flushes (>= 50 trials): no
   partially written step is ever listed as persisted, every listed step
   verifies, the newest persisted step never goes backwards, and with the
   node store wiped the job restores the newest persisted step bit-exact.
   Odd trials flush with LZ4 (its chunks go through io_uring while HDF5
   builds the file), even ones uncompressed; the restores from disk come
   after odd trials.
2. h5py reads a flushed file; values equal the trainer's state bit-exact.
3. A flipped byte, a truncated file, a missing file in the newest persisted
   step: restore refuses with the file and dataset named; with
   SNAP_ALLOW_OLDER=1 it falls back to the older persisted step.
4. A full flush directory: the flush fails with a clear error, snapsmp keeps
   serving, nothing in memory is lost.
5. Codecs (SNAP_CODEC_PARAM/OPTIM): the flushed frames are smaller on disk,
   verify, and read back through the reader plugin with h5py and h5dump:
   lossless bit-exact, lossy within its bound; with the store wiped the job
   restores from disk within the bounds.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

from events import Waiter, strike_within, wait_socket
from checks import Checks

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from skiprule import Skips, can_mount  # noqa: E402

BUILD = sys.argv[1]
TRIALS = int(sys.argv[2]) if len(sys.argv) > 2 else 50
# usage: flush_faults.py BUILD [TRIALS] [--seed S] (S replays a run's kills)
SEED = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--seed" else None
SMP = os.path.join(BUILD, "smp", "snapsmp")
TRAINER = os.path.join(BUILD, "integration", "trainer")
SNAPTOOL = os.path.join(BUILD, "tools", "snaptool")
BASE = f"/dev/shm/snaptest-flush-{os.getpid()}"
DISK = f"/tmp/snaptest-flush-{os.getpid()}"
# Our codec-frame reader plugin, and Debian's (LZ4 filter 32004).
PLUGINS = f"{os.path.join(BUILD, 'io', 'plugin')}:/usr/lib/x86_64-linux-gnu/hdf5/serial/plugins"
check = Checks()   # counts the checks, prints each failure
skips = Skips()
# Decided before any case runs, from the capability: with it, a failing
# mount is a failure of the case.
MOUNT = skips.optional("full flush directory", "CAP_SYS_ADMIN to mount a tmpfs", can_mount())


def env(store, flush, **extra):
    e = dict(os.environ, SNAP_STORE=store, SNAP_FLUSH_DIR=flush, SNAP_JOB="fj", SNAP_WORLD_SIZE="2",
             SNAP_TIMEOUT_MS="60000", HDF5_PLUGIN_PATH=PLUGINS)  # for hangs only
    e.update(extra)
    return e


def start_smp(store, flush, *extra, **kw):
    p = subprocess.Popen([SMP, "--store", store, "--flush-dir", flush, "--quiet", *extra],
                         env=env(store, flush, **kw), stderr=subprocess.PIPE, text=True)
    wait_socket(store, p)
    return p


def run_job(store, flush, *args, **kw):
    """Both ranks of one launch (SNAP_LAUNCH), started at once; see
    store_faults.run_job."""
    size = kw.pop("size", "2M")
    kw.setdefault("SNAP_LAUNCH", f"flush_faults-{os.getpid()}-{time.monotonic_ns()}")
    ps = [subprocess.Popen([TRAINER, "--bytes", size, *args],
                           env=env(store, flush, SNAP_RANK=str(r), **kw), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for r in range(2)]
    return [(p.wait(timeout=300), *p.communicate()) for p in ps]


def snaptool(store, flush, *args):
    return subprocess.run([SNAPTOOL, *args], env=env(store, flush), capture_output=True, text=True, timeout=120)


def persisted(store, flush):
    out = snaptool(store, flush, "status", "--json").stdout
    try:
        jobs = json.loads(out)["jobs"]
    except (ValueError, KeyError):
        return []
    return next((j["persisted"] for j in jobs if j["job"] == "fj"), [])


def newest_flush_started(flush):
    """The newest step whose flush has begun (its step directory exists), or 0."""
    try:
        names = os.listdir(os.path.join(flush, "fj"))
    except FileNotFoundError:
        return 0
    steps = [int(n[5:]) for n in names if n.startswith("step-") and n[5:].isdigit()]
    return max(steps, default=0)


def flush_dirs(flush):
    """What a flush changes: the job directory (step directories appear)
    and each step directory (its MANIFEST is renamed in last)."""
    job = os.path.join(flush, "fj")
    try:
        return [flush, job] + [os.path.join(job, n) for n in os.listdir(job) if n.startswith("step-")]
    except FileNotFoundError:
        return [flush]


def sealed(flush, step):
    return os.path.exists(os.path.join(flush, "fj", f"step-{step}", "MANIFEST"))


def test_kill_mid_flush(rng):
    store, flush = f"{BASE}/kill", f"{DISK}/kill"
    newest_seen, restores = 0, 0
    for t in range(TRIALS):
        smp = start_smp(store, flush, "--flush-every", "1", "--flush-keep", "2",
                        "--flush-codec", "lz4" if t % 2 else "none")
        base = max(newest_seen, newest_flush_started(flush))   # leftovers of killed flushes too
        ps = [subprocess.Popen([TRAINER, "--bytes", "4M", "--steps", "1000000", "--resume", "--quiet"],
                               env=env(store, flush, SNAP_RANK=str(r)), stderr=subprocess.DEVNULL)
              for r in range(2)]
        # Never race the clock: watch one flush of a new step from its start
        # (its directory appears) to its seal (MANIFEST), so every trial
        # persists a step on any machine and build; then wait for the next
        # flush to begin and kill within the time the watched one took.
        waiter = Waiter()
        dirs = lambda: flush_dirs(flush)
        s1 = waiter.until(lambda: newest_flush_started(flush) > base and newest_flush_started(flush),
                          dirs=dirs, procs=[smp])
        t0 = time.monotonic()
        ok = s1 and waiter.until(lambda: sealed(flush, s1), dirs=dirs, procs=[smp])
        took = time.monotonic() - t0
        ok = ok and waiter.until(lambda: newest_flush_started(flush) > s1, dirs=dirs, procs=[smp])
        waiter.close()
        check(bool(ok), f"trial {t}: the awaited flushes did not happen within 120 s")
        strike_within(rng, took)
        smp.send_signal(signal.SIGKILL)
        smp.wait()
        for p in ps:
            p.send_signal(signal.SIGKILL)
            p.wait()
        steps = persisted(store, flush)
        for s in steps:
            v = snaptool(store, flush, "verify", str(s))
            check("persisted copy in" in v.stdout and "CORRUPT" not in v.stdout,
                  f"trial {t}: persisted step {s} verifies: {v.stdout} {v.stderr}")
        if steps:
            check(steps[0] >= newest_seen, f"trial {t}: newest persisted went from {newest_seen} to {steps[0]}")
            newest_seen = steps[0]
        if t % 10 == 9 and steps:
            # The node store is lost: restore must come from the newest persisted step.
            shutil.rmtree(store)
            smp = start_smp(store, flush)
            res = run_job(store, flush, "--resume", "--steps", "0", size="4M")
            smp.terminate()
            smp.wait()
            ok = all(rc == 0 and f"restored step {steps[0]} (verified bit-exact)" in out for rc, out, _ in res)
            check(ok, f"trial {t}: restore from disk of step {steps[0]}: {res}")
            restores += 1
    print(f"kill mid-flush: {TRIALS} trials, newest persisted step {newest_seen}, {restores} restores from disk")
    check(newest_seen > 0, "some step got persisted across the trials")


def fill_expected(rank, region, step, nbytes):
    """The trainer's deterministic state (trainer.c fill()), as bytes: one
    splitmix64 value per 8 bytes, or for its f32 regions (0 and 1) one per
    float, mapped to +-0.05 with a special value every 997 floats."""
    import numpy as np
    m64 = (1 << 64) - 1
    x = ((rank << 40) ^ (region << 32) ^ step) & m64
    f32 = region in (0, 1)
    n = nbytes // 4 if f32 else nbytes // 8
    z = (x + 0x9e3779b97f4a7c15 * np.arange(1, n + 1, dtype=np.uint64)).astype(np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
        z = z ^ (z >> np.uint64(31))
    if not f32:
        return z.astype("<u8").tobytes()
    hi = (z >> np.uint64(32)).astype(np.uint32).view(np.int32).astype(np.float64)
    v = (hi * (0.05 / 2147483648.0)).astype(np.float32)
    special = np.array([np.nan, np.inf, -3e38, 1e-42], dtype=np.float32)
    k = np.arange(n)
    pick = k % 997 == 996
    v[pick] = special[(z[pick] & np.uint64(3)).astype(np.int64)]
    return v.astype("<f4").tobytes()


def test_h5py_and_damage():
    store, flush = f"{BASE}/dmg", f"{DISK}/dmg"
    smp = start_smp(store, flush, "--flush-every", "2", "--flush-keep", "3")
    res = run_job(store, flush, "--steps", "4")
    check(all(r[0] == 0 for r in res), "the job runs 4 steps")
    f = snaptool(store, flush, "flush")
    check(f.returncode == 0, f"snaptool flush: {f.stdout} {f.stderr}")
    smp.terminate()
    smp.wait()
    check(persisted(store, flush)[:2] == [4, 2], f"steps 4 and 2 persisted: {persisted(store, flush)}")

    # A bit flip in the node store after the commit is never persisted.
    shutil.rmtree(f"{flush}/fj/step-4")          # make flushing step 4 needed again
    smp = start_smp(store, flush, "--scrub-rate", "0")   # the scrub would withdraw the flipped step first
    insp = snaptool(store, flush, "inspect", "4").stdout
    slot = [l for l in insp.splitlines() if l.startswith("job fj step 4 rank 1/")][0].split(" slot ")[1].split(":")[0]
    path = f"{store}/fj/rank-00001/slot-{slot}"
    with open(path, "r+b") as fh:
        fh.seek(4096 + 77)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0x20]))
    f = snaptool(store, flush, "flush", "4")
    check(f.returncode == 1 and "model.weight" in f.stderr and "CRC32C" in f.stderr,
          f"a corrupt slot is refused by the flush, naming the region: {f.stderr}")
    check(4 not in persisted(store, flush), "the corrupt step is not listed as persisted")
    with open(path, "r+b") as fh:               # repair, flush again
        fh.seek(4096 + 77)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0x20]))
    f = snaptool(store, flush, "flush", "4")
    check(f.returncode == 0, f"after repair the flush succeeds: {f.stderr}")
    smp.terminate()
    smp.wait()

    import h5py
    with h5py.File(f"{flush}/fj/step-4/rank-1.h5", "r") as h:
        w = h["model.weight"]
        got = w[()].tobytes()
        check(got == fill_expected(1, 0, 4, len(got)), "h5py reads model.weight of rank 1 bit-exact")
        check(w.dtype.str == "<f4" and w.attrs["kind"] in (b"param", "param", 0), f"dtype/kind attrs: {dict(w.attrs)}")
    d = subprocess.run(["h5dump", "-H", f"{flush}/fj/step-4/rank-0.h5"], capture_output=True, text=True)
    check(d.returncode == 0 and "model.weight" in d.stdout, "h5dump reads the flushed file")

    def restore(**kw):
        shutil.rmtree(store, ignore_errors=True)
        smp = start_smp(store, flush, **kw)
        res = run_job(store, flush, "--resume", "--steps", "0")
        smp.terminate()
        _, err = smp.communicate()
        return res, err

    rank0 = f"{flush}/fj/step-4/rank-0.h5"
    saved = open(rank0, "rb").read()
    with h5py.File(rank0, "r") as h:
        off = h["optim.exp_avg"].id.get_offset()
    with open(rank0, "r+b") as fh:   # flip a byte inside a dataset's data
        fh.seek(off + 1000)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 1]))
    res, err = restore()
    msg = " ".join(r[2] for r in res)
    check(all(r[0] != 0 for r in res) and "rank-0.h5" in msg and "SNAP_ALLOW_OLDER" in msg,
          f"flipped byte: restore refuses, naming the file: {msg}")
    res, err = restore(SNAP_ALLOW_OLDER="1")
    check(all(r[0] == 0 and "restored step 2 (verified" in r[1] for r in res),
          f"with SNAP_ALLOW_OLDER=1, step 2 is restored: {res}")

    open(rank0, "wb").write(saved[: len(saved) // 2])   # truncated
    res, _ = restore()
    msg = " ".join(r[2] for r in res)
    check(all(r[0] != 0 for r in res) and "rank-0.h5" in msg, f"truncated file: clear error: {msg}")
    os.unlink(rank0)                                     # missing
    res, _ = restore()
    msg = " ".join(r[2] for r in res)
    check(all(r[0] != 0 for r in res) and "rank-0" in msg, f"missing file: clear error: {msg}")
    open(rank0, "wb").write(saved)
    res, _ = restore()
    check(all(r[0] == 0 and "restored step 4 (verified" in r[1] for r in res), "repaired: step 4 restores")


def test_codec_readers():
    import h5py
    import numpy as np
    store, flush = f"{BASE}/codec", f"{DISK}/codec"
    codecs = dict(SNAP_CODEC_PARAM="lossless", SNAP_CODEC_OPTIM="abs:1e-3")
    smp = start_smp(store, flush)
    res = run_job(store, flush, "--steps", "4", size="4M", **codecs)
    check(all(r[0] == 0 for r in res), f"the job runs 4 steps with codecs: {res}")
    f = snaptool(store, flush, "flush", "4")
    check(f.returncode == 0, f"snaptool flush of codec frames: {f.stderr}")
    insp = snaptool(store, flush, "inspect", "4").stdout
    check("codec=lossless" in insp and "codec=abs:0.001" in insp, f"inspect names the codecs: {insp}")
    smp.terminate()
    smp.wait()
    v = snaptool(store, flush, "verify", "4")
    check(v.returncode == 0, f"snaptool verify of the codec step: {v.stdout}")
    with h5py.File(f"{flush}/fj/step-4/rank-1.h5", "r") as h:
        w, m = h["model.weight"], h["optim.exp_avg"]
        got = w[()].tobytes()
        check(got == fill_expected(1, 0, 4, len(got)), "h5py + plugin reads lossless model.weight bit-exact")
        want = np.frombuffer(fill_expected(1, 1, 4, m.shape[0] * 4), dtype="<f4")
        have = m[()]
        fin = np.isfinite(want)
        err = np.abs(want[fin].astype(np.float64) - have[fin].astype(np.float64)).max()
        check(0 < err <= 1e-3 and np.array_equal(want[~fin].view("<u4"), have[~fin].view("<u4")),
              f"h5py + plugin reads lossy optim.exp_avg within 1e-3, non-finite exact (max err {err})")
        stored = w.id.get_storage_size() + m.id.get_storage_size()
        check(stored < 0.6 * (w.size + m.size) * 4, f"frames are smaller on disk: {stored} bytes")
    d = subprocess.run(["h5dump", "-d", "model.weight", "-c", "4", f"{flush}/fj/step-4/rank-0.h5"],
                       capture_output=True, text=True, env=env(store, flush))
    check(d.returncode == 0 and "DATA" in d.stdout, f"h5dump + plugin reads a frame dataset: {d.stderr}")
    shutil.rmtree(store)
    smp = start_smp(store, flush)
    res = run_job(store, flush, "--resume", "--steps", "5", size="4M", **codecs)
    check(all(r[0] == 0 and "restored step 4 (verified within the codec bounds)" in r[1] for r in res),
          f"restore from disk with the store wiped, within the bounds: {res}")
    smp.terminate()
    smp.wait()


def test_full_flush_dir():
    probe = f"{BASE}/mnt"
    os.makedirs(probe, exist_ok=True)
    if not MOUNT:
        return
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3M", "tmpfs", probe], capture_output=True, text=True)
    if not check(m.returncode == 0, f"full flush directory: mount of a 3 MiB tmpfs failed: {m.stderr.strip()}"):
        return
    try:
        store = f"{BASE}/full-store"
        smp = start_smp(store, probe)
        res = run_job(store, probe, "--steps", "2", size="4M")
        check(all(r[0] == 0 for r in res), "the job runs while the flush directory is too small")
        f = snaptool(store, probe, "flush")
        check(f.returncode == 1 and ("No space" in f.stderr or "full" in f.stderr or "space" in f.stderr),
              f"a full flush directory gives a clear error: {f.stderr}")
        res = run_job(store, probe, "--resume", "--steps", "3", size="4M")
        check(all(r[0] == 0 and "restored step 2" in r[1] for r in res), "memory snapshots are unharmed")
        smp.terminate()
        smp.wait()
        check(persisted(store, probe) == [], "nothing half-written is listed as persisted")
    finally:
        subprocess.run(["umount", probe])


def test_flush_modes():
    """Issue 10 item 6: the flush used 0755/0644 (umask 022) and 0666 rank
    files under umask 0. Checkpoints hold a model's weights: 0700/0600 by
    default, or SNAP_FLUSH_MODE, whatever the umask."""
    for umask, mode, want_file, want_dir in ((0, None, 0o600, 0o700), (0o022, None, 0o600, 0o700),
                                             (0o077, "0640", 0o640, 0o750)):
        name = f"modes-{umask:o}-{mode}"
        store, flush = f"{BASE}/{name}", f"{DISK}/{name}"
        extra = {"SNAP_FLUSH_MODE": mode} if mode else {}
        old = os.umask(umask)
        try:
            smp = start_smp(store, flush, "--slots", "2", **extra)
        finally:
            os.umask(old)
        # 3 steps over 2 slots: rank 0 cannot finish before rank 1 connects
        # (which would start a new generation and withdraw rank 0's steps).
        res = run_job(store, flush, "--steps", "3")
        check(all(rc == 0 for rc, _, _ in res), f"{name}: the job runs")
        out = snaptool(store, flush, "flush", "--job", "fj")
        check(out.returncode == 0, f"{name}: snaptool flush: {out.stderr}")
        smp.terminate()
        smp.communicate(timeout=60)
        seen = []
        for root, dirs, files in os.walk(flush):
            for d in dirs:
                seen.append((os.path.join(root, d), want_dir))
            for f in files:
                seen.append((os.path.join(root, f), want_file))
        check(any(p.endswith(".h5") for p, _ in seen) and any(p.endswith("MANIFEST") for p, _ in seen),
              f"{name}: a step was persisted: {seen}")
        for path, want in seen:
            got = os.stat(path).st_mode & 0o777
            check(got == want, f"{name}: {path} has mode {got:o}, expected {want:o}")
        check(os.stat(flush).st_mode & 0o777 == want_dir, f"{name}: the flush directory itself")


def test_lost_manifest():
    """Issue 10 item 7: deleting the newest persisted step's MANIFEST made a
    restore from disk use the older persisted step silently. Its rank files
    are evidence of a loss: name the step, and require SNAP_ALLOW_OLDER.
    The same for snaptool recover when a rank file of it is truncated."""
    store, flush = f"{BASE}/lostman", f"{DISK}/lostman"
    smp = start_smp(store, flush, "--flush-every", "1", "--slots", "2")
    res = run_job(store, flush, "--steps", "4")
    check(all(rc == 0 for rc, _, _ in res), "lost MANIFEST: the job runs")
    out = snaptool(store, flush, "flush", "4", "--job", "fj")
    smp.terminate()
    smp.communicate(timeout=60)
    steps = persisted(store, flush)
    check(out.returncode == 0 and len(steps) >= 2 and steps[0] == 4, f"lost MANIFEST: steps persisted: {steps}")
    older = steps[1] if len(steps) > 1 else None
    shutil.rmtree(store)
    # A truncated rank file of the sealed step: snaptool recover offered the
    # older step as if step 4 had never been persisted; restore from disk
    # refuses it (below), so recover must name it too.
    rank0 = f"{flush}/fj/step-4/rank-0.h5"
    shutil.copy(rank0, rank0 + ".keep")
    os.truncate(rank0, os.path.getsize(rank0) // 2)
    rec = snaptool(store, flush, "recover")
    check(rec.returncode == 3 and "step 4 is damaged" in rec.stderr and "rank-0.h5" in rec.stderr,
          f"truncated rank file: snaptool recover names step 4 and does not offer step {older}: {rec.returncode} "
          f"{rec.stdout!r} {rec.stderr!r}")
    os.replace(rank0 + ".keep", rank0)
    os.unlink(f"{flush}/fj/step-4/MANIFEST")
    rec = snaptool(store, flush, "recover")
    check(rec.returncode == 3 and "step 4 has lost its MANIFEST" in rec.stderr,
          f"lost MANIFEST: snaptool recover names step 4 and does not offer step {older}: {rec.returncode} "
          f"{rec.stdout!r} {rec.stderr!r}")
    smp = start_smp(store, flush)
    res = run_job(store, flush, "--resume", "--steps", "0")
    smp.terminate()
    smp.communicate(timeout=60)
    check(all(rc == 3 and "step 4 has lost its MANIFEST" in err and "SNAP_ALLOW_OLDER" in err
              for rc, _, err in res), f"lost MANIFEST: restore from disk refuses, naming step 4: {res}")
    shutil.rmtree(store)
    smp = start_smp(store, flush, "--allow-older")
    res = run_job(store, flush, "--resume", "--steps", "0")
    _, log = smp.communicate(timeout=60) if smp.terminate() is None else (None, "")
    check(all(rc == 0 and f"restored step {older} " in out for rc, out, _ in res),
          f"lost MANIFEST: with SNAP_ALLOW_OLDER the older step {older} restores: {res}")


def main():
    os.environ["HDF5_PLUGIN_PATH"] = PLUGINS   # before h5py loads HDF5
    seed = SEED if SEED is not None else random.randrange(1 << 30)
    replay = f"replay: {sys.argv[0]} {BUILD} {TRIALS} --seed {seed}"
    print(f"flush_faults: seed {seed}\n{replay}", flush=True)
    shutil.rmtree(BASE, ignore_errors=True)
    shutil.rmtree(DISK, ignore_errors=True)
    os.makedirs(BASE)
    try:
        test_kill_mid_flush(random.Random(seed))
        test_h5py_and_damage()
        test_codec_readers()
        test_full_flush_dir()
        test_flush_modes()
        test_lost_manifest()
    finally:
        shutil.rmtree(BASE, ignore_errors=True)
        if not check.failed:
            shutil.rmtree(DISK, ignore_errors=True)
    if check.failed:
        print(replay)
    print(f"{check.passed} passed, {check.failed} failed, {skips.summary()}")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
