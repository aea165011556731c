#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Self-healing restore (docs/self-healing.md): corruption trials with real
snapsmp, trainer and HDF5 processes on one node with a flush directory.

A job saves STEPS steps; the node store keeps the newest three, the flush
directory the newest two. Each trial starts snapsmp on a pristine copy of
both, damages them once it serves (random bit flips, zeroed pages,
truncated or deleted slot files and flushed files, in one level or both),
and relaunches the trainer with --resume, which checks every restored byte
against the step it reports. The oracle:

  - some level holds an intact copy of the newest step (its slot file, or
    its flushed file, untouched): the newest step is restored, bit-exact;
    when its slot was damaged in a chunk, the repair is reported;
  - both copies damaged: the newest step (a repair from the parts the flush
    still holds) or the next older one, bit-exact, reported as a fallback;
  - no level holds any step (every slot and flushed file destroyed): a clear
    error, no wrong byte.

Never a wrong byte (the trainer's MISMATCH), never a failed restore where a
good copy existed. Usage: heal_trials.py BUILD [--trials N] [--seed S]."""
import argparse
import re
import json
import os
import random
import shutil
import signal
import subprocess
import sys

from damage import damage_file
from events import Waiter, wait_socket

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("--trials", type=int, default=200)
ap.add_argument("--seed", type=int, default=34)
args = ap.parse_args()
SMP = os.path.join(args.build, "smp", "snapsmp")
TRAINER = os.path.join(args.build, "integration", "trainer")
BASE = f"/dev/shm/snaptest-heal-{os.getpid()}"
STEPS = 4
SIZE = "192K"        # three regions of that size; 64 KiB chunks: several per region
CHUNK = str(64 << 10)
failures = []


def env(store, **extra):
    return dict(os.environ, SNAP_STORE=store, SNAP_JOB="j", SNAP_RANK="0", SNAP_WORLD_SIZE="1",
                SNAP_TIMEOUT_MS="5000", SNAP_CHUNK_SIZE=CHUNK, **extra)


def start_smp(store, flush, *extra):
    # A SIGKILLed daemon leaves its socket file behind: gone first, so that
    # the wait below is for this daemon's bind, not the old file.
    try:
        os.unlink(os.path.join(store, "smp.sock"))
    except FileNotFoundError:
        pass
    p = subprocess.Popen([SMP, "--store", store, "--flush-dir", flush, "--flush-every", "1", "--slots", "3",
                          "--scrub-rate", "0", *extra], stderr=subprocess.PIPE, text=True)
    if not wait_socket(store, p):
        raise RuntimeError(f"snapsmp did not start: {p.communicate()[1]}")
    return p


def stop_smp(p, how=signal.SIGKILL):
    if p.poll() is None:
        p.send_signal(how)
    return p.communicate(timeout=30)[1]


def slot_files(store):
    """step -> slot file path, from the manifests' names (slot-N.man beside slot-N)."""
    d = os.path.join(store, "j", "rank-00000")
    out = {}
    for f in os.listdir(d):
        if f.endswith(".man"):
            out[f[:-4]] = os.path.join(d, f[:-4])
    return out


def baseline():
    """Run the job once; keep pristine copies of the store and flush dir."""
    store, flush = os.path.join(BASE, "store0"), os.path.join(BASE, "flush0")
    p = start_smp(store, flush)
    r = subprocess.run([TRAINER, "--steps", str(STEPS), "--bytes", SIZE], env=env(store), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # SIGTERM flushes the newest step and waits for it: the event that the flush level is complete.
    log = stop_smp(p, signal.SIGTERM)
    steps = sorted(int(d[5:]) for d in os.listdir(os.path.join(flush, "j")) if d.startswith("step-") and
                   os.path.exists(os.path.join(flush, "j", d, "MANIFEST")))
    assert STEPS in steps, f"flushed steps {steps}: {log[-2000:]}"
    tool = os.path.join(args.build, "tools", "snaptool")
    out = subprocess.run([tool, "ls", "--store", store, "--json"], env=env(store), capture_output=True,
                         text=True, timeout=60).stdout
    slots = {e["step"]: e["slot"] for e in json.loads(out) if e["rank"] == 0}
    assert STEPS in slots and len(slots) >= 2, f"store holds {slots}"
    print(f"baseline: node store holds steps {sorted(slots)}, the flush steps {steps}")
    return store, flush, slots, set(steps)


def trial(rng, n, pristine):
    store0, flush0, slots, flushed = pristine
    store, flush = os.path.join(BASE, "store"), os.path.join(BASE, "flush")
    shutil.rmtree(store, ignore_errors=True)
    shutil.rmtree(flush, ignore_errors=True)
    shutil.copytree(store0, store, symlinks=True)
    shutil.copytree(flush0, flush, symlinks=True)
    os.unlink(os.path.join(store, "smp.sock")) if os.path.exists(os.path.join(store, "smp.sock")) else None
    p = start_smp(store, flush)
    rdir = os.path.join(store, "j", "rank-00000")
    slot = lambda s: os.path.join(rdir, f"slot-{slots[s]}")
    h5 = lambda s: os.path.join(flush, "j", f"step-{s}", "rank-0.h5")
    man = lambda s: slot(s) + ".man"                                  # the slot's step manifest
    fman = lambda s: os.path.join(flush, "j", f"step-{s}", "MANIFEST")  # the flushed step's manifest
    kinds = ["flip", "zero", "truncate", "delete"]
    case = rng.choice(["store", "store", "flush", "both", "both-older", "all", "store-man", "flush-man", "both-man"])
    done = []
    if case in ("store-man", "both-man"):
        # The store's manifest of the newest step, read by the next daemon:
        # the running one is SIGKILLed and another scans the store. Not
        # deleted: a slot file without a manifest is a step never committed
        # (a save cut short), no evidence that the store lost one.
        done.append(("store", STEPS, "manifest " + damage_file(rng, man(STEPS), rng.choice(kinds[:3]))))
        stop_smp(p)
        p = start_smp(store, flush)
    if case in ("flush-man", "both-man"):
        done.append(("flush", STEPS, "manifest " + damage_file(rng, fman(STEPS), rng.choice(kinds))))
    if case == "flush-man" and rng.random() < 0.5:   # and the store's data of that step
        done.append(("store", STEPS, damage_file(rng, slot(STEPS), rng.choice(kinds))))
    if case in ("store", "both", "both-older"):
        done.append(("store", STEPS, damage_file(rng, slot(STEPS), rng.choice(kinds))))
    if case in ("flush", "both", "both-older"):
        done.append(("flush", STEPS, damage_file(rng, h5(STEPS), rng.choice(kinds))))
    if case == "both-older":   # the older step too, in the store only: its flush repairs it
        older = sorted(slots)[-2]
        done.append(("store", older, damage_file(rng, slot(older), rng.choice(kinds))))
    if case == "all":          # no level holds any step
        for s in slots:
            damage_file(rng, slot(s), "delete")
        shutil.rmtree(os.path.join(flush, "j"))
        done.append(("all", 0, "delete"))
    r = subprocess.run([TRAINER, "--resume", "--steps", str(STEPS), "--bytes", SIZE], env=env(store),
                       capture_output=True, text=True, timeout=120)
    log = stop_smp(p)
    out = r.stdout + r.stderr
    got = None
    for line in r.stdout.splitlines():
        if "restored step" in line:
            got = int(line.split("restored step ")[1].split()[0])
    what = f"trial {n} ({case}: {done}): rc {r.returncode} {out.strip()!r}"
    if "MISMATCH" in out:
        failures.append(f"WRONG BYTES: {what}")
        return "wrong"
    if case == "all":
        if r.returncode == 0 and got is not None:
            failures.append(f"restored with no copy anywhere: {what}")
        elif r.returncode == 0 and "starting fresh" not in out:
            failures.append(f"no error and no restore: {what}")
        elif r.returncode != 0 and "registered memory" not in out and "nothing" not in out:
            failures.append(f"the error does not say what state the memory is in: {what}")
        return "error" if r.returncode else "fresh"
    # Per step, newest first: a copy untouched at some level restores it for sure; both
    # levels damaged (or only a slot damaged, maybe in bytes no chunk covers) may still.
    allowed = []
    for s in sorted(slots, reverse=True):
        store_hit = any(lvl == "store" and t == s for lvl, t, _ in done)
        flush_hit = any(lvl == "flush" and t == s for lvl, t, _ in done)
        allowed.append(s)
        if not store_hit or (s in flushed and not flush_hit):
            break
    if r.returncode != 0 or got not in allowed:
        failures.append(f"restored {got}, expected one of {allowed} (the last one has an intact copy): "
                        f"{what}\n{log[-1500:]}")
        return "failed"
    # The store's manifest of the newest step discarded at the restart: the
    # restore never met that step; snapsmp's reply says it passed it over,
    # and the trainer's message names both steps.
    if got < STEPS and (f"fell back to step {got}: " not in out or f"step {STEPS} " not in out):
        failures.append(f"fell back without saying so: {what}")
    if got == STEPS and "fell back" in out:
        failures.append(f"restored the newest step but reported a fallback: {what}")
    if got < STEPS:
        return "fallback"
    return "repaired" if "repaired" in out else "intact"


def fresh_copy(pristine, name):
    store0, flush0, slots, flushed = pristine
    store, flush = os.path.join(BASE, f"{name}-store"), os.path.join(BASE, f"{name}-flush")
    shutil.copytree(store0, store, symlinks=True)
    shutil.copytree(flush0, flush, symlinks=True)
    return store, flush, os.path.join(store, "j", "rank-00000")


def flip_at(path, off):
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x04]))


def status_json(store):
    tool = os.path.join(args.build, "tools", "snaptool")
    p = subprocess.run([tool, "status", "--store", store, "--json"], env=env(store), capture_output=True, text=True,
                       timeout=60)
    return json.loads(p.stdout)


def passed_over_checks(pristine):
    """The newest step's store manifest damaged, so the scan of a restarted
    snapsmp discards it: with its flushed copy damaged too (a flipped bit in
    the flushed MANIFEST, or the MANIFEST deleted) the trainer restores the
    older step and is told it fell back from the newest, naming both steps;
    with the flushed copy intact the newest is restored from it, and no
    fallback is reported."""
    slots = pristine[2]
    for flushed in ("flip", "delete", "intact"):
        store, flush, rdir = fresh_copy(pristine, f"over-{flushed}")
        flip_at(os.path.join(rdir, f"slot-{slots[STEPS]}.man"), 40)
        fman = os.path.join(flush, "j", f"step-{STEPS}", "MANIFEST")
        if flushed == "flip":
            flip_at(fman, os.path.getsize(fman) // 2)
        elif flushed == "delete":
            os.unlink(fman)
        p = start_smp(store, flush)
        r = subprocess.run([TRAINER, "--resume", "--steps", str(STEPS), "--bytes", SIZE], env=env(store),
                           capture_output=True, text=True, timeout=120)
        log = stop_smp(p)
        out = r.stdout + r.stderr
        m = re.search(r"restored step (\d+)", r.stdout)
        got = int(m.group(1)) if m else None
        what = f"passed over ({flushed} flushed MANIFEST): rc {r.returncode} {out.strip()!r}"
        if "discarding" not in log:
            failures.append(f"{what}: the restarted snapsmp did not discard the damaged manifest: {log[-1500:]}")
        elif r.returncode != 0 or "MISMATCH" in out:
            failures.append(what)
        elif flushed == "intact":
            if got != STEPS or "fell back" in out:
                failures.append(f"{what}: expected step {STEPS} from the flush, no fallback reported")
            else:
                print(f"passed over: store manifest of step {STEPS} discarded, its flush intact: step {STEPS} "
                      "restored, no fallback reported")
        elif got != STEPS - 1 or not re.search(rf"fell back to step {STEPS - 1}: step {STEPS} was persisted but "
                                               r"neither the node store nor \S+ holds it whole", out):
            failures.append(f"{what}: expected step {STEPS - 1}, reported as a fallback from step {STEPS}")
        else:
            print(f"passed over: store manifest and flushed MANIFEST ({flushed}) of step {STEPS} damaged: "
                  f"{[ln for ln in out.splitlines() if 'fell back' in ln][0]}")


def scrub_checks(pristine):
    """A bit flipped in an idle store: the scrub finds it and repairs it from
    the flush (waiting on the daemon's log line, one generous deadline for a
    hang); a step the flush lacks is withdrawn and status says why."""
    slots, flushed = pristine[2], pristine[3]
    store, flush, rdir = fresh_copy(pristine, "scrub")
    log = os.path.join(BASE, "scrub.log")
    # 200 KiB slots: a pass over the store takes well under a second at 4 MiB/s.
    p = start_smp(store, flush, "--scrub-rate", "4M", "--log", log)
    good = open(os.path.join(rdir, f"slot-{slots[STEPS]}"), "rb").read()
    flip_at(os.path.join(rdir, f"slot-{slots[STEPS]}"), 5000)
    older = max(s for s in slots if s not in flushed)
    flip_at(os.path.join(rdir, f"slot-{slots[older]}"), 5000)
    w = Waiter()
    text = lambda: open(log).read() if os.path.exists(log) else ""
    try:
        ok = w.until(lambda: (f"step {STEPS} (scrub): 1 bad chunks repaired from the flush" in text() and
                              f"withdrew step {older}" in text()) or p.poll() is not None, 60,
                     dirs=lambda: [BASE], procs=[p])
    finally:
        w.close()
    st = status_json(store)
    stop_smp(p)
    if not ok:
        failures.append(f"scrub: the flipped bits were not found and handled within 60 s: {text()[-2000:]}")
        return
    damage_survives(store, flush, older)
    if open(os.path.join(rdir, f"slot-{slots[STEPS]}"), "rb").read() != good:
        failures.append("scrub: the repaired slot differs from the committed bytes")
    if st.get("repaired_chunks") != 1 or st.get("damaged_steps") != 1 or f"step {older}" not in (st.get("last_damage") or ""):
        failures.append(f"scrub: status --json does not count the repair and the damage: {st}")
    print(f"scrub: a flipped bit in step {STEPS} repaired from the flush, step {older} (not flushed) withdrawn; "
          f"status: repaired_chunks={st.get('repaired_chunks')} damaged_steps={st.get('damaged_steps')}")


def scrub_passes(prom):
    """The daemon's pass count, from its metrics file (0 before the first write)."""
    try:
        m = re.search(r"^libsnap_scrub_passes_total\S* (\S+)$", open(prom).read(), re.M)
    except FileNotFoundError:
        return 0
    return float(m.group(1)) if m else 0


def scrub_truncated_checks(pristine):
    """A slot file truncated behind the scrub's kept mapping (after a whole
    pass mapped it): the scrub reads the lost pages under its SIGBUS guard,
    finds the chunks bad and repairs them from the flush; the daemon lives."""
    slots = pristine[2]
    store, flush, rdir = fresh_copy(pristine, "scrubtrunc")
    log = os.path.join(BASE, "scrubtrunc.log")
    prom = os.path.join(BASE, "scrubtrunc.prom")
    p = start_smp(store, flush, "--scrub-rate", "4M", "--log", log, "--metrics-file", prom, "--metrics-interval", "1")
    path = os.path.join(rdir, f"slot-{slots[STEPS]}")
    good = open(path, "rb").read()
    text = lambda: open(log).read() if os.path.exists(log) else ""

    passes = lambda: scrub_passes(prom)
    # The event: a whole pass done (the metrics file's rewrite wakes the
    # waiter); 60 s is for a hang only.
    done = re.compile(rf"step {STEPS} \(scrub\): slot file was truncated[^\n]*?\d+ bad chunks repaired from the flush")
    w = Waiter()
    try:
        w.until(lambda: passes() >= 1 or p.poll() is not None, 60, dirs=lambda: [BASE], procs=[p])
        os.truncate(path, 8192)
        ok = w.until(lambda: done.search(text()) or p.poll() is not None, 60, dirs=lambda: [BASE], procs=[p])
    finally:
        w.close()
    alive = p.poll() is None
    stop_smp(p)
    if not ok or not alive:
        failures.append(f"scrub, truncated slot: not repaired within 60 s (daemon {'alive' if alive else 'dead'}): "
                        f"{text()[-2000:]}")
        return
    if open(path, "rb").read() != good:
        failures.append("scrub, truncated slot: the repaired slot differs from the committed bytes")
    print(f"scrub: a slot truncated behind the scrub's mapping repaired from the flush: {done.search(text()).group(0)}")


def damage_survives(store, flush, older):
    """Why step `older` was withdrawn outlives the daemon that found it: the
    store's record (snap/damage.h), read by snaptool with no daemon running
    and loaded by the next one."""
    tool = os.path.join(args.build, "tools", "snaptool")
    st = status_json(store)
    txt = subprocess.run([tool, "status", "--store", store], env=env(store), capture_output=True, text=True,
                         timeout=60).stdout
    recs = st.get("damage") or []
    if (st.get("daemon_pid") is not None or f"step {older}" not in (st.get("last_damage") or "") or
            not any(r.get("what") == f"rank 0 step {older}" and "no good copy" in r.get("why", "") for r in recs) or
            f"last damage beyond repair (recorded in the store): job j rank 0 step {older}" not in txt):
        failures.append(f"damage record: with no daemon, status does not say why step {older} went: {st} {txt}")
        return
    p = start_smp(store, flush)
    st2 = status_json(store)
    stop_smp(p)
    if f"job j rank 0 step {older}: " not in (st2.get("last_damage") or "") or st2.get("daemon_pid") is None:
        failures.append(f"damage record: a restarted snapsmp does not report why step {older} went: {st2}")
        return
    print(f"damage record: why step {older} was withdrawn survives the daemon's SIGKILL and restart "
          f"({len(recs)} record)")


def scrub_maps_check(pristine):
    """The scrub keeps each committed slot file's mapping from one pass to the
    next (smp/store/slotmap.c: mapping each chunk afresh cost most of its time
    on 4 KiB pages), and drops the mapping of a file replaced behind its back,
    so the old file's pages are not held (event: the metrics file's rewrite
    with a higher pass count; one generous deadline for a hang)."""
    slots = pristine[2]
    store, flush, rdir = fresh_copy(pristine, "maps")
    prom = os.path.join(BASE, "maps.prom")
    p = start_smp(store, flush, "--scrub-rate", "64M", "--metrics-file", prom, "--metrics-interval", "1")
    path = os.path.join(rdir, f"slot-{slots[STEPS]}")
    w = Waiter()

    def maps():
        with open(f"/proc/{p.pid}/maps") as f:
            return [ln.rstrip("\n") for ln in f if rdir in ln]

    def after_passes(n):
        target = scrub_passes(prom) + n
        return bool(w.until(lambda: scrub_passes(prom) >= target or p.poll() is not None, 60,
                            dirs=lambda: [BASE], procs=[p])) and p.poll() is None

    try:
        seen = []
        for _ in range(3):
            if not after_passes(1):
                break
            seen.append(sum(ln.endswith(path) for ln in maps()))
        # Replaced behind the daemon (same bytes, another inode): the old
        # file's mapping goes, the new one is mapped once. And step 3's file
        # deleted: the flush lacks it, the step is withdrawn and the scrub
        # never reads that path again; its mapping goes all the same (the
        # sweep), its pages are not held.
        with open(path, "rb") as f:
            data = f.read()
        with open(path + ".new", "wb") as f:
            f.write(data)
        os.replace(path + ".new", path)
        os.unlink(os.path.join(rdir, f"slot-{slots[3]}"))
        # Each look after a pass (the sweep runs once a second, the metrics
        # file is rewritten once a second): a few passes, not a spin.
        stale, now = None, None
        for _ in range(10):
            if not after_passes(1):
                break
            stale = [ln for ln in maps() if "(deleted)" in ln]
            now = sum(ln.endswith(path) for ln in maps())
            if not stale and now == 1:
                break
    finally:
        w.close()
        stop_smp(p)
    if seen != [1, 1, 1]:
        failures.append(f"scrub maps: slot file {path} mapped {seen} times after each of 3 passes (expected once, "
                        f"kept)")
    elif stale or now != 1:
        failures.append(f"scrub maps: after the slot file was replaced: {stale} still mapped, the new file mapped "
                        f"{now} times")
    else:
        print("scrub maps: each slot file mapped once and kept across passes; a replaced file's mapping dropped")


def verify_repair_checks(pristine):
    """snaptool verify --repair --json asks the daemon to repair the step."""
    slots = pristine[2]
    store, flush, rdir = fresh_copy(pristine, "verify")
    p = start_smp(store, flush)
    os.truncate(os.path.join(rdir, f"slot-{slots[STEPS]}"), 70000)
    tool = os.path.join(args.build, "tools", "snaptool")
    r = subprocess.run([tool, "verify", str(STEPS), "--repair", "--json", "--store", store, "--flush-dir", flush],
                       env=env(store), capture_output=True, text=True, timeout=120)
    # The text summary names the level the chunks came from: the flush here.
    os.truncate(os.path.join(rdir, f"slot-{slots[STEPS]}"), 70000)
    t = subprocess.run([tool, "verify", str(STEPS), "--repair", "--store", store, "--flush-dir", flush],
                       env=env(store), capture_output=True, text=True, timeout=120)
    stop_smp(p)
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        doc = {}
    rep = doc.get("repair") or {}
    head = t.stdout.splitlines()[0] if t.stdout else ""
    if r.returncode != 0 or doc.get("result") != "ok" or rep.get("mended_files") != 1 or not rep.get("repaired_chunks"):
        failures.append(f"verify --repair: {r.returncode} {r.stdout} {r.stderr}")
    elif rep.get("repaired_from_flush") != rep["repaired_chunks"] or rep.get("repaired_from_parity") != 0:
        failures.append(f"verify --repair: the levels counted are not the flush's: {rep}")
    elif t.returncode != 0 or f"{rep['repaired_chunks']} repaired from the flush," not in head:
        failures.append(f"verify --repair (text): {t.returncode} {head!r} {t.stderr}")
    else:
        print(f"verify --repair: a truncated slot mended, {rep['repaired_chunks']} chunks repaired, the step verifies")


def main():
    shutil.rmtree(BASE, ignore_errors=True)
    os.makedirs(BASE)
    rng = random.Random(args.seed)
    tally = {}
    try:
        pristine = baseline()
        for n in range(args.trials):
            k = trial(rng, n, pristine)
            tally[k] = tally.get(k, 0) + 1
        passed_over_checks(pristine)
        scrub_checks(pristine)
        scrub_truncated_checks(pristine)
        scrub_maps_check(pristine)
        verify_repair_checks(pristine)
    finally:
        shutil.rmtree(BASE, ignore_errors=True)
    for f in failures[:20]:
        print("FAILED:", f)
    print(f"{args.trials} trials (seed {args.seed}): {tally}; {len(failures)} failures, "
          f"{tally.get('wrong', 0)} with wrong bytes")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
