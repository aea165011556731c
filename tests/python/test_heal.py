#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""libsnap.torch's restore() stays collective when one rank's copy of the
newest step is damaged beyond repair (docs/self-healing.md): a job of 2
ranks under torch.distributed (gloo) saves steps 1-3 into a real snapsmp
without a flush directory, a byte of rank 1's step 3 is flipped, and a
relaunch of both ranks restores step 2 on both (fell_back_from == [3]), with
each rank's parameters exactly those of step 2.

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
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker(sys.argv[sys.argv.index("--worker") + 1])
    else:
        sys.exit(main())
