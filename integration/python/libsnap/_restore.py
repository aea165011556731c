# SPDX-License-Identifier: BSD-3-Clause
"""Checkpointer.restore(): ask snapsmp which regions a step holds (or read a
persisted step's layout from its HDF5 files), check them against the model
and optimizer (MismatchError before any byte is written), register, restore,
and put the restored values where they belong. Collective under
torch.distributed: every rank restores the same step (libsnap.torch)."""
import pickle
import random
import re
import warnings

import numpy as np
import torch

from . import _capi as C
from ._capi import MismatchError, SnapError
from ._entry import _TORCH, _Entry, _reg_shape
from ._payload import FORMAT, _read_payload


def _dist():
    d = torch.distributed
    return d if d.is_available() and d.is_initialized() else None


class _Restore:
    """The restore half of Checkpointer (a mixin: the state is Checkpointer's)."""


    def _agree(self, outcome):
        """Every rank's outcome (collective under torch.distributed)."""
        d = _dist()
        if d is None:
            return [outcome]
        out = [None] * d.get_world_size()
        d.all_gather_object(out, outcome)
        return out

    def _raise_any(self, outs, what):
        bad = [(r, o) for r, o in enumerate(outs) if o[0] == "error"]
        if not bad:
            return
        mine = outs[self.rank if len(outs) > 1 else 0]
        if mine[0] == "error":
            r, o = self.rank, mine
        else:
            r, o = bad[0]
        msg = o[2] if len(outs) == 1 else f"rank {r}: {o[2]}"
        if len(bad) > 1 and len(outs) > 1:
            msg += f" (and {len(bad) - 1} more rank(s) failed)"
        if o[1] == C.EMISMATCH:
            raise MismatchError(f"{what}: {msg}")
        raise SnapError(o[1], f"{what}: {msg}")

    def restore(self, step=None):
        """Restore `step` (default: the newest restorable) into the model,
        optimizer, RNGs and extra. Returns the step, or None when there is
        nothing to restore (start from scratch). Raises MismatchError naming
        what differs when the snapshot does not fit; nothing is then written
        and the store is left as it was.

        Collective: every rank restores the same step. With the default, a
        step that one rank cannot restore (a chunk no level holds intact,
        docs/self-healing.md) is given up by all ranks together, and all of
        them restore the next older one; `fell_back_from` then names the
        steps given up. So does a newer step snapsmp passed over (its store
        manifest discarded as damaged at snapsmp's start, its flushed copy
        damaged too), with a RuntimeWarning saying why. An explicit step
        never falls back."""
        self._check_open()
        self.fell_back_from = []
        self._passed = None
        while True:
            got = self._restore_once(step)
            if not isinstance(got, tuple):
                if got is not None and self._passed is not None and self._passed[0] > got:
                    # newer than any step this loop gave up: first in the list
                    self.fell_back_from.insert(0, self._passed[0])
                    warnings.warn(f"restore fell back to step {got}: {self._passed[1]}", RuntimeWarning,
                                  stacklevel=2)
                return got
            # ("damaged", p): snapsmp withdrew rank r's copy of p, so the newest
            # restorable step is now an older one, the same on every rank.
            self.fell_back_from.append(got[1])

    def _restore_once(self, step):
        if self._keys is not None or self._frozen:
            self._reopen()       # a fresh context: the layout will be the snapshot's
        try:
            found = self._describe(step)
            plan = None if found is None else self._match(*found)
            out = ("none",) if found is None else ("ok", found[0])
        except SnapError as e:
            out, plan = ("error", e.code, e.message), None
        outs = self._agree(out)
        self._raise_any(outs, "restore")
        steps = sorted({o[1] for o in outs if o[0] == "ok"})
        if not steps:
            return None
        if len(steps) > 1 or any(o[0] == "none" for o in outs):
            raise SnapError(C.EMISMATCH, "restore: the ranks found different steps to restore: "
                            + ", ".join(f"rank {r}: {o[1] if o[0] == 'ok' else 'none'}" for r, o in enumerate(outs)))
        p, entries, from_disk = plan
        try:
            self._register(entries)
            got = self._ctx.restore(C.STEP_LATEST if from_disk else p)
            if got == p:
                out = ("ok", got)
            elif got is None and from_disk:
                out = ("error", C.ENOENT, f"step {p} is persisted in {self.settings['flush_dir']}, but snapsmp found "
                       "nothing to restore: is it running with that --flush-dir?")
            else:
                out = ("error", C.ENOENT, f"snapsmp restored step {got}, not {p}")
        except SnapError as e:
            out = ("error", e.code, e.message)
        self._frozen = True
        outs = self._agree(out)
        if (step is None and not from_disk and p not in self.fell_back_from and
                any(o[0] == "error" and o[1] == C.ECORRUPT and "no level holds a good copy" in o[2] for o in outs)):
            bad = [r for r, o in enumerate(outs) if o[0] == "error"]
            warnings.warn(f"restore: step {p} is damaged beyond repair on rank(s) {bad}; every rank falls back "
                          "to the next older step", RuntimeWarning, stacklevel=3)
            return ("damaged", p)
        self._raise_any(outs, "restore")
        self._apply(entries)
        self._last = p
        return p

    def _describe(self, step):
        if step is None:
            mem = self._ctx.latest()
            if mem is not None:
                # The newest step, as snapsmp's SNAP_STEP_LATEST picks it: a
                # persisted step newer than the store's (the store discarded
                # its damaged manifest) is loaded by the restore of the
                # latest, after the layout read from its HDF5 files is
                # registered; a newer step no level holds whole is passed
                # over, and the note says so.
                try:
                    found = self._ctx.describe()
                except SnapError as e:
                    if e.code != C.ESTATE or "REGISTER" not in str(e):
                        raise
                    disk = self._disk_layout(None)
                    if disk is None:
                        raise
                    return disk
                m = re.match(r"restore would fall back to step \d+: (step (\d+) .*)", self._ctx.note or "")
                if m and self._passed is None:
                    self._passed = (int(m.group(2)), m.group(1))
                return None if found is None else (found[0], found[1], False)
            disk = self._disk_layout(None)
            if disk is not None:
                return disk
            try:
                found = self._ctx.describe()   # nothing: snapsmp starts the job afresh (rewind)
            except SnapError as e:
                if e.code == C.EPROTO and "REGISTER" in str(e):
                    raise SnapError(C.EPROTO, "snapsmp holds persisted steps of this job in its flush "
                                    "directory; set flush_dir (SNAP_FLUSH_DIR) for the trainer too, so the "
                                    "saved layout can be read from the HDF5 files") from None
                raise
            return None if found is None else (found[0], found[1], False)
        found = self._ctx.describe(int(step))
        if found is not None:
            return (found[0], found[1], False)
        disk = self._disk_layout(int(step))
        if disk is not None:
            newest = self._disk_layout(None)
            if newest is None or newest[0] != int(step):
                raise SnapError(C.ENOENT, f"step {step} is only on disk and is not the newest persisted "
                                "step; snapsmp restores only the newest persisted step from disk")
            return disk
        raise SnapError(C.ENOENT, f"step {step} of job {self.settings['job']} is neither in the node store "
                        "nor persisted")

    def _disk_layout(self, step):
        fd = self.settings["flush_dir"]
        if not fd:
            return None
        from . import _files
        return _files.persisted_layout(fd, self.settings["job"], self.rank, step)

    def _match(self, p, regions, from_disk):
        """Check the snapshot's regions against the model and optimizer and
        plan the registration that restores them. Raises MismatchError."""
        what = f"step {p} of job {self.settings['job']}"
        problems = []
        metas = [r for r in regions if r["name"].startswith("meta/")]
        if len(metas) != 1:
            raise MismatchError(f"{what} was not saved by libsnap.torch (it has {len(metas)} meta regions)")
        _, cls, sizes = metas[0]["name"].split("/", 2)
        mine_cls = self._cls_name()
        if cls != mine_cls:
            raise MismatchError(f"{what} holds {cls} optimizer state, this optimizer is {mine_cls} "
                                "(optimizer type differs)")
        mine_name = self._meta_name()
        if metas[0]["name"] != mine_name:
            why = "the ZeroRedundancyOptimizer partition or " if ";zero:" in sizes else ""
            raise MismatchError(f"{what}: {why}the optimizer's parameter groups differ: the snapshot has group "
                                f"sizes [{sizes}], this optimizer [{mine_name.split('/', 2)[2]}]")
        model = {}
        # A store saved from a DistributedDataParallel model by a libsnap
        # that kept its "module." prefix restores into the unwrapped names.
        saved = [r["name"] for r in regions if r["name"].startswith("model/")]
        pre = "module." if saved and all(n.startswith("model/module.") for n in saved) and \
            not any(n.startswith("module.") for n in self._model.state_dict()) else ""
        for name, t in self._model.state_dict(keep_vars=True).items():
            model["model/" + pre + name] = (name, t)
        params = self._index()
        pname = {t.data_ptr(): n for n, t in self._model.state_dict(keep_vars=True).items()}
        cuda_n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        entries, seen = [], set()
        for r in regions:
            n, shape = r["name"], tuple(r["shape"]) or (r["bytes"] // C.DTYPE_SIZE.get(r["dtype"], 1),)
            seen.add(n)
            if r["dtype"] not in C.DTYPE or r["kind"] not in C.KIND:
                problems.append(f"region {n!r} has an unknown dtype or kind")
                continue
            kind = C.KIND[r["kind"]]
            if n.startswith("model/"):
                if n not in model:
                    problems.append(f"the snapshot holds model tensor {n[6:]!r} ({r['dtype']} {list(shape)}), "
                                    "which this model does not have")
                    continue
                sdn, t = model[n]
                g, o = self._shard(sdn, t)
                e = self._tensor_entry(n, kind, t, g, o)
                if e.dtype != r["dtype"] or e.shape != shape:
                    problems.append(f"model tensor {sdn!r}: the snapshot holds {r['dtype']} {list(shape)}, "
                                    f"this model has {e.dtype} {list(t.shape)}")
                elif e.gshape != tuple(r["global_shape"]) or e.offset != tuple(r["shard_offset"]):
                    problems.append(f"model tensor {sdn!r}: saved as the shard at {list(r['shard_offset'])} of "
                                    f"{list(r['global_shape'])}, this rank holds the shard at {list(e.offset)} "
                                    f"of {list(e.gshape)}")
                entries.append(e)
            elif n.startswith("optim/"):
                try:
                    _, i, key = n.split("/", 2)
                    p_ = params[int(i)]
                except (ValueError, IndexError):
                    problems.append(f"the snapshot holds optimizer state {n!r} for a parameter this optimizer "
                                    f"does not have ({len(params)} parameters)")
                    continue
                old = self._opt.state.get(p_, {}).get(key)
                dt = _TORCH[r["dtype"]]
                dev = p_.device if r["device"] == C.DEVICE_CUDA and p_.is_cuda else torch.device("cpu")
                if (torch.is_tensor(old) and old.dtype == dt and _reg_shape(old.shape) == shape and
                        old.is_contiguous() and old.device == dev):
                    t = old.detach()
                else:
                    t = torch.empty(shape, dtype=dt, device=dev)
                g = o = None
                pn = pname.get(p_.data_ptr())
                if pn is not None and tuple(r["global_shape"]) != shape:
                    g, o = tuple(r["global_shape"]), tuple(r["shard_offset"])
                entries.append(_Entry(n, kind, r["dtype"], shape, g, o, tensor=t))
            elif n.startswith("rng/torch") or n.startswith("rng/cuda/"):
                if n.startswith("rng/cuda/") and int(n.rsplit("/", 1)[1]) >= cuda_n:
                    warnings.warn(f"{what}: {n} (a CUDA generator) has no device here; it is not restored")
                e = _Entry(n, kind, r["dtype"], shape, tensor=torch.empty(shape, dtype=_TORCH[r["dtype"]]))
                entries.append(e)
            elif n.startswith("meta/") or n.startswith("rng/") or n.startswith("extra/") or n == "optim-state-dict":
                if n.startswith("extra/") and n[6:] not in self.extra:
                    problems.append(f"the snapshot holds extra {n[6:]!r}, which this Checkpointer was not given")
                    continue
                room = int(r["bytes"])
                entries.append(_Entry(n, kind, "u8", (room,), buf=np.zeros(room, np.uint8), room=room,
                                      payload=b""))
            else:
                problems.append(f"the snapshot holds region {n!r}, which libsnap.torch does not know")
        generic = "optim-state-dict" in seen
        if generic != (self._okind == "generic"):
            problems.append("the snapshot holds the optimizer's state " + (
                "as its pickled state_dict() (optimizer_state='state_dict'), this Checkpointer registers it "
                "tensor by tensor" if generic else "tensor by tensor, this Checkpointer takes it through its "
                "state_dict() (optimizer_state='state_dict')"))
        for n, (sdn, t) in model.items():
            if n not in seen:
                problems.append(f"model tensor {sdn!r} ({list(t.shape)}) is not in the snapshot")
        for k in self.extra:
            if "extra/" + k not in seen:
                problems.append(f"extra {k!r} is not in the snapshot")
        if problems:
            more = f" (and {len(problems) - 6} more)" if len(problems) > 6 else ""
            raise MismatchError(f"{what} does not fit: " + "; ".join(problems[:6]) + more)
        return p, entries, from_disk

    def _apply(self, entries):
        """After a restore: put what the snapshot holds where it belongs."""
        by = {e.name: e for e in entries}
        meta = pickle.loads(_read_payload(by[self._meta_name()].buf, "meta"))
        if meta.get("format") != FORMAT:
            raise SnapError(C.EFORMAT, f"meta format {meta.get('format')} is not {FORMAT}")
        shapes = meta["shapes"]
        params = self._index()
        if self._okind == "generic":
            # the optimizer's own state_dict(), through its own load_state_dict()
            self._opt.load_state_dict(pickle.loads(_read_payload(by["optim-state-dict"].buf, "optim-state-dict")))
        else:
            # optimizer state, as the snapshot has it (keys in the saved order)
            self._opt.state.clear()
        for i, keys in meta["state_keys"].items():
            st = {}
            for k in keys:
                rn = f"optim/{i}/{k}"
                if rn in by:
                    t = by[rn].tensor
                    st[k] = t.view(shapes[rn]) if rn in shapes else t
                else:
                    st[k] = meta["state_other"][i][k]
            self._opt.state[params[i]] = st
        for g, saved in zip(self._opt.param_groups, meta["param_groups"]):
            for k, v in saved.items():
                if k != "params":
                    g[k] = v
        if self._okind == "zero":
            for g, saved in zip(self.optimizer.param_groups, meta["zero"]["groups"]):
                for k, v in saved.items():
                    if k != "params":
                        g[k] = v
        torch.set_rng_state(by["rng/torch"].tensor)
        if torch.cuda.is_available():
            for d in range(torch.cuda.device_count()):
                if f"rng/cuda/{d}" in by:
                    torch.cuda.set_rng_state(by[f"rng/cuda/{d}"].tensor, d)
        np.random.set_state(pickle.loads(_read_payload(by["rng/numpy"].buf, "rng/numpy")))
        random.setstate(pickle.loads(_read_payload(by["rng/random"].buf, "rng/random")))
        for k, obj in self.extra.items():
            val = pickle.loads(_read_payload(by["extra/" + k].buf, "extra/" + k))
            if hasattr(obj, "load_state_dict") and callable(obj.load_state_dict):
                obj.load_state_dict(val)
            else:
                self.extra[k] = val
        # The registered layout is the restored one; the next save compares
        # against it (0-dim state was registered as [1]: same memory).
        for e in entries:
            if e.payload is not None:
                e.payload = b""
        self._entries = entries
        self._by_name = by
        self._keys = [e.key() for e in entries]
        self._written = {}      # the buffers hold the restored bytes now
