#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""libsnap.torch.load_state_dict against a real snapsmp with a flush
directory: a job of 2 ranks whose parameters are shards of global tensors
(rows of one, columns of another, one replicated), with AdamW state in two
param groups, bf16/int64/bool buffers, an LR scheduler and a plain value in
extra, saved by two Checkpointers, persisted, and exported with snaptool
(--copy and virtual). From the node store, the flush directory, the same
step as per-node flush directories (D/node%n, a part per node) and both
export files, load_state_dict must give:
  - at the saved world size, each rank's own model.state_dict() and
    optimizer.state_dict() exactly (they load back into the model);
  - by default the whole tensors, the shards put together;
  - at world size 3, each rank's torch.tensor_split of the whole tensors;
and survive torch.save/torch.load. A flipped byte in a copy of the store, a
missing step or path, and bad arguments give clear errors.

usage: test_load.py BUILD_DIR
"""
import collections
import os
import shutil
import signal
import subprocess
import sys

import torch

import libsnap
import libsnap.torch as lt

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
from events import wait_socket  # noqa: E402

build = os.path.abspath(sys.argv[1])
snapsmp = os.path.join(build, "smp", "snapsmp")
snaptool = os.path.join(build, "tools", "snaptool")
native_env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
root = os.path.join(build, "tests", "python", f"load-{os.getpid()}")
store = f"/dev/shm/snaptest-pyload-{os.getpid()}"
flush = os.path.join(root, "flush")
JOB = "ld"
failures = []


def check(cond, msg):
    if not cond:
        print("FAIL: " + msg)
        failures.append(msg)


torch.manual_seed(7)
G = {"w1": torch.randn(10, 6), "w2": torch.randn(7, 4), "w3": torch.randn(3, 9), "b": torch.randn(6)}
SPLIT = {"w1": 0, "w2": 0, "w3": 1}   # sharded dim; b is replicated


class Shard(torch.nn.Module):
    def __init__(self, r, world):
        super().__init__()
        for n, t in G.items():
            part = torch.tensor_split(t, world, SPLIT[n])[r] if n in SPLIT else t
            setattr(self, n, torch.nn.Parameter(part.clone()))
        self.register_buffer("halfbuf", (torch.arange(5, dtype=torch.float32) * (r + 1)).to(torch.bfloat16))
        self.register_buffer("count", torch.tensor(41 + r, dtype=torch.int64))
        self.register_buffer("mask", torch.tensor([True, False, r == 1]))

    def loss(self):
        return sum((p * p).sum() * (i + 1) for i, p in enumerate(self.parameters()))


def shard_spec(r, world):
    def spec(name, t):
        if name not in SPLIT:
            return None
        d = SPLIT[name]
        off = [0] * t.dim()
        off[d] = sum(x.shape[d] for x in torch.tensor_split(G[name], world, d)[:r])
        return tuple(G[name].shape), tuple(off)
    return spec


def make_rank(r):
    m = Shard(r, 2)
    opt = torch.optim.AdamW([{"params": [m.w1, m.w2], "lr": 1e-3}, {"params": [m.w3, m.b], "lr": 2e-3}])
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
    for _ in range(2):
        opt.zero_grad()
        m.loss().backward()
        opt.step()
        sched.step()
    ck = lt.Checkpointer(m, opt, extra={"sched": sched, "cursor": {"epoch": 3, "rank": r}}, job=JOB, store=store,
                         rank=r, world_size=2, shards=shard_spec(r, 2))
    return m, opt, sched, ck


def same(a, b, what):
    if torch.is_tensor(a) or torch.is_tensor(b):
        ok = torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape and \
            torch.equal(a, b)
        check(ok, f"{what}: {a!r} != {b!r}")
    elif isinstance(a, dict):
        check(isinstance(b, dict) and list(a) == list(b), f"{what}: keys {list(a)} != {list(b) if isinstance(b, dict) else b}")
        if isinstance(b, dict):
            for k in a:
                if k in b:
                    same(a[k], b[k], f"{what}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        check(isinstance(b, (list, tuple)) and len(a) == len(b), f"{what}: {a} != {b}")
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{what}[{i}]")
    else:
        check(a == b, f"{what}: {a!r} != {b!r}")


def expect_error(fn, exc, words, what):
    try:
        fn()
    except exc as e:
        check(all(w in str(e) for w in words), f"{what}: error does not say {words}: {e}")
        return
    except Exception as e:   # noqa: BLE001
        check(False, f"{what}: raised {type(e).__name__}: {e}, expected {exc.__name__}")
        return
    check(False, f"{what}: no error")


def main():
    shutil.rmtree(store, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    global smp
    smp = start_smp()
    try:
        run()
    finally:
        smp.send_signal(signal.SIGTERM)
        smp.wait()
        shutil.rmtree(store, ignore_errors=True)
    if failures:
        print(f"test_load: {len(failures)} failures")
        return 1
    shutil.rmtree(root, ignore_errors=True)
    print("test_load: all checks passed")
    return 0


def split_per_node(flush, out, step):
    """The flush directory's step as per-node directories would hold it
    (snapsmp --ec ... --flush-dir OUT/node%n with rank r on node r): each
    rank file in its node's directory under a part MANIFEST, written here
    from the format (docs/io-format.md), independently of io/."""
    from libsnap import _capi
    with open(os.path.join(flush, JOB, f"step-{step}", "MANIFEST")) as f:
        lines = f.read().split("\n")
    head = [l for l in lines if l.split(" ")[0] in ("snapio-manifest", "job", "step", "world")]
    for l in lines:
        if l.startswith("rank "):
            r = int(l.split(" ")[1])
            d = os.path.join(out, f"node{r}", JOB, f"step-{step}")
            os.makedirs(d)
            shutil.copy(os.path.join(flush, JOB, f"step-{step}", f"rank-{r}.h5"), d)
            body = "\n".join(head + ["part 1", l]) + "\n"
            with open(os.path.join(d, "MANIFEST"), "w") as f:
                f.write(body + f"end {_capi.crc32c(body.encode()):08x}\n")
    return os.path.join(out, "node%n")


def restore_from_disk(own):
    """The node store is lost (a reboot): snapsmp restarts empty, and fresh
    Checkpointers (optimizers without state yet) restore the persisted step:
    the layout is read from the HDF5 rank files (flush_dir), snapsmp loads
    the step from disk."""
    global smp
    smp.send_signal(signal.SIGTERM)
    smp.wait()
    shutil.rmtree(store)
    smp = start_smp()
    cks = []
    for r in range(2):
        m = Shard(r, 2)
        opt = torch.optim.AdamW([{"params": [m.w1, m.w2], "lr": 1}, {"params": [m.w3, m.b], "lr": 1}])
        sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
        extra = {"sched": sched, "cursor": None}
        ck = lt.Checkpointer(m, opt, extra=extra, job=JOB, store=store, rank=r, world_size=2,
                             shards=shard_spec(r, 2), flush_dir=flush)
        cks.append((m, opt, sched, ck))
    for r, (m, opt, sched, ck) in enumerate(cks):
        got = ck.restore()
        check(got == 3, f"restore from disk: rank {r} restored {got}")
        same(m.state_dict(), own[r][0], f"restore from disk: rank {r} model")
        same(opt.state_dict(), own[r][1], f"restore from disk: rank {r} optimizer")
        same(sched.state_dict(), own[r][2], f"restore from disk: rank {r} scheduler")
        same(ck.extra["cursor"], {"epoch": 3, "rank": r}, f"restore from disk: rank {r} cursor")
    for *_, ck in cks:
        ck.save(4)
    for *_, ck in cks:
        ck.close()
    print("restore from disk: an empty node store, the persisted step restored into fresh optimizers")


def rollback_refused(rank0):
    """A rollback inside the running job: rank 0's Checkpointer has saved, so
    its restore checks every chunk first (restore_verify auto). A flipped
    byte in the node store's copy of step 3 is repaired from the flushed copy
    of the same step (docs/self-healing.md), and the model is step 3's."""
    from libsnap import _files
    m, _, _, ck = rank0
    _, _, by = _files.store_step(store, JOB)
    g = next(x for x in by[0]["regions"] if x["name"] == "model/w2")

    def byte():
        with open(by[0]["path"], "rb") as f:
            f.seek(g["offset"] + 5)
            return f.read(1)

    good = byte()
    with open(by[0]["path"], "r+b") as f:
        f.seek(g["offset"] + 5)
        f.write(bytes([good[0] ^ 0x20]))
    saved = {k: v.clone() for k, v in m.state_dict().items()}
    with torch.no_grad():
        for p in m.parameters():
            p.add_(1.0)     # live state that differs from the snapshot everywhere
    check(ck.restore(3) == 3, "rollback onto a corrupt step: repaired, restored")
    check(byte() == good, "the node store's copy was rewritten from the flush")
    same(m.state_dict(), saved, "model after the rollback")
    print("rollback: a corrupt chunk of the step repaired from the flush, the step restored")


def start_smp():
    p = subprocess.Popen([snapsmp, "--store", store, "--flush-dir", flush, "--quiet"], env=native_env)
    wait_socket(store, p)
    return p


def run():
    ranks = [make_rank(r) for r in range(2)]
    for m, opt, sched, ck in ranks:
        ck.save(3)
    for m, opt, sched, ck in ranks:
        ck.wait()
    ranks[0][3].flush(3)
    own = [(m.state_dict(), opt.state_dict(), sched.state_dict()) for m, opt, sched, _ in ranks]
    rng_torch = torch.get_rng_state()
    rollback_refused(ranks[0])
    for *_, ck in ranks:
        ck.close()
    exports = {}
    for mode in ("copy", "virtual"):
        path = os.path.join(root, f"export-{mode}.h5")
        out = subprocess.run([snaptool, "export", "3", "-o", path, "--flush-dir", flush, "--job", JOB]
                             + (["--copy"] if mode == "copy" else []), capture_output=True, text=True, env=native_env)
        check(out.returncode == 0, f"snaptool export --{mode}: {out.stdout}{out.stderr}")
        exports[mode] = path

    # the trained parameters put together: rows / columns of the ranks' shards
    whole = {n: torch.cat([own[r][0][n] for r in range(2)], SPLIT[n]) if n in SPLIT else own[0][0][n] for n in G}
    pernode = split_per_node(flush, os.path.join(root, "pernode"), 3)
    sources = {"node store": store, "flush directory": flush, "per-node flush directories": pernode,
               "export --copy": exports["copy"], "export (virtual)": exports["virtual"]}
    for sname, src in sources.items():
        # at the saved world size: each rank's own state, exactly
        for r in range(2):
            sd = lt.load_state_dict(src, world_size=2, rank=r, job=JOB)
            check(sd["step"] == 3 and sd["world_size"] == 2, f"{sname}: step/world {sd['step']}/{sd['world_size']}")
            if sname.startswith("export"):
                # an export keeps one copy of each replicated tensor: rank 0's buffers
                want = collections.OrderedDict((k, v if k in SPLIT or k == "b" else own[0][0][k])
                                               for k, v in own[r][0].items())
            else:
                want = own[r][0]
            same(sd["model"], want, f"{sname} rank {r} model")
            if not sname.startswith("export") or r == 0:
                same(sd["optimizer"]["param_groups"], own[r][1]["param_groups"], f"{sname} rank {r} param_groups")
                same(sd["extra"]["sched"], own[r][2], f"{sname} rank {r} scheduler")
                same(sd["extra"]["cursor"], {"epoch": 3, "rank": r}, f"{sname} rank {r} cursor")
            same(sd["optimizer"]["state"], own[r][1]["state"], f"{sname} rank {r} optimizer state")
            same(sd["rng"]["torch"], rng_torch, f"{sname} rank {r} torch RNG")
            m, opt = Shard(r, 2), None
            m.load_state_dict(sd["model"])
            opt = torch.optim.AdamW([{"params": [m.w1, m.w2], "lr": 1}, {"params": [m.w3, m.b], "lr": 1}])
            opt.load_state_dict(sd["optimizer"])
            same(opt.state_dict()["state"], own[r][1]["state"], f"{sname} rank {r} optimizer loaded back")
        # whole tensors
        sd = lt.load_state_dict(src, job=JOB)
        for n, t in whole.items():
            same(sd["model"][n], t, f"{sname} whole {n}")
        for i, n in enumerate(["w1", "w2", "w3", "b"]):
            for k in ("exp_avg", "exp_avg_sq"):
                parts = [own[r][1]["state"][i][k] for r in range(2)]
                want = torch.cat(parts, SPLIT[n]) if n in SPLIT else parts[0]
                same(sd["optimizer"]["state"][i][k], want, f"{sname} whole optim {n}.{k}")
            same(sd["optimizer"]["state"][i]["step"], own[0][1]["state"][i]["step"], f"{sname} whole step")
        # another world size
        for r in range(3):
            sd = lt.load_state_dict(src, world_size=3, rank=r, job=JOB)
            for n in G:
                want = torch.tensor_split(whole[n], 3, SPLIT[n])[r] if n in SPLIT else whole[n]
                same(sd["model"][n], want, f"{sname} world 3 rank {r} {n}")
            for i, n in enumerate(["w1", "w2", "w3", "b"]):
                whole_avg = torch.cat([own[q][1]["state"][i]["exp_avg"] for q in range(2)], SPLIT[n]) \
                    if n in SPLIT else own[0][1]["state"][i]["exp_avg"]
                want = torch.tensor_split(whole_avg, 3, SPLIT[n])[r] if n in SPLIT else whole_avg
                same(sd["optimizer"]["state"][i]["exp_avg"], want, f"{sname} world 3 rank {r} exp_avg of {n}")
        path = os.path.join(root, "plain.pt")
        torch.save(sd, path)
        same(torch.load(path)["model"], sd["model"], f"{sname}: torch.save/torch.load")
        print(f"{sname}: own shards at world 2, whole tensors, world 3: as saved")

    restore_from_disk(own)

    # bad input
    expect_error(lambda: lt.load_state_dict(os.path.join(root, "nope")), FileNotFoundError, ["nope"], "missing path")
    expect_error(lambda: lt.load_state_dict(flush, step=99, job=JOB), libsnap.SnapError, ["99", "not persisted"],
                 "missing step")
    expect_error(lambda: lt.load_state_dict(store, world_size=2, job=JOB), TypeError, ["rank"], "world without rank")
    expect_error(lambda: lt.load_state_dict(store, job="other"), libsnap.SnapError, ["other"], "unknown job")
    # per node: with one node's part gone no step is persisted, and nothing else is read instead
    man1 = os.path.join(root, "pernode", "node1", JOB, "step-3", "MANIFEST")
    os.rename(man1, man1 + ".aside")
    expect_error(lambda: lt.load_state_dict(pernode, job=JOB), libsnap.SnapError, ["node%n", "no persisted step"],
                 "a node's part missing")
    os.rename(man1 + ".aside", man1)
    bad = os.path.join(root, "bad-store")
    shutil.copytree(os.path.join(store, JOB), os.path.join(bad, JOB))
    from libsnap import _files
    step, world, by = _files.store_step(bad, JOB)
    m = by[1]
    g = next(x for x in m["regions"] if x["name"] == "model/w2")
    with open(m["path"], "r+b") as f:
        f.seek(g["offset"] + 5)
        b = f.read(1)
        f.seek(g["offset"] + 5)
        f.write(bytes([b[0] ^ 0x20]))
    expect_error(lambda: lt.load_state_dict(bad, job=JOB), libsnap.SnapError, ["model/w2", "CRC32C", "rank 1"],
                 "flipped byte in a slot file")
    with open(m["man_path"], "r+b") as f:
        f.seek(40)
        b = f.read(1)
        f.seek(40)
        f.write(bytes([b[0] ^ 1]))
    expect_error(lambda: lt.load_state_dict(bad, job=JOB), libsnap.SnapError, ["checksum"], "flipped manifest byte")
    print("bad input: clear errors")


if __name__ == "__main__":
    sys.exit(main())
