#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Checkpointer sends its layout to snapsmp ahead of the first save
(snap_prepare), against a real snapsmp, so the daemon reserves the slot
files while training runs:

  - an optimizer whose state exists (a step was taken) when the
    Checkpointer is made: the constructor prepares; the daemon's log line
    and its slots_precreated counter show the reservation before any save,
    and the first save registers nothing new (relayouts 0);
  - a fresh AdamW (its state is made by its first step): nothing is sent at
    construction; the wrapped step() prepares right after the first step;
  - the control: a save with no step before it sends the layout itself,
    so no reservation is seen before that save (the check can fail).

Each save is then committed (latest() is its step).

usage: test_prepare.py BUILD_DIR
"""
import os
import shutil
import signal
import subprocess
import sys

import torch

import libsnap.torch as lt

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
from events import Waiter, wait_socket  # noqa: E402
from promfile import prom_value  # noqa: E402

build = os.path.abspath(sys.argv[1])
store = f"/dev/shm/snaptest-prepare-{os.getpid()}"
logf = store + ".log"
prom = store + ".prom"
native_env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
failures = []
DEADLINE = 120   # for a hang only: the events below come within milliseconds


def check(cond, msg):
    if not cond:
        print("FAIL: " + msg)
        failures.append(msg)


def reserved_lines(job):
    """snapsmp's log lines saying REGISTER reserved job's slot files ahead."""
    with open(logf, errors="replace") as f:
        return [ln for ln in f if f"job {job} rank 0:" in ln and "being reserved ahead of the first save" in ln]


def metric(name, job):
    return prom_value(prom, name, f'job="{job}"')


def wait_metric(name, job, smp):
    """The counter once the metrics file has it: each rewrite (a rename into
    /dev/shm) wakes the waiter; DEADLINE is for a hang only."""
    w = Waiter()
    try:
        v = w.until(lambda: metric(name, job) is not None or smp.poll() is not None, DEADLINE,
                    dirs=lambda: [os.path.dirname(prom)], procs=[smp])
    finally:
        w.close()
    return metric(name, job) if v else None


def model_opt():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.LayerNorm(8))
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def train(model, opt):
    opt.zero_grad()
    model(torch.randn(4, 16)).sum().backward()
    opt.step()


def run(smp):
    # The state exists: the constructor prepares.
    model, opt = model_opt()
    train(model, opt)
    ck = lt.Checkpointer(model, opt, job="prepA", store=store)
    check(len(reserved_lines("prepA")) == 1, "prepA: no reservation logged after the constructor, before any save")
    pre = wait_metric("libsnap_slots_precreated_total", "prepA", smp)
    check(pre is not None and pre >= 1, f"prepA: slots_precreated {pre} before the first save, expected >= 1")
    train(model, opt)
    ck.save(1)
    ck.wait()
    check(ck.relayouts == 0, f"prepA: the first save registered again ({ck.relayouts} relayouts): the prepared "
          "layout was not the save's")
    check(len(reserved_lines("prepA")) == 1, "prepA: the save reserved the slot files again")
    check(ck.latest() == 1, f"prepA: latest {ck.latest()} after the save of step 1")
    ck.close()

    # A fresh AdamW: its first step makes the state, and the wrapped step prepares.
    model, opt = model_opt()
    ck = lt.Checkpointer(model, opt, job="prepB", store=store)
    check(not reserved_lines("prepB"), "prepB: the layout was sent before the optimizer had its state")
    train(model, opt)
    check(len(reserved_lines("prepB")) == 1, "prepB: no reservation logged after the first step, before any save")
    ck.save(1)
    ck.wait()
    check(ck.relayouts == 0, f"prepB: the first save registered again ({ck.relayouts} relayouts)")
    check(ck.latest() == 1, f"prepB: latest {ck.latest()} after the save of step 1")
    train(model, opt)
    ck.save(2)
    ck.wait()
    check(len(reserved_lines("prepB")) == 1, "prepB: a later step or save sent the layout again")
    ck.close()

    # Control: a save with no step before it; the save itself registers.
    model, opt = model_opt()
    ck = lt.Checkpointer(model, opt, job="prepC", store=store)
    check(not reserved_lines("prepC"), "prepC: a reservation logged with no step and no save")
    ck.save(1)
    ck.wait()
    check(len(reserved_lines("prepC")) == 1, "prepC: the first save's REGISTER not logged (the log check is blind)")
    check(ck.latest() == 1, f"prepC: latest {ck.latest()} after the save of step 1")
    ck.close()


def main():
    shutil.rmtree(store, ignore_errors=True)
    for p in (logf, prom):
        if os.path.exists(p):
            os.unlink(p)
    with open(logf, "w") as log:
        smp = subprocess.Popen([os.path.join(build, "smp", "snapsmp"), "--store", store, "--metrics-file", prom,
                                "--metrics-interval", "1"], env=native_env, stdout=log, stderr=log)
    wait_socket(store, smp)
    try:
        run(smp)
    finally:
        smp.send_signal(signal.SIGTERM)
        smp.wait()
        shutil.rmtree(store, ignore_errors=True)
        for p in (logf, prom):
            if os.path.exists(p):
                os.unlink(p)
    if failures:
        print(f"test_prepare: {len(failures)} failures")
        return 1
    print("test_prepare: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
