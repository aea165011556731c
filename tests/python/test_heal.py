#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""libsnap.torch's restore() stays collective when one rank's copy of the
newest step is damaged beyond repair (docs/self-healing.md): a job of 2
ranks under torch.distributed (gloo) saves steps 1-3 into a real snapsmp
without a flush directory, a byte of rank 1's step 3 is flipped, and a
relaunch of both ranks restores step 2 on both (fell_back_from == [3]), with
each rank's parameters exactly those of step 2.

And one rank with a flush directory: step 3's store manifest damaged, so a
restarted snapsmp's scan discards it, and its flushed MANIFEST damaged too:
restore() gives step 2, fell_back_from == [3] and a RuntimeWarning naming
step 3; with the flushed copy intact, step 3 from the flush, no fallback.

usage: test_heal.py BUILD_DIR   (worker mode: test_heal.py BUILD_DIR --worker save|restore)
"""
import json
import os
import shutil
import signal
import subprocess
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
from events import free_port, wait_socket  # noqa: E402

build = os.path.abspath(sys.argv[1])
JOB = "heal"
store = os.environ.get("HEAL_STORE", f"/dev/shm/snaptest-pyheal-{os.getpid()}")


def values(step, rank, n):
    return torch.arange(n, dtype=torch.float32) * 1e-3 + step + 100 * rank


def worker(phase):
    import torch.distributed as dist
    import libsnap.torch as lt
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    m = torch.nn.Linear(64, 32)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ck = lt.Checkpointer(m, opt, job=JOB, store=store)
    out = {"rank": rank}
    if phase == "save":
        for step in (1, 2, 3):
            with torch.no_grad():
                m.weight.copy_(values(step, rank, m.weight.numel()).view_as(m.weight))
                m.bias.copy_(values(step, rank, m.bias.numel()))
            ck.save(step)
            ck.wait()
    else:
        with torch.no_grad():
            m.weight.zero_()
            m.bias.zero_()
        got = ck.restore()
        out.update(got=got, fell_back_from=ck.fell_back_from,
                   exact=bool(got is not None and
                              torch.equal(m.weight.view(-1), values(got, rank, m.weight.numel())) and
                              torch.equal(m.bias, values(got, rank, m.bias.numel()))))
    ck.close()
    dist.barrier()
    dist.destroy_process_group()
    print("RESULT " + json.dumps(out), flush=True)


def worker_one(phase, flush):
    """One rank, no torch.distributed, a flush directory."""
    import warnings
    import libsnap.torch as lt
    m = torch.nn.Linear(64, 32)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ck = lt.Checkpointer(m, opt, job=JOB, store=store, flush_dir=flush)
    out = {"rank": 0}
    if phase == "save1":
        for step in (1, 2, 3):
            with torch.no_grad():
                m.weight.copy_(values(step, 0, m.weight.numel()).view_as(m.weight))
                m.bias.copy_(values(step, 0, m.bias.numel()))
            ck.save(step)
            ck.wait()
    else:
        with torch.no_grad():
            m.weight.zero_()
            m.bias.zero_()
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            got = ck.restore()
        out.update(got=got, fell_back_from=ck.fell_back_from,
                   warnings=[str(w.message) for w in ws if issubclass(w.category, RuntimeWarning)],
                   exact=bool(got is not None and
                              torch.equal(m.weight.view(-1), values(got, 0, m.weight.numel())) and
                              torch.equal(m.bias, values(got, 0, m.bias.numel()))))
    ck.close()
    print("RESULT " + json.dumps(out), flush=True)


def passed_over(native_env, failures):
    """The store's manifest of step 3 discarded at a restart; its flushed copy damaged or intact."""
    from libsnap import _files
    base, flush0 = store + "-over", store + "-over-flush"
    smp_bin = os.path.join(build, "smp", "snapsmp")

    def daemon(st, fl):
        p = subprocess.Popen([smp_bin, "--store", st, "--flush-dir", fl, "--flush-every", "1", "--scrub-rate", "0"],
                             stderr=subprocess.PIPE, text=True, env=native_env)
        if not wait_socket(st, p):
            raise RuntimeError(f"snapsmp did not start: {p.communicate(timeout=60)[1]}")
        return p

    def run(phase, st, fl):
        r = subprocess.run([sys.executable, __file__, build, "--worker-one", phase, fl], capture_output=True,
                           text=True, timeout=300, env=dict(os.environ, HEAL_STORE=st))
        line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
        if r.returncode != 0 or not line:
            raise RuntimeError(f"{phase} worker failed ({r.returncode}): {r.stdout}\n{r.stderr}")
        return json.loads(line[0][7:])

    try:
        p = daemon(base, flush0)
        run("save1", base, flush0)
        p.send_signal(signal.SIGTERM)   # flushes the newest step and waits for it
        p.communicate(timeout=60)
        for flushed in ("damaged", "intact"):
            st, fl = f"{base}-{flushed}", f"{flush0}-{flushed}"
            shutil.copytree(base, st, symlinks=True)
            shutil.copytree(flush0, fl, symlinks=True)
            if os.path.exists(os.path.join(st, "smp.sock")):
                os.unlink(os.path.join(st, "smp.sock"))
            _, _, by = _files.store_step(st, JOB, 3)
            flip(by[0]["path"] + ".man", 40)
            if flushed == "damaged":
                fman = os.path.join(fl, JOB, "step-3", "MANIFEST")
                flip(fman, os.path.getsize(fman) // 2)
            p = daemon(st, fl)
            try:
                r = run("restore1", st, fl)
            finally:
                p.send_signal(signal.SIGTERM)
                log = p.communicate(timeout=60)[1]
            want = (2, [3]) if flushed == "damaged" else (3, [])
            said = [w for w in r["warnings"] if "fell back to step 2: step 3 " in w]
            if "discarding" not in log:
                failures.append(f"flushed copy {flushed}: snapsmp did not discard step 3's manifest: {log[-1500:]}")
            elif (r["got"], r["fell_back_from"]) != want or not r["exact"] or bool(said) != (flushed == "damaged"):
                failures.append(f"store manifest of step 3 discarded, flushed copy {flushed}: {r}")
            else:
                print(f"one rank, step 3's store manifest discarded, its flushed copy {flushed}: {r}")
    finally:
        for d in (base, flush0, f"{base}-damaged", f"{flush0}-damaged", f"{base}-intact", f"{flush0}-intact"):
            shutil.rmtree(d, ignore_errors=True)


def flip(path, off):
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x04]))


def launch(phase):
    port = free_port()
    env = lambda r: dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE="2",
                         HEAL_STORE=store)
    ps = [subprocess.Popen([sys.executable, __file__, build, "--worker", phase], env=env(r), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=300) for p in ps]
    res = []
    for p, (o, e) in zip(ps, outs):
        line = [x for x in o.splitlines() if x.startswith("RESULT ")]
        if p.returncode != 0 or not line:
            raise RuntimeError(f"{phase} worker failed ({p.returncode}): {o}\n{e}")
        res.append(json.loads(line[0][7:]))
    return res


def main():
    from libsnap import _files
    shutil.rmtree(store, ignore_errors=True)
    # The daemon runs natively (under ASan the interpreter's LD_PRELOAD is not its).
    native_env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    smp = subprocess.Popen([os.path.join(build, "smp", "snapsmp"), "--store", store, "--scrub-rate", "0"],
                           stderr=subprocess.PIPE, text=True, env=native_env)
    failures = []
    try:
        if not wait_socket(store, smp):
            raise RuntimeError(f"snapsmp did not start: {smp.communicate(timeout=60)[1]}")
        launch("save")
        _, _, by = _files.store_step(store, JOB, 3)
        g = by[1]["regions"][0]
        with open(by[1]["path"], "r+b") as f:     # rank 1's step 3 only
            f.seek(g["offset"] + 7)
            b = f.read(1)
            f.seek(g["offset"] + 7)
            f.write(bytes([b[0] ^ 0x08]))
        res = launch("restore")
        for r in res:
            if r["got"] != 2 or r["fell_back_from"] != [3] or not r["exact"]:
                failures.append(f"rank {r['rank']}: {r}")
        print(f"2 ranks, rank 1's step 3 damaged beyond repair: {res}")
    finally:
        smp.send_signal(signal.SIGTERM)
        _, log = smp.communicate(timeout=60)
        shutil.rmtree(store, ignore_errors=True)
    if "withdrew step 3" not in log:
        failures.append(f"snapsmp did not withdraw step 3: {log[-2000:]}")
    passed_over(native_env, failures)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker(sys.argv[sys.argv.index("--worker") + 1])
    elif "--worker-one" in sys.argv:
        worker_one(*sys.argv[sys.argv.index("--worker-one") + 1:][:2])
    else:
        sys.exit(main())
