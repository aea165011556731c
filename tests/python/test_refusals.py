#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""What libsnap.torch refuses, against a real snapsmp: each refusal raises
UnsupportedError naming the class, before anything is registered, and
leaves the job's store without a step.

  - a custom subclass of a torch optimizer (it may keep state its base does
    not), a custom Optimizer with a state layout of its own, and a
    non-optimizer;
  - FullyShardedDataParallel: torch 1.13's torch.distributed.fsdp does not
    import on Python 3.11, so the model holds a stand-in class of that name
    and module (named as such here); nested inside another module too;
  - ZeroRedundancyOptimizer over a custom optimizer, and with
    overlap_with_ddp=True;
  - a known optimizer whose state_dict() would hold state a snapshot misses
    (state keyed by a string, not a parameter; state of a parameter outside
    its param_groups): refused at the save that would register it.

A store saved with DDP's "module." names restores into the bare module;
SGD's None momentum buffers come back as they were; a store saved tensor by
tensor is not restored through state_dict() (MismatchError).
And what the refusal points to works: optimizer_state="state_dict" takes
the custom optimizer through its own state_dict()/load_state_dict(), and a
fresh Checkpointer restores it exactly.

usage: test_refusals.py BUILD_DIR
"""
import os
import shutil
import signal
import subprocess
import sys
import warnings

import torch
import torch.distributed as dist

import libsnap.torch as lt

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
from events import free_port, wait_socket  # noqa: E402

build = os.path.abspath(sys.argv[1])
store = f"/dev/shm/snaptest-pyrefuse-{os.getpid()}"
native_env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
failures = []


def check(cond, msg):
    if not cond:
        print("FAIL: " + msg)
        failures.append(msg)


def refused(fn, words, what):
    try:
        fn()
    except lt.UnsupportedError as e:
        check(all(w in str(e) for w in words), f"{what}: the error does not name {words}: {e}")
        print(f"{what}: refused: {str(e)[:160]}")
        return
    except Exception as e:   # noqa: BLE001
        check(False, f"{what}: raised {type(e).__name__}: {e}, expected UnsupportedError")
        return
    check(False, f"{what}: accepted")


class MyAdam(torch.optim.AdamW):
    """A subclass that keeps a counter outside state_dict()."""
    def step(self, closure=None):
        self.calls = getattr(self, "calls", 0) + 1
        return super().step(closure)


class Lion(torch.optim.Optimizer):
    """A custom optimizer with a layout of its own, complete in its state_dict()."""
    def __init__(self, params, lr=1e-3, beta=0.9):
        super().__init__(params, {"lr": lr, "beta": beta})

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                st = self.state[p]
                m = st.setdefault("m", torch.zeros_like(p))
                st["k"] = st.get("k", 0) + 1
                p.add_(torch.sign(m * g["beta"] + p.grad * (1 - g["beta"])), alpha=-g["lr"])
                m.mul_(g["beta"]).add_(p.grad, alpha=1 - g["beta"])


class FullyShardedDataParallel(torch.nn.Module):
    """Stand-in: torch 1.13's FSDP cannot be imported on Python 3.11 here;
    libsnap.torch refuses by class name and module."""
    def __init__(self, module):
        super().__init__()
        self.module = module


FullyShardedDataParallel.__module__ = "torch.distributed.fsdp.fully_sharded_data_parallel"


def ck(model, opt, job, **kw):
    return lt.Checkpointer(model, opt, job=job, store=store, rank=0, world_size=1, **kw)


def train(model, opt, n=2):
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(4, 6)).pow(2).sum().backward()
        opt.step()


def latest(job):
    c = ck(torch.nn.Linear(1, 1), torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=1), job)
    try:
        return c.latest()
    finally:
        c.close()


def run():
    m = torch.nn.Linear(6, 3)
    refused(lambda: ck(m, MyAdam(m.parameters()), "r1"), ["MyAdam", "optimizer_state='state_dict'"],
            "a subclass of AdamW")
    refused(lambda: ck(m, Lion(m.parameters()), "r2"), ["Lion"], "a custom Optimizer")
    refused(lambda: ck(m, object(), "r3"), ["builtins.object", "not a torch.optim.Optimizer"], "a non-optimizer")
    f = FullyShardedDataParallel(torch.nn.Linear(6, 3))
    refused(lambda: ck(f, torch.optim.Adam(f.parameters()), "r4"),
            ["torch.distributed.fsdp", "FullyShardedDataParallel", "not supported yet"], "FSDP")
    nested = torch.nn.Sequential(torch.nn.Linear(6, 6), FullyShardedDataParallel(torch.nn.Linear(6, 3)))
    refused(lambda: ck(nested, torch.optim.Adam(nested.parameters()), "r5"), ["FullyShardedDataParallel"],
            "FSDP inside a Sequential")
    refused(lambda: ck(torch.nn.DataParallel(f), torch.optim.Adam(f.parameters()), "r5b"),
            ["FullyShardedDataParallel"], "FSDP inside DataParallel")

    from torch.distributed.optim import ZeroRedundancyOptimizer
    z = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=Lion, lr=1e-3)
    refused(lambda: ck(m, z, "r6"), ["ZeroRedundancyOptimizer over __main__.Lion"], "ZeRO over a custom optimizer")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zo = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.AdamW, overlap_with_ddp=True)
    refused(lambda: ck(m, zo, "r7"), ["ZeroRedundancyOptimizer", "overlap_with_ddp"], "ZeRO overlap_with_ddp")

    # a known class whose state_dict() holds what a snapshot would miss
    m2 = torch.nn.Linear(6, 3)
    opt = torch.optim.Adam(m2.parameters())
    train(m2, opt)
    opt.state["global_step"] = {"n": 2}      # keyed by a string: state_dict() packs it, no parameter holds it
    c = ck(m2, opt, "r8")
    refused(lambda: c.save(1), ["torch.optim.adam.Adam", "global_step", "Nothing was saved"],
            "Adam with state keyed by a string")
    c.close()
    check(latest("r8") is None, f"r8: a refused save left step {latest('r8')} in the store")
    m3 = torch.nn.Linear(6, 3)
    opt = torch.optim.SGD(m3.parameters(), lr=0.1, momentum=0.9)
    train(m3, opt)
    opt.state[torch.nn.Parameter(torch.zeros(2))] = {"momentum_buffer": torch.zeros(2)}   # outside its groups
    c = ck(m3, opt, "r9")
    refused(lambda: c.save(1), ["torch.optim.sgd.SGD", "state_dict() fails"], "SGD with state outside its groups")
    c.close()
    check(latest("r9") is None, "r9: a refused save left a step in the store")

    # the way out the refusal names: the optimizer's own state_dict()
    torch.manual_seed(3)
    m4 = torch.nn.Linear(6, 3)
    opt = Lion(m4.parameters(), lr=1e-2)
    train(m4, opt, 3)
    c = ck(m4, opt, "r10", optimizer_state="state_dict")
    c.save(3)
    c.wait()
    want_m, want_o = {k: v.clone() for k, v in m4.state_dict().items()}, opt.state_dict()
    c.close()
    m5 = torch.nn.Linear(6, 3)
    opt5 = Lion(m5.parameters(), lr=1.0, beta=0.1)
    c = ck(m5, opt5, "r10", optimizer_state="state_dict")
    check(c.restore() == 3, "custom optimizer via state_dict: restore did not return step 3")
    got = opt5.state_dict()
    check(all(torch.equal(m5.state_dict()[k], v) for k, v in want_m.items()), "custom optimizer: model differs")
    check(got["param_groups"] == want_o["param_groups"], f"custom optimizer: groups {got['param_groups']}")
    check(list(got["state"]) == list(want_o["state"]) and all(
        torch.equal(got["state"][i]["m"], want_o["state"][i]["m"]) and got["state"][i]["k"] == want_o["state"][i]["k"]
        for i in want_o["state"]), "custom optimizer: state differs")
    c.close()
    sd = lt.load_state_dict(store, job="r10")
    check(sd["optimizer_layout"] == "state_dict" and sd["optimizer_class"] == "Lion" and
          torch.equal(sd["optimizer"]["state"][0]["m"], want_o["state"][0]["m"]), "custom optimizer: load_state_dict")
    print("optimizer_state='state_dict': a custom optimizer restored exactly through its own state_dict()")

    # A store whose model names carry DDP's "module." (as a wrapper's
    # state_dict() has them) restores into the bare module: the names a
    # DistributedDataParallel model had before Checkpointer unwrapped it.
    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.module = torch.nn.Linear(6, 3)
    h = Holder()
    opt = torch.optim.Adam(h.parameters())
    train(h.module, opt)
    c = ck(h, opt, "r11")
    c.save(2)
    c.wait()
    c.close()
    bare = torch.nn.Linear(6, 3)
    opt2 = torch.optim.Adam(bare.parameters())
    c = ck(bare, opt2, "r11")
    check(c.restore() == 2, "module. names: restore did not return step 2")
    check(all(torch.equal(bare.state_dict()[k], v) for k, v in h.module.state_dict().items()) and
          torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"]),
          "module. names: the bare module differs from the saved one")
    c.save(3)     # saved under the bare names from now on
    c.close()
    check(list(lt.load_state_dict(store, job="r11")["model"]) == ["weight", "bias"], "module. names: resaved names")
    print("a store with DDP's module. names restores into the bare module")

    # plain SGD keeps a None momentum buffer per parameter: a Python value,
    # restored as such (state_dict() equal, None and all)
    torch.manual_seed(5)
    m6 = torch.nn.Linear(6, 3)
    opt = torch.optim.SGD(m6.parameters(), lr=0.1)
    train(m6, opt)
    c = ck(m6, opt, "r12")
    c.save(2)
    c.wait()
    c.close()
    m7 = torch.nn.Linear(6, 3)
    opt7 = torch.optim.SGD(m7.parameters(), lr=0.5)
    c = ck(m7, opt7, "r12")
    check(c.restore() == 2 and opt7.state_dict() == opt.state_dict(),
          f"SGD without momentum: {opt7.state_dict()} != {opt.state_dict()}")
    c.close()

    # the optimizer's state saved one way does not restore the other way
    bare2 = torch.nn.Linear(6, 3)
    c = ck(bare2, torch.optim.Adam(bare2.parameters()), "r11", optimizer_state="state_dict")
    try:
        c.restore()
        check(False, "a zero-copy store restored through state_dict: no error")
    except lt.MismatchError as e:
        check("optimizer_state='state_dict'" in str(e), f"path mismatch: the error does not say how: {e}")
        print(f"a zero-copy store into a state_dict Checkpointer: {str(e)[:150]}")
    c.close()


def main():
    shutil.rmtree(store, ignore_errors=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    smp = subprocess.Popen([os.path.join(build, "smp", "snapsmp"), "--store", store, "--quiet"], env=native_env)
    wait_socket(store, smp)
    try:
        run()
    finally:
        smp.send_signal(signal.SIGTERM)
        smp.wait()
        shutil.rmtree(store, ignore_errors=True)
    if failures:
        print(f"test_refusals: {len(failures)} failures")
        return 1
    print("test_refusals: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
