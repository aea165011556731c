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
    every new layout and not at a save of an unchanged one;
  - a pickled value (meta, RNGs, extra) kept from an earlier save is the
    current one: a list mutated in place, an lr that turns from 1 into 1.0
    or from 0.0 into -0.0, numpy's and Python's RNGs, a value saved again
    after a restore of an older step brought another one back.

usage: test_plan_cache.py BUILD_DIR
"""
import os
import random
import shutil
import signal
import subprocess
import sys

import numpy as np
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
    values()
    structure()
    lazy_state()


def regions(ck):
    return set(ck._by_name)


def structure():
    """The model's state_dict() is kept between saves (_ModelState): each
    change to what it returns must be seen at the next save."""
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    model.register_buffer("b", torch.arange(6.0))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    train(model, opt)
    ck = lt.Checkpointer(model, opt, job="plancache-structure", store=store)
    ck.save(1)
    ck.save(2)                          # the kept state_dict in use from here

    # a parameter re-assigned: a new object under the same name
    r = ck.relayouts
    new = torch.nn.Parameter(torch.full((3,), 7.0))
    model[1].bias = new
    ck.save(3)
    check(ck.relayouts == r + 1, "a parameter re-assigned: the layout was not renewed")
    ck.wait()
    new.data.fill_(0.0)
    ck.restore(3)
    check(torch.equal(model[1].bias.detach(), torch.full((3,), 7.0)),
          f"a parameter re-assigned: restored as {model[1].bias.detach()}, saved 7s")

    # a buffer resized in place: the same object and address, fewer elements
    r = ck.relayouts
    model.b.resize_(4)
    ck.save(4)
    check(ck.relayouts == r + 1, "a buffer resized in place: the layout was not renewed")
    check(ck._by_name["model/b"].shape == (4,), f"a resized buffer registered as {ck._by_name['model/b'].shape}")

    # a buffer moved: a new tensor at a new address under the same name
    r = ck.relayouts
    model.b = torch.full((4,), 5.0)
    ck.save(5)
    check(ck.relayouts == r + 1, "a buffer re-assigned: the layout was not renewed")
    ck.wait()
    model.b.zero_()
    ck.restore(5)
    check(torch.equal(model.b, torch.full((4,), 5.0)), f"a buffer re-assigned: restored as {model.b}")

    # a buffer and a submodule added, a buffer made non-persistent
    model.register_buffer("c", torch.ones(2))
    ck.save(6)
    check("model/c" in regions(ck), "a new buffer is not in the snapshot")
    model.add_module("head", torch.nn.Linear(3, 1))
    ck.save(7)
    check({"model/head.weight", "model/head.bias"} <= regions(ck), "a new submodule is not in the snapshot")
    model.register_buffer("c", model.c, persistent=False)
    ck.save(8)
    check("model/c" not in regions(ck), "a buffer made non-persistent is still in the snapshot")
    del model.head
    ck.save(9)
    check("model/head.weight" not in regions(ck), "a removed submodule is still in the snapshot")

    # a state_dict hook: what it returns is the snapshot's
    def hook(module, sd, prefix, meta):
        sd.pop(prefix + "b", None)
    model._register_state_dict_hook(hook)
    ck.save(10)
    check("model/b" not in regions(ck), "a state_dict hook's removal is not in the snapshot")
    ck.wait()
    ck.close()


def lazy_state():
    """A Checkpointer made before the first step: Adam's state appears at
    it, after the first save, and must be in every save from then on."""
    torch.manual_seed(3)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    ck = lt.Checkpointer(model, opt, job="plancache-lazy", store=store)
    ck.save(1)
    check(not any(n.startswith("optim/") for n in regions(ck)), "optimizer state before the first step")
    r = ck.relayouts
    train(model, opt)
    ck.save(2)
    check(ck.relayouts == r + 1, "Adam's state created at its first step: the layout was not renewed")
    check({"optim/0/exp_avg", "optim/0/exp_avg_sq", "optim/1/step"} <= regions(ck),
          f"Adam's state is not in the snapshot: {sorted(regions(ck))}")
    want = opt.state[model.weight]["exp_avg"].clone()
    ck.wait()
    opt.state[model.weight]["exp_avg"].zero_()
    ck.restore(2)
    check(torch.equal(opt.state[model.weight]["exp_avg"], want), "Adam's first state not restored")
    # the state replaced by another optimizer's (load_state_dict): new tensors
    r = ck.relayouts
    other = torch.optim.AdamW(model.parameters(), lr=0.1)
    other.load_state_dict(opt.state_dict())
    opt.load_state_dict(other.state_dict())
    ck.save(3)
    check(ck.relayouts == r + 1, "the optimizer state replaced by load_state_dict: the layout was not renewed")
    ck.wait()
    ck.close()


def values():
    """Pickled values kept between saves must be the current ones."""
    torch.manual_seed(1)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1)
    cursor = {"seen": [1, 2]}
    ck = lt.Checkpointer(model, opt, job="plancache-values", store=store, extra={"cursor": cursor})
    ck.save(1)
    ck.save(2)                          # the layout's plan settled: values are kept from here
    cursor["seen"].append(3)            # the same list, mutated in place
    opt.param_groups[0]["lr"] = 1.0     # equal to 1, another type
    opt.param_groups[0]["weight_decay"] = -0.0   # equal to 0.0, another float
    np.random.seed(7)
    random.seed(7)
    ck.save(3)
    want_np, want_py = np.random.get_state(), random.getstate()
    ck.save(4)                          # unchanged: the kept pickles
    ck.wait()
    np.random.rand(5)
    random.random()
    cursor["seen"].clear()
    opt.param_groups[0]["lr"] = 1
    opt.param_groups[0]["weight_decay"] = 0.0
    check(ck.restore(4) == 4, "values: step 4 not restored")
    got = ck.extra["cursor"]
    check(got == {"seen": [1, 2, 3]}, f"values: extra restored as {got}, saved {{'seen': [1, 2, 3]}}")
    lr, wd = opt.param_groups[0]["lr"], opt.param_groups[0]["weight_decay"]
    check(type(lr) is float and lr == 1.0, f"values: lr restored as {lr!r}, saved 1.0")
    check(type(wd) is float and str(wd) == "-0.0", f"values: weight_decay restored as {wd!r}, saved -0.0")
    got_np = np.random.get_state()
    check(got_np[0] == want_np[0] and np.array_equal(got_np[1], want_np[1]) and got_np[2:] == want_np[2:],
          "values: numpy's RNG restored to another state than saved")
    check(random.getstate() == want_py, "values: Python's RNG restored to another state than saved")
    # an older step restored, then the newer values again: saved as they are now
    opt.param_groups[0]["lr"] = 0.25
    ck.save(5)
    opt.param_groups[0]["lr"] = 0.5
    ck.save(6)
    ck.wait()
    check(ck.restore(5) == 5 and opt.param_groups[0]["lr"] == 0.25, "values: step 5 not restored with lr 0.25")
    opt.param_groups[0]["lr"] = 0.5     # step 6's value again, its pickle kept
    ck.save(6)
    ck.wait()
    opt.param_groups[0]["lr"] = 0.125
    check(ck.restore(6) == 6 and opt.param_groups[0]["lr"] == 0.5,
          f"values: lr restored as {opt.param_groups[0]['lr']}, saved 0.5 after a restore of step 5")
    ck.close()


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
