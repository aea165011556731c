#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Checkpointer.save() keeps its tensor entries while the layout is the same
(the per-save fast path), against a real snapsmp. Each save must still
capture what it would without the cache:

  - values saved every save (an lr, a non-tensor optimizer state entry)
    are the ones of that save, with no re-registration;
  - a parameter replaced in place (p.data = a copy: same object, new
    address) is a new layout: re-registered, and the restore brings back
    the new tensor's saved values, not the old memory's;
  - a buffer viewed with another shape at the same address, and a new
    param group, are new layouts too;
  - the completeness check against the optimizer's state_dict() runs at
    every new layout and not at a save of an unchanged one.

usage: test_plan_cache.py BUILD_DIR
"""
import os
import shutil
import signal
import subprocess
import sys

import torch

import libsnap.torch as lt
from libsnap import _support

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
from events import wait_socket  # noqa: E402

build = os.path.abspath(sys.argv[1])
store = f"/dev/shm/snaptest-plancache-{os.getpid()}"
native_env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
failures = []
accounts = []


def check(cond, msg):
    if not cond:
        print("FAIL: " + msg)
        failures.append(msg)


real_account = _support.account


def counting_account(*a, **k):
    accounts.append(1)
    return real_account(*a, **k)


_support.account = counting_account   # what Checkpointer's plan calls


def train(model, opt):
    opt.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    opt.step()


def run():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    model.register_buffer("b", torch.arange(6.0))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    train(model, opt)
    ck = lt.Checkpointer(model, opt, job="plancache", store=store)
    ck.save(1)
    n_acc, r = len(accounts), ck.relayouts
    check(n_acc == 1, f"the first layout was checked {n_acc} times, not once")

    # values of an unchanged layout: taken at the save
    w = model[0].weight
    opt.param_groups[0]["lr"] = 0.5
    opt.state[w]["note"] = 2            # a non-tensor state entry: a new key, a new layout
    train(model, opt)
    ck.save(2)
    check(len(accounts) == n_acc + 1, "a new state key did not re-run the completeness check")
    n_acc = len(accounts)
    opt.state[w]["note"] = 3            # same key, a new value: same layout
    train(model, opt)
    ck.save(3)
    check(len(accounts) == n_acc, "an unchanged layout re-ran the completeness check")
    # a non-tensor entry lives in the metadata region: no new regions
    check(ck.relayouts == r, f"relayouts {ck.relayouts}, expected {r}: no region changed")
    at3 = {k: v.clone() for k, v in model.state_dict().items()}
    opt.param_groups[0]["lr"] = 0.9
    opt.state[w]["note"] = 4
    ck.restore(3)
    check(opt.param_groups[0]["lr"] == 0.5, f"lr restored as {opt.param_groups[0]['lr']}, saved 0.5")
    check(opt.state[w].get("note") == 3, f"state note restored as {opt.state[w].get('note')}, saved 3")

    # a parameter replaced in place: same object, new address
    r = ck.relayouts
    old = model[1].weight.data
    model[1].weight.data = old.clone()
    train(model, opt)
    ck.save(4)
    check(ck.relayouts == r + 1, "p.data replaced: the layout was not renewed")
    saved = model[1].weight.detach().clone()
    check(not torch.equal(saved, old), "the test's step did not change the new tensor")
    ck.wait()                           # the copy reads registered memory until then
    model[1].weight.data.add_(1.0)
    ck.restore(4)
    check(torch.equal(model[1].weight.detach(), saved),
          "p.data replaced: the restore did not bring back the new tensor's saved values")

    # the same address with another shape
    r = ck.relayouts
    model.b = model.b.view(2, 3)
    ck.save(5)
    check(ck.relayouts == r + 1, "a buffer viewed with another shape: the layout was not renewed")
    ck.wait()
    model.b.fill_(-1.0)
    ck.restore(5)
    check(model.b.shape == (2, 3) and torch.equal(model.b.flatten(), torch.arange(6.0)),
          f"buffer restored as {model.b}")

    # a new param group: a new layout, checked
    r, n_acc = ck.relayouts, len(accounts)
    extra = torch.nn.Parameter(torch.ones(3))
    opt.add_param_group({"params": [extra], "lr": 0.01})
    extra.grad = torch.ones(3)
    opt.step()
    ck.save(6)
    check(ck.relayouts == r + 1, "a new param group: the layout was not renewed")
    check(len(accounts) == n_acc + 1, "a new param group: the completeness check did not run")
    ck.wait()
    ck.close()
    del at3


def main():
    shutil.rmtree(store, ignore_errors=True)
    smp = subprocess.Popen([os.path.join(build, "smp", "snapsmp"), "--store", store, "--quiet"], env=native_env)
    wait_socket(store, smp)
    try:
        run()
    finally:
        smp.send_signal(signal.SIGTERM)
        smp.wait()
        shutil.rmtree(store, ignore_errors=True)
    if failures:
        print(f"test_plan_cache: {len(failures)} failures")
        return 1
    print("test_plan_cache: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
