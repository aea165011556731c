#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The scrub of captured files (docs/self-healing.md, smp/heal/filescrub.c), with
a real snapsmp and a real preloaded program (python, LD_PRELOAD).

Two files are written under a captured directory and flushed to their real
paths. Then, with snapsmp idle, a bit is flipped in each file's copy in the
node store, and for the second one in its flushed copy on disk too. The
scrub must find both (waiting on the daemon's log lines; one generous
deadline for a hang): the first is repaired from its flushed copy (the
store's bytes equal the written ones again, a preloaded reader reads them),
the second is marked damaged: a preloaded reader gets EIO and a message
naming the chunk, never its bytes, and snaptool status counts it and says
why, also with no daemon running and after a restart (the store's damage
record).

Then the scrub's kept mappings of the captured files' data (filescrub.c):
with more files than the cap (FILES_SCRUB_MAPS, smp/files/files.h), the
daemon never maps more than the cap plus one of them (counted in
/proc/PID/maps after each of three passes, waiting on the metrics file's
rewrite), the same files stay mapped from pass to pass; a kept file
truncated and another replaced behind the daemon (a bit flipped in the
new copy) are both repaired from their flushed copies, and the daemon
lives. Usage: heal_files.py --build BUILD [--asan-runtime SO]."""
import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys

from events import Waiter, wait_socket

ap = argparse.ArgumentParser()
ap.add_argument("--build", required=True)
ap.add_argument("--asan-runtime", default="", help="preloaded before the preload in sanitizer builds")
args = ap.parse_args()
SMP = os.path.join(args.build, "smp", "snapsmp")
TOOL = os.path.join(args.build, "tools", "snaptool")
PRELOAD = os.path.abspath(os.path.join(args.build, "integration", "libsnap_preload.so"))
BASE = f"/dev/shm/snaptest-healfiles-{os.getpid()}"
DISK = f"/tmp/snaptest-healfiles-{os.getpid()}"
STORE, LOG = f"{BASE}/store", f"{BASE}/smp.log"
CHUNK = 64 << 10
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED:", what, flush=True)
    return cond


def env(preload):
    e = dict(os.environ, SNAP_STORE=STORE, SNAP_CAPTURE=DISK, SNAP_JOB="hf", SNAP_TIMEOUT_MS="5000",
             SNAP_CHUNK_SIZE=str(CHUNK), ASAN_OPTIONS="detect_leaks=0")
    e.pop("LD_PRELOAD", None)
    if preload:
        e["LD_PRELOAD"] = ":".join(p for p in (args.asan_runtime, PRELOAD) if p)
    return e


def start_smp(rate, *extra):
    # A SIGKILLed daemon leaves its socket file behind: gone first, so that
    # the wait below is for this daemon's bind, not the old file.
    try:
        os.unlink(os.path.join(STORE, "smp.sock"))
    except FileNotFoundError:
        pass
    p = subprocess.Popen([SMP, "--store", STORE, "--scrub-rate", rate, "--log", LOG, *extra], stderr=subprocess.PIPE,
                         text=True, env=env(False))
    if not wait_socket(STORE, p):
        raise RuntimeError(f"snapsmp did not start: {p.communicate()[1]}")
    return p


def stop_smp(p):
    if p.poll() is None:
        p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)


def log_text():
    return open(LOG, errors="replace").read() if os.path.exists(LOG) else ""


def wait_log(p, pred, what):
    w = Waiter()
    try:
        ok = w.until(lambda: pred(log_text()) or p.poll() is not None, 120, dirs=lambda: [BASE], procs=[p])
    finally:
        w.close()
    return check(ok and p.poll() is None, f"{what} (within 120 s): {log_text()[-3000:]}")


def preloaded(code, *argv):
    return subprocess.run([sys.executable, "-c", code, *argv], env=env(True), capture_output=True, text=True,
                          timeout=120)


def data_file(path):
    """The store's copy of captured file `path`: the data file its manifest names."""
    man = open(f"{STORE}/hf/files/ns{path}", "rb").read()
    return f"{STORE}/hf/files/data/{int.from_bytes(man[24:32], 'little'):016x}"


def flip(path, off):
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x10]))


def status(*extra):
    r = subprocess.run([TOOL, "status", "--store", STORE, *extra], env=env(False), capture_output=True, text=True,
                       timeout=60)
    return r.stdout


def main():
    for d in (BASE, DISK):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    good, bad = f"{DISK}/good.bin", f"{DISK}/bad.bin"
    data = {good: os.urandom(4 * CHUNK + 1000), bad: os.urandom(3 * CHUNK)}
    for path, b in data.items():
        open(f"{path}.src", "wb").write(b)   # outside the store: DISK's real files stay for the copy's check
    p = start_smp("4M")
    try:
        w = preloaded("import sys, shutil\nfor p in sys.argv[1:]: shutil.copyfile(p + '.src', p)", good, bad)
        check(w.returncode == 0, f"the preloaded writer: {w.returncode} {w.stderr}")
        if not wait_log(p, lambda t: all(f"flushed captured file {x}" in t for x in data), "both files flushed"):
            return
        check(os.path.exists(data_file(good)) and os.path.exists(data_file(bad)), "the store holds both files")
        check("scrub: captured file" not in log_text(), f"no damage found before any: {log_text()}")
        flip(data_file(good), CHUNK + 77)          # chunk 1 of good.bin, in node memory
        flip(bad, 2 * CHUNK + 5)                   # bad.bin: its flushed copy first ...
        flip(data_file(bad), 2 * CHUNK + 5)        # ... then node memory: no level holds chunk 2
        if not wait_log(p, lambda t: f"captured file {good} (job hf): chunk 1 repaired from its flushed copy" in t and
                        f"captured file {bad} (job hf) is damaged beyond repair" in t, "the scrub handles both"):
            return
        check(open(data_file(good), "rb").read() == data[good], "good.bin's store copy is whole again")
        r = preloaded("import sys, hashlib; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())", good)
        check(r.returncode == 0 and r.stdout.strip() == hashlib.sha256(data[good]).hexdigest(),
              f"a preloaded reader reads the repaired good.bin, bit-exact: {r.returncode} {r.stderr}")
        r = preloaded("import sys, errno\ntry:\n open(sys.argv[1], 'rb').read()\nexcept OSError as e:\n"
                      " print('errno', e.errno); sys.exit(3)\nprint('served')", bad)
        check(r.returncode == 3 and "errno 5" in r.stdout and "chunk 2 of 3 fails its CRC32C" in r.stderr,
              f"a preloaded reader of the damaged bad.bin gets EIO naming the chunk: {r.returncode} {r.stdout} "
              f"{r.stderr}")
        st = json.loads(status("--json"))
        check(st.get("repaired_chunks") == 1 and st.get("damaged_files") == 1 and
              f"captured file {bad}: chunk 2 of 3" in (st.get("last_damage") or ""),
              f"status --json counts the repair and the damaged file: {st}")
    finally:
        stop_smp(p)
    # Why bad.bin is damaged outlives the daemon: no daemon, then a new one.
    txt = status()
    check(f"last damage beyond repair (recorded in the store): job hf captured file {bad}: chunk 2 of 3" in txt,
          f"with no daemon, status says why bad.bin is damaged: {txt}")
    p = start_smp("0")
    try:
        st = json.loads(status("--json"))
        check(st.get("daemon_pid") and f"captured file {bad}: chunk 2 of 3" in (st.get("last_damage") or ""),
              f"a restarted snapsmp reports why bad.bin is damaged: {st}")
    finally:
        stop_smp(p)
    print(f"captured files: a flipped bit repaired from the flushed copy; a file no level holds intact marked "
          f"damaged (EIO to readers, counted, recorded across a restart); {len(failures)} failures")


MAPS_CAP = 256          # FILES_SCRUB_MAPS (smp/files/files.h)


def maps_checks():
    for d in (BASE, DISK):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    n = MAPS_CAP + 44
    prom = f"{BASE}/smp.prom"
    p = start_smp("64M", "--metrics-file", prom, "--metrics-interval", "1")
    datadir = f"{STORE}/hf/files/data/"

    def mapped():
        """(the data files mapped, the number of their mappings)"""
        with open(f"/proc/{p.pid}/maps") as f:
            lines = [ln.split()[-1] for ln in f if datadir in ln]
        return set(lines), len(lines)

    def passes():
        try:
            m = re.search(r"^libsnap_scrub_passes_total\S* (\S+)$", open(prom).read(), re.M)
        except FileNotFoundError:
            return 0
        return float(m.group(1)) if m else 0

    w = Waiter()
    try:
        code = ("import os, sys\nd = sys.argv[1]\nfor i in range(int(sys.argv[2])):\n"
                " open(f'{d}/f{i:04d}.bin', 'wb').write(os.urandom(8192))")
        r = preloaded(code, DISK, str(n))
        if not check(r.returncode == 0, f"the preloaded writer of {n} files: {r.returncode} {r.stderr}"):
            return
        names = [f"{DISK}/f{i:04d}.bin" for i in range(n)]
        # The events: a pass done (the metrics file's rewrite wakes the waiter); 120 s for a hang only.
        seen = []
        for _ in range(3):
            target = passes() + 1
            if not w.until(lambda: passes() >= target or p.poll() is not None, 120, dirs=lambda: [BASE], procs=[p]) \
                    or p.poll() is not None:
                break
            seen.append(mapped())
        counts = [c for _, c in seen]
        check(len(seen) == 3 and all(MAPS_CAP <= c <= MAPS_CAP + 1 for c in counts) and
              all(c == len(paths) for paths, c in seen),
              f"{n} captured files: the scrub keeps {MAPS_CAP} data files mapped (+ the one under its cursor), each "
              f"once: {counts} mappings after each of 3 passes ({len(seen)} passes seen)")
        kept = seen[0][0] & seen[-1][0] if seen else set()
        check(len(kept) >= MAPS_CAP, f"the same data files stay mapped from pass to pass: {len(kept)} of "
              f"{MAPS_CAP} kept")
        by_data = {data_file(x): x for x in names}
        victims = sorted(x for x in kept if x in by_data)[:2]
        if not check(len(victims) == 2, f"two kept data files to damage: {victims}"):
            return
        cut, replaced = by_data[victims[0]], by_data[victims[1]]
        if not wait_log(p, lambda t: all(f"flushed captured file {x}" in t for x in (cut, replaced)),
                        "both files flushed"):
            return
        good = {x: open(data_file(x), "rb").read() for x in (cut, replaced)}
        os.truncate(data_file(cut), 4096)
        b = bytearray(good[replaced])
        b[100] ^= 0x10
        open(data_file(replaced) + ".new", "wb").write(b)
        os.replace(data_file(replaced) + ".new", data_file(replaced))
        if not wait_log(p, lambda t: all(f"captured file {x} (job hf): chunk 0 repaired from its flushed copy" in t
                                         for x in (cut, replaced)), "both kept files repaired"):
            return
        check(all(open(data_file(x), "rb").read() == good[x] for x in (cut, replaced)),
              "the truncated and the replaced data files hold the committed bytes again")
        check(p.poll() is None, "the daemon lives")
        print(f"captured files: {n} files, {counts} data files mapped after each of 3 passes (cap {MAPS_CAP} + 1), "
              f"{len(kept)} kept across them; a kept file truncated and another replaced behind the scrub both "
              "repaired from their flushed copies")
    finally:
        w.close()
        stop_smp(p)


if __name__ == "__main__":
    try:
        main()
        maps_checks()
    finally:
        shutil.rmtree(BASE, ignore_errors=True)
        shutil.rmtree(DISK, ignore_errors=True)
    sys.exit(1 if failures else 0)
