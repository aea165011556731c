#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""libsnap.torch with no snapsmp running: Checkpointer(..., autostart=False)
raises the clear error naming the socket; the default (autostart=True here,
over ctest's SNAP_AUTOSTART=0) starts one (found beside libsnap.so), saves,
and a second Checkpointer on a fresh model restores bit-exact from it. The
daemon started is SIGTERMed by pid at the end and must exit.

usage: check_autostart.py   (SNAP_LIBRARY and PYTHONPATH from ctest)
"""
import os
import select
import shutil
import signal
import sys

import torch

import libsnap.torch as lt
from libsnap import SnapError

STORE = f"/dev/shm/snaptest-pyauto-{os.getpid()}"
bad = []


def daemons():
    out = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if os.path.basename(argv[0]) == b"snapsmp" and os.fsencode(STORE) in argv:
            out.append(int(d))
    return out


def stopped(pid, sig=signal.SIGTERM):
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        os.kill(pid, sig)
        return bool(select.select([fd], [], [], 120)[0])
    finally:
        os.close(fd)


def model_opt(seed):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return m, torch.optim.Adam(m.parameters(), lr=1e-2)


def main():
    shutil.rmtree(STORE, ignore_errors=True)
    m, opt = model_opt(0)
    try:
        lt.Checkpointer(m, opt, store=STORE, job="pyauto", autostart=False, timeout_ms=200)
        bad.append("autostart=False with no snapsmp did not raise")
    except SnapError as e:
        if os.path.join(STORE, "smp.sock") not in str(e) or "SNAP_AUTOSTART=0" not in str(e):
            bad.append(f"autostart=False: the error does not name the socket and the setting: {e}")
    if daemons():
        bad.append(f"autostart=False started snapsmp: {daemons()}")

    ck = lt.Checkpointer(m, opt, store=STORE, job="pyauto", autostart=True)
    x = torch.randn(32, 16)
    for step in (1, 2):
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()
        ck.save(step)
    ck.close()
    want = {k: v.clone() for k, v in m.state_dict().items()}
    pids = daemons()
    if len(pids) != 1:
        bad.append(f"one snapsmp expected for the store, found {pids}")

    m2, opt2 = model_opt(1)
    ck2 = lt.Checkpointer(m2, opt2, store=STORE, job="pyauto", autostart=True)
    got = ck2.restore()
    ck2.close()
    if got != 2:
        bad.append(f"restore returned step {got}, not 2")
    elif any(not torch.equal(want[k], v) for k, v in m2.state_dict().items()):
        bad.append("the restored model differs from the saved one")
    if daemons() != pids:
        bad.append(f"the second Checkpointer did not use the running snapsmp: {daemons()} vs {pids}")
    for pid in daemons():
        if not stopped(pid):
            bad.append(f"snapsmp {pid} did not exit on SIGTERM")
            stopped(pid, signal.SIGKILL)
    shutil.rmtree(STORE, ignore_errors=True)
    for b in bad:
        print("FAILED:", b)
    print("autostart with libsnap.torch:", "ok" if not bad else f"{len(bad)} failures")
    return 1 if bad else 0


sys.exit(main())
