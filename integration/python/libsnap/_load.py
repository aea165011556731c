# SPDX-License-Identifier: BSD-3-Clause
"""libsnap.torch.load_state_dict: a step saved by Checkpointer read into a
plain state_dict from a node store, a flush directory or an export file,
whole or resharded to another world size; no snapsmp, no model needed."""
import collections
import glob
import os
import pickle

import numpy as np
import torch

from . import _capi as C
from ._capi import SnapError
from ._payload import FORMAT, _read_payload


def _to_torch(a, dtype):
    a = np.array(a)   # a private, writable copy
    if dtype == "bf16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if dtype == "bool":
        return torch.from_numpy(a.view(np.bool_))
    if dtype in ("u16", "u32", "u64"):
        raise TypeError(f"dtype {dtype} has no torch equivalent in torch {torch.__version__}")
    return torch.from_numpy(a)


def _find_job(roots, marker, what):
    """The one job under the directories roots that holds a `marker` entry."""
    jobs = sorted({d for root in roots for d in os.listdir(root) if glob.glob(os.path.join(root, d, marker))})
    if len(jobs) != 1:
        raise SnapError(C.EINVAL, f"{what} holds {'no job' if not jobs else 'jobs ' + ', '.join(jobs)}; "
                        "name one with job= (or SNAP_JOB)")
    return jobs[0]


def load_state_dict(source, step=None, *, world_size=None, rank=None, job=None, prefix=""):
    """Read a step saved by Checkpointer into a plain state_dict, without
    snapsmp or a model:

        {"model": {name: tensor}, "optimizer": {"state": ..., "param_groups": ...},
         "extra": {name: value}, "rng": {"torch", "cuda", "numpy", "random"},
         "step": s, "world_size": saved world size, "rank": the rank RNG/extra come from}

    `model` and `optimizer` load with model.load_state_dict() and
    optimizer.load_state_dict(), and torch.save() of the whole writes a plain
    checkpoint file.

    source    a node store (SNAP_STORE, read offline: manifests and slot
              files, every chunk's CRC32C checked), a flush directory (the
              HDF5 rank files, needs h5py; per-node directories as their
              pattern, "D/node%n") or a `snaptool export` file.
    step      default: the newest step every rank committed (store) or the
              newest persisted step (flush directory); an export holds one.
    world_size, rank
              default: whole tensors, the shards reassembled by their global
              shapes and offsets. Given: rank `rank`'s shard of a job of
              `world_size` ranks: at the saved world size exactly the shard
              that rank saved; at another, each sharded tensor split evenly
              (torch.tensor_split) along its sharded dimension, replicated
              tensors whole. RNG states and extra come from the saved rank of
              the same number when it exists, else rank 0.
    job       default: $SNAP_JOB, or the only job in the source.
    prefix    put in front of every model name: "module." loads into a
              DistributedDataParallel wrapper's own load_state_dict()
              (Checkpointer saves a wrapped model by its module's names).

    A ZeroRedundancyOptimizer step (optimizer_class
    "ZeroRedundancyOptimizer(<local class>)"): at the saved world size with
    `rank`, `optimizer` is that rank's shard as its local optimizer
    (zero.optim) reports it, optimizer_layout "zero-shard"; otherwise it is
    consolidated, what ZeroRedundancyOptimizer.state_dict() gives after
    consolidate_state_dict(), optimizer_layout "zero-consolidated", which
    ZeroRedundancyOptimizer.load_state_dict() shards at any world size.
    """
    from . import _files as F
    src = os.fspath(source)
    if (world_size is None) != (rank is None):
        raise TypeError("give both world_size and rank, or neither")
    if world_size is not None and not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    per_rank, glob_regions = None, None
    if os.path.isfile(src):
        step_, saved_world, glob_regions = F.export_regions(src)
        if step is not None and int(step) != step_:
            raise SnapError(C.ENOENT, f"{src} holds step {step_}, not {step}")
        step = step_
    elif "%n" in src:
        # per-node flush directories (snapsmp --ec ... --flush-dir D/node%n)
        if job is None:
            job = os.environ.get("SNAP_JOB")
        if job is None:
            job = _find_job(F.node_dirs(src), "step-*", src)
        step, saved_world, files = F.flush_step(src, job, None if step is None else int(step))
        per_rank = {r: F.rank_file_regions(files[r], job, step, r) for r in range(saved_world)}
    elif os.path.isdir(src):
        if job is None:
            job = os.environ.get("SNAP_JOB")
        if job is None:
            job = _find_job([src], "rank-*" if glob.glob(os.path.join(src, "*", "rank-*")) else "step-*", src)
        elif not os.path.isdir(os.path.join(src, job)):
            raise SnapError(C.ENOENT, f"{src} holds no job {job!r}")
        if glob.glob(os.path.join(src, job, "rank-*")):
            step, saved_world, mans = F.store_step(src, job, None if step is None else int(step))
            per_rank = {r: F.store_regions(m) for r, m in mans.items()}
        else:
            step, saved_world, files = F.flush_step(src, job, None if step is None else int(step))
            per_rank = {r: F.rank_file_regions(files[r], job, step, r) for r in range(saved_world)}
    else:
        raise FileNotFoundError(f"{src}: no such node store, flush directory or export file")

    own = rank if rank is not None and rank < saved_world and glob_regions is None else 0
    names = [g["name"] for g in (glob_regions if glob_regions is not None else per_rank[own])]
    by_rank = None if per_rank is None else {r: {g["name"]: g for g in gs} for r, gs in per_rank.items()}
    metas = [n for n in names if n.startswith("meta/")]
    zero = len(metas) == 1 and metas[0].split("/")[1].startswith("ZeroRedundancyOptimizer(")
    if zero and by_rank is None:
        raise SnapError(C.EUNSUPPORTED, f"{src}: an export file of a ZeroRedundancyOptimizer step keeps one "
                        "rank's optimizer regions of each name; read the node store or the flush directory")
    if by_rank is not None:
        # a ZeRO rank holds the state of its own shard: its own optimizer regions
        common = (lambda ns: {n for n in ns if not n.startswith(("optim/", "meta/"))}) if zero else set
        for r in range(saved_world):
            if common(by_rank[r]) != common(names):
                diff = sorted(common(by_rank[r]) ^ common(names))[:5]
                raise SnapError(C.EMISMATCH, f"step {step}: rank {r} holds other regions than rank {own}: {diff}")
    if len(metas) != 1:
        raise SnapError(C.EFORMAT, f"step {step} of {src} was not saved by libsnap.torch ({len(metas)} meta regions)")

    def region(n):
        return glob_regions_by[n] if by_rank is None else by_rank[own][n]
    glob_regions_by = {g["name"]: g for g in glob_regions} if glob_regions is not None else None

    def payload(n):
        return pickle.loads(_read_payload(region(n)["load"](), n))

    meta = payload(metas[0])
    if meta.get("format") != FORMAT:
        raise SnapError(C.EFORMAT, f"meta format {meta.get('format')} is not {FORMAT}")
    if "regions" in meta:   # HDF5 lists datasets by name: back to the saved (state_dict) order
        pos = {n: i for i, n in enumerate(meta["regions"])}
        names.sort(key=lambda n: pos.get(n, len(pos)))

    def whole(n):
        """The tensor at its global shape."""
        if by_rank is None:
            return glob_regions_by[n]["load"]()
        shards = [by_rank[r][n] for r in range(saved_world)]
        g0 = shards[0]
        if all(tuple(s["shape"]) == tuple(s["global_shape"]) for s in shards):
            return g0["load"]()
        out = np.empty(g0["global_shape"], dtype=F._NP[g0["dtype"]])
        covered, seen = 0, set()
        for s in shards:
            off = tuple(s["shard_offset"])
            if off in seen:
                continue   # a replica of a lower rank's shard
            seen.add(off)
            out[tuple(slice(o, o + d) for o, d in zip(off, s["shape"]))] = s["load"]()
            covered += int(np.prod(s["shape"], dtype=np.int64))
        if covered != out.size:
            raise SnapError(C.EMISMATCH, f"tensor {n!r}: the shards cover {covered} of {out.size} elements")
        return out

    def sharded_dims(n):
        if by_rank is not None:
            ss = [by_rank[r][n] for r in range(saved_world)]
            return [d for d in range(len(ss[0]["global_shape"]))
                    if any(s["shape"][d] != s["global_shape"][d] for s in ss)]
        local, gs, _ = meta.get("shards", {}).get(n, (None, None, None))
        return [] if local is None else [d for d in range(len(gs)) if local[d] != gs[d]]

    def tensor(n):
        g = region(n)
        if world_size is not None and world_size == saved_world and by_rank is not None:
            a = by_rank[rank][n]["load"]()      # exactly what that rank saved
        else:
            a = whole(n)
            if world_size is not None:
                dims = sharded_dims(n)
                if len(dims) > 1:
                    raise SnapError(C.EUNSUPPORTED, f"tensor {n!r} is sharded along dims {dims}; resharding "
                                    "splits one dimension only")
                if dims:
                    a = np.array_split(a, world_size, axis=dims[0])[rank]
        t = _to_torch(a, g["dtype"])
        return t.reshape(meta["shapes"][n]) if n in meta["shapes"] else t

    model = collections.OrderedDict((prefix + n[6:], tensor(n)) for n in names if n.startswith("model/"))
    layout = None
    if "optim-state-dict" in names:
        # the generic path: the optimizer's own state_dict(), pickled whole
        optimizer = payload("optim-state-dict")
        layout = "state_dict"
    elif zero and not (world_size is not None and world_size == saved_world):
        optimizer = _zero_consolidated(by_rank, saved_world, meta)
        layout = "zero-consolidated"
    else:
        state = {}
        for i, keys in meta["state_keys"].items():
            st = {}
            for k in keys:
                rn = f"optim/{i}/{k}"
                st[k] = tensor(rn) if rn in names else meta["state_other"][i][k]
            state[i] = st
        optimizer = {"state": state, "param_groups": meta["param_groups"]}
        layout = "zero-shard" if zero else "plain"
    rng = {"torch": tensor("rng/torch") if "rng/torch" in names else None,
           "cuda": [tensor(n) for n in sorted((n for n in names if n.startswith("rng/cuda/")),
                                              key=lambda n: int(n.rsplit("/", 1)[1]))],
           "numpy": payload("rng/numpy") if "rng/numpy" in names else None,
           "random": payload("rng/random") if "rng/random" in names else None}
    extra = {n[6:]: payload(n) for n in names if n.startswith("extra/")}
    return {"model": model, "optimizer": optimizer,
            "extra": extra, "rng": rng, "step": step, "world_size": saved_world, "rank": own,
            "optimizer_class": meta["optimizer"], "optimizer_layout": layout}


def _zero_consolidated(by_rank, saved_world, meta0):
    """ZeroRedundancyOptimizer.state_dict() after consolidate_state_dict():
    every rank's shard state under its global parameter index, in index
    order, and the exposed param_groups."""
    state = {}
    for r in range(saved_world):
        regions = by_rank[r]
        mn = [n for n in regions if n.startswith("meta/")]
        meta = pickle.loads(_read_payload(regions[mn[0]]["load"](), mn[0]))
        index = meta["zero"]["global_index"]
        for i, keys in meta["state_keys"].items():
            st = {}
            for k in keys:
                rn = f"optim/{i}/{k}"
                if rn in regions:
                    t = _to_torch(regions[rn]["load"](), regions[rn]["dtype"])
                    st[k] = t.reshape(meta["shapes"][rn]) if rn in meta["shapes"] else t
                else:
                    st[k] = meta["state_other"][i][k]
            if index[int(i)] in state:
                raise SnapError(C.ECORRUPT, f"ranks save the state of parameter {index[int(i)]} twice")
            state[index[int(i)]] = st
    return {"state": dict(sorted(state.items())), "param_groups": meta0["zero"]["groups"]}
