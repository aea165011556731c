# SPDX-License-Identifier: BSD-3-Clause
"""libsnap.torch: snapshots of a PyTorch model, its optimizer and every RNG,
taken every step without stopping training, restored bit-exact after a crash.

    ckpt = libsnap.torch.Checkpointer(model, optimizer, extra={"sched": sched})
    start = (ckpt.restore() or 0) + 1        # collective under torch.distributed
    for step in range(start, steps + 1):
        loss = model(batch()).backward()
        optimizer.step()                      # waits for the last snapshot's copy first
        sched.step()
        ckpt.save(step)                       # returns at once; copy threads work behind
    ckpt.close()

What a snapshot holds, one region each (`snaptool inspect` shows them):

  model/<name>          every parameter and buffer, by state_dict name, read
                        in place (registered by pointer: no copy on this side)
  optim/<i>/<key>       every optimizer state tensor (Adam's exp_avg,
                        exp_avg_sq and step tensors ...), i numbering the
                        optimizer's parameters as optimizer.state_dict() does
                        (ZeroRedundancyOptimizer: its local optimizer's, this
                        rank's shard)
  optim-state-dict      instead, for LBFGS and optimizer_state="state_dict":
                        the optimizer's own state_dict(), pickled
  meta/<Class>/<sizes>  a pickle: param_groups (lr ...), non-tensor optimizer
                        state, true shapes; the optimizer class and the group
                        sizes are in the name, so a restore checks them first
  rng/torch, rng/cuda/<d>, rng/numpy, rng/random
                        torch's CPU and CUDA generators, numpy's and Python's
  extra/<key>           each `extra` object: state_dict() if it has one, else
                        the value itself, pickled

Pickled regions hold an 8-byte little-endian length and the pickle, in a
region with room to spare; one that outgrows its room is given a larger one.

The layout of a snapshot is fixed when it is registered (snap.h). A tensor
replaced, resized or new since (Adam creates its state at its first step) is
found at the next save(), and the context is re-opened with the new layout
before that save: nothing is ever snapshotted from memory that is no longer
the model's. Re-opening withdraws no committed step (tests/smp/test_describe.c).

Restore in a fresh process first asks snapsmp which regions the step holds
(snap_describe), checks them against the model and optimizer, creates the
optimizer state the snapshot has, registers, and restores, so a mismatch
(another model shape, optimizer type or world size, a missing rank) raises
MismatchError naming what differs before any byte is written, and leaves
the store as it was.
"""
import atexit
import hashlib
import os
import pickle
import random
import struct
import types
import warnings
import weakref

import numpy as np
import torch

from . import _capi as C
from ._capi import MismatchError, SnapError
from ._entry import _TORCH, _Entry, _nbytes, _reg_shape, _snap_dtype
from ._load import load_state_dict
from ._payload import _HDR, FORMAT, _pack, _read_payload, _room
from ._support import UnsupportedError, account, classify, unwrap_model


__all__ = ["Checkpointer", "load_state_dict", "MismatchError", "SnapError", "UnsupportedError"]


def _dist():
    d = torch.distributed
    return d if d.is_available() and d.is_initialized() else None


class Checkpointer:
    """Snapshots of `model`, `optimizer`, the RNGs and `extra` into the node's
    snapsmp. See the module docstring.

    extra     dict of name -> object with state_dict()/load_state_dict() (LR
              scheduler, GradScaler, data loader position) or a picklable
              value (restored into `ckpt.extra[name]`).
    job, store, codec, and every other field of struct snap_config by its C
              name (copy_threads, timeout_ms, chunk_size, ...), and flush_dir
              (where snapsmp persists, to read a persisted step's layout):
              override the SNAP_* variables. snapsmp's own settings
              (mem_limit, slots, flush_*) are its flags, not these. codec: "lossless", "abs:1e-3",
              "rel:1e-3" (for params and optimizer state) or a dict
              {"param": ..., "optim": ...}.
    shards    how tensors are sharded across ranks, for export and
              resharding: dict state_dict name -> (global_shape, offset),
              or a callable (name, tensor) -> that or None. Unsharded
              (every rank holds the whole tensor) by default. An optimizer
              state tensor of its parameter's shape follows the parameter.
    fence_forward  fence before every forward (a pre-hook on the model), for
              models whose forward writes registered memory (BatchNorm's
              running statistics). Default: when the model has buffers.
    optimizer_state  None: the optimizer's state tensors are registered by
              pointer (every torch.optim optimizer but LBFGS, and
              ZeroRedundancyOptimizer's shard over them); "state_dict": its
              own state_dict() is pickled each save and restored with its
              load_state_dict() (for a custom optimizer whose state_dict()
              holds all its state; LBFGS always goes this way).

    What is supported and what is refused: docs/torch.md. An optimizer or
    model the Checkpointer cannot capture completely (an unknown optimizer
    class, FullyShardedDataParallel) raises UnsupportedError naming the
    class here; an optimizer whose state_dict() holds state the snapshot
    would miss raises it at the save that would register it. A
    DistributedDataParallel or DataParallel model is snapshotted as its
    .module, under the module's names.

    Ranks come from torch.distributed when it is initialized, else from
    SNAP_RANK / SNAP_WORLD_SIZE (or RANK / WORLD_SIZE, OMPI_*, PMI_*,
    SLURM_*). With torch.distributed, restore() is collective.
    """

    def __init__(self, model, optimizer, *, extra=None, job=None, store=None, codec=None, shards=None,
                 fence_forward=None, optimizer_state=None, **settings):
        if optimizer_state not in (None, "state_dict"):
            raise TypeError(f"optimizer_state is None or 'state_dict', got {optimizer_state!r}")
        # refused before anything connects or registers
        self._model = unwrap_model(model)
        self._okind, self._opt = classify(optimizer, optimizer_state == "state_dict")
        self.model, self.optimizer = model, optimizer
        self.extra = dict(extra or {})
        for k in self.extra:
            if not isinstance(k, str) or not k:
                raise TypeError(f"extra keys must be non-empty strings, got {k!r}")
        self.shards = shards
        over = dict(settings)
        over.update(job=job, store=store)
        if codec is not None:
            spec = codec if isinstance(codec, dict) else {"param": codec, "optim": codec}
            for k, v in spec.items():
                if k not in ("param", "optim"):
                    raise TypeError(f"codec keys are 'param' and 'optim', got {k!r}")
                over["codec_" + k] = v
        d = _dist()
        if d is not None:
            over.setdefault("rank", d.get_rank())
            over.setdefault("world_size", d.get_world_size())
            if "LOCAL_RANK" in os.environ:
                over.setdefault("local_rank", int(os.environ["LOCAL_RANK"]))
        elif not os.environ.get("SNAP_RANK") and "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            # torchrun's variables, before init_process_group
            over.setdefault("rank", int(os.environ["RANK"]))
            over.setdefault("world_size", int(os.environ["WORLD_SIZE"]))
        self.cfg, py = C.config(over)
        self.settings = C.config_dict(self.cfg, py)
        self.rank, self.world_size = self.cfg.rank, self.cfg.world_size
        self._ctx = C.Context(self.cfg)
        self._keys = None          # region keys registered on the context, in order
        self._entries = None
        self._frozen = False       # the context has saved or restored: layout fixed
        self._last = None
        self.fell_back_from = []   # steps the last restore() gave up (damaged beyond repair)
        self._relayouts = 0
        self._accounted = None     # the optimizer layout last checked against its state_dict()
        self._cache = None         # (layout, its tensor entries, ...) of the last plan: _plan()
        self._cuda = False
        self._wrap_step()
        self._hook = None
        me = weakref.ref(self)   # the model and optimizer must not keep the Checkpointer alive
        if fence_forward is None:
            fence_forward = any(True for _ in self._model.buffers())
        if fence_forward:
            self._hook = self._model.register_forward_pre_hook(lambda m, inp: me() is not None and me().fence())
        self._atexit = lambda: me() is not None and me().close()
        atexit.register(self._atexit)

    # ---- the fence in the optimizer's step --------------------------------

    def _wrap_step(self):
        opt = self.optimizer
        had = "step" in vars(opt)
        orig = opt.step
        me = weakref.ref(self)

        def step(_opt, *args, **kwargs):
            c = me()
            if c is not None and c._ctx is not None:
                c.fence()
            return orig(*args, **kwargs)

        if getattr(orig, "_with_counter", False):   # an LR scheduler's wrapper: keep its marker
            step._with_counter = True
        opt.step = types.MethodType(step, opt)
        self._unwrap = (had, orig)

    def _restore_step(self):
        had, orig = self._unwrap
        if had:
            self.optimizer.step = orig
        else:
            self.optimizer.__dict__.pop("step", None)

    # ---- what a snapshot holds --------------------------------------------

    def _shard(self, name, t):
        s = self.shards
        spec = s(name, t) if callable(s) else (s or {}).get(name)
        if spec is None:
            return None, None
        g, o = spec
        return tuple(int(x) for x in g), tuple(int(x) for x in o)

    def _index(self):
        """Optimizer parameters numbered as optimizer.state_dict() numbers them."""
        return [p for g in self._opt.param_groups for p in g["params"]]

    def _cls_name(self):
        if self._okind == "zero":
            return f"ZeroRedundancyOptimizer({type(self._opt).__name__})"
        return type(self.optimizer).__name__

    def _zero_index(self):
        """ZeRO: the global index (in ZeroRedundancyOptimizer.state_dict()) of
        each parameter of this rank's shard, in the shard's order."""
        at = self.optimizer._param_to_index
        return [at[p] for p in self._index()]

    def _meta_name(self):
        sizes = ",".join(str(len(g["params"])) for g in self._opt.param_groups)
        if self._okind == "zero":
            # the partition is in the name, so a restore checks it before writing
            part = ",".join(map(str, self._zero_index()))
            sizes += ";zero:" + hashlib.sha1(part.encode()).hexdigest()[:12]
        cls = self._cls_name()
        name = f"meta/{cls}/{sizes}"
        if len(name) > 200:
            name = f"meta/{cls}/sha1:" + hashlib.sha1(sizes.encode()).hexdigest()[:16]
        return name

    @staticmethod
    def _groups(groups):
        """param_groups as Optimizer.state_dict() packs them."""
        out, i = [], 0
        for g in groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = list(range(i, i + len(g["params"])))
            i += len(g["params"])
            out.append(d)
        return out

    def _tensor_entry(self, name, kind, t, gshape=None, offset=None):
        dt = _snap_dtype(t, name)
        if not t.is_contiguous():
            raise ValueError(f"{name}: a non-contiguous tensor cannot be registered by pointer; make it "
                             "contiguous (e.g. p.data = p.data.contiguous()) before training")
        shape = _reg_shape(t.shape)
        if gshape is not None and len(gshape) != len(shape):
            raise ValueError(f"{name}: shard spec has {len(gshape)} dims, the tensor {len(shape)}")
        return _Entry(name, kind, dt, shape, gshape, offset, tensor=t.detach())

    def _layout(self, msd, index):
        """What the tensor regions of a snapshot are built from, cheaply:
        every model and optimizer state tensor by address, shape, type and
        contiguity, the optimizer's state keys, group sizes and state count.
        Equal -> the tensor entries of the last plan still hold. Also the
        non-tensor optimizer state, to be saved as of now."""
        for name, t in msd.items():
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"model state {name!r} is a {type(t).__name__}, not a tensor; pass it in extra")
        # the address catches a tensor replaced in place (p.data = ...)
        msig = [(t.data_ptr(), t.shape, t.dtype, t.is_contiguous()) for t in msd.values()]
        other, keys, planned = {}, {}, {}
        state = self._opt.state
        for i, p in enumerate(index):
            st = state.get(p)
            if st:
                planned[i] = st
                keys[i] = list(st)
        tensors = [v for st in planned.values() for v in st.values() if isinstance(v, torch.Tensor)]
        if len(tensors) != sum(map(len, planned.values())):
            for i, st in planned.items():
                for k, v in st.items():
                    if not isinstance(v, torch.Tensor):
                        other.setdefault(i, {})[k] = v
        osig = [(v.data_ptr(), v.shape, v.dtype, v.is_contiguous()) for v in tensors]
        osig.append(tuple((i, index[i].data_ptr(), tuple(ks)) for i, ks in keys.items()))
        sig = (tuple(msd), tuple(msig), tuple(osig), tuple(len(g["params"]) for g in self._opt.param_groups), len(state),
               id(self.shards))
        return sig, other, keys, planned

    def _tensors(self, msd, index, planned):
        """The tensor entries of a new layout: (entries, their keys, the
        0-dim shapes, the shards) for the metadata."""
        entries, meta_shapes = [], {}
        pname = {}
        spec_of = {}
        for name, t in msd.items():
            g, o = self._shard(name, t)
            entries.append(self._tensor_entry("model/" + name, C.KIND["param"], t, g, o))
            if t.dim() == 0:
                meta_shapes["model/" + name] = ()
            pname.setdefault(t.data_ptr(), name)
            spec_of[name] = (g, o, tuple(t.shape))
        for i, st in planned.items():
            pn = pname.get(index[i].data_ptr())
            for k, v in st.items():
                if torch.is_tensor(v):
                    rn = f"optim/{i}/{k}"
                    g = o = None
                    if pn is not None and spec_of[pn][0] is not None and tuple(v.shape) == spec_of[pn][2]:
                        g, o = spec_of[pn][0], spec_of[pn][1]
                    # a 0-dim state (Adam's step count) is a counter: kind
                    # "other", so SNAP_CODEC_OPTIM never rounds it
                    kind = C.KIND["other"] if v.dim() == 0 else C.KIND["optim"]
                    entries.append(self._tensor_entry(rn, kind, v, g, o))
                    if v.dim() == 0:
                        meta_shapes[rn] = ()
        # how this rank's shards sit in their tensors: lets an export file
        # (which keeps only global shapes) be resharded along the right dim
        shards = {e.name: (e.shape, e.gshape, e.offset) for e in entries if e.gshape != e.shape}
        return entries, [e.key() for e in entries], meta_shapes, shards

    def _plan(self):
        """Every region of a snapshot as of now, payloads pickled: (entries,
        their keys, how many of them are the tensor entries)."""
        msd = self._model.state_dict(keep_vars=True)
        generic = self._okind == "generic"
        index = [] if generic else self._index()
        # Building the tensor entries is most of a save's time; they are
        # kept while the layout is the same. What is saved as a value (the
        # non-tensor state, param_groups, RNGs, extra) is taken every save.
        sig, other, keys, planned = self._layout(msd, index)
        if self._cache is None or self._cache[0] != sig:
            self._cache = None
            tensors, tkeys, meta_shapes, shards = self._tensors(msd, index, planned)
            self._cache = (sig, tensors, tkeys, meta_shapes, shards, False)
        _, tensors, tkeys, meta_shapes, shards, accounted = self._cache
        entries = list(tensors)
        groups = self._groups(self._opt.param_groups)
        if generic:
            # the optimizer's own state_dict(), pickled whole (tensors copied)
            entries.append(self._bytes_entry("optim-state-dict", C.KIND["optim"], _pack(self._opt.state_dict())))
        else:
            # at each new layout (the state Adam creates at its first step
            # is one): everything its own state_dict() holds must be here
            # (the cached layout is one that was checked)
            if not accounted:
                sig = (tuple((i, tuple(ks)) for i, ks in keys.items()),
                       tuple(k for e, k in zip(tensors, tkeys) if e.name.startswith("optim/")),
                       tuple(map(len, groups)), len(self._opt.state))
                if sig != self._accounted:
                    account(self._opt, planned, groups)
                    self._accounted = sig
                self._cache = self._cache[:5] + (True,)
        meta = {"format": FORMAT, "optimizer": self._cls_name(), "param_groups": groups,
                "state_keys": keys, "state_other": other, "shapes": meta_shapes, "shards": shards,
                "rank": self.rank, "world_size": self.world_size, "torch": torch.__version__,
                "optimizer_path": self._okind,
                "regions": [e.name for e in entries] + [self._meta_name()]}
        if self._okind == "zero":
            # what ZeroRedundancyOptimizer.state_dict() consolidates: the
            # global index of each local parameter and the exposed groups
            # (an LR scheduler steps those; the shard's follow at step())
            meta["zero"] = {"global_index": self._zero_index(), "groups": self._groups(self.optimizer.param_groups)}
        entries.append(self._bytes_entry(self._meta_name(), C.KIND["other"], _pack(meta)))
        # RNGs: torch's states are copied into buffers of their own (staged).
        entries.append(self._staged("rng/torch", torch.get_rng_state))
        if torch.cuda.is_available():
            for d in range(torch.cuda.device_count()):
                entries.append(self._staged(f"rng/cuda/{d}", lambda d=d: torch.cuda.get_rng_state(d)))
        entries.append(self._bytes_entry("rng/numpy", C.KIND["rng"], _pack(np.random.get_state())))
        entries.append(self._bytes_entry("rng/random", C.KIND["rng"], _pack(random.getstate())))
        for k, obj in self.extra.items():
            val = obj.state_dict() if hasattr(obj, "state_dict") and callable(obj.state_dict) else obj
            try:
                data = _pack(val)
            except Exception as e:
                raise TypeError(f"extra {k!r}: cannot pickle it ({e})") from None
            entries.append(self._bytes_entry("extra/" + k, C.KIND["other"], data))
        n = len(tensors)
        return entries, tkeys + [e.key() for e in entries[n:]], n

    def _old(self, name):
        if self._entries is None:
            return None
        return self._by_name.get(name)

    def _bytes_entry(self, name, kind, data):
        old = self._old(name)
        if old is not None and old.payload is not None and _HDR + len(data) <= old.room:
            e = _Entry(name, kind, "u8", (old.room,), buf=old.buf, room=old.room, payload=data)
        else:
            room = _room(len(data))
            e = _Entry(name, kind, "u8", (room,), buf=np.zeros(room, np.uint8), room=room, payload=data)
        return e

    def _staged(self, name, get):
        old = self._old(name)
        src = get()
        if old is not None and old.tensor is not None and _nbytes(old.tensor) == _nbytes(src):
            buf = old.tensor
        else:
            buf = torch.empty_like(src)
        e = _Entry(name, C.KIND["rng"], _snap_dtype(src, name), _reg_shape(src.shape), tensor=buf)
        e.fill = src
        return e

    # ---- registration ---------------------------------------------------

    def _register(self, entries):
        """Register `entries` on a context that has none (re-opening it if it has)."""
        if self._keys is not None or self._frozen:
            self._reopen()
            self._relayouts += 1
        self._keys = []
        for e in entries:
            ptr, n = e.ptr_bytes()
            codec, bound = 0, 0.0
            self._ctx.register(e.name, ptr, n, C.DTYPE[e.dtype], e.kind, e.shape, e.gshape, e.offset,
                               device=e.device, codec=codec, codec_bound=bound)
            self._keys.append(e.key())
        self._entries = entries
        self._by_name = {e.name: e for e in entries}
        self._cuda = any(e.device == C.DEVICE_CUDA for e in entries)

    def _reopen(self):
        """A new context for a new layout. The old one is closed first (it
        waits for its in-flight commit): snapsmp allows one connection per
        rank. Committed steps stay (docs/design/store-and-protocol.md, generations)."""
        ctx, self._ctx = self._ctx, None
        ctx.close()
        cfg = self.cfg
        if self._last is not None and cfg.restore_verify == C.RESTORE_VERIFY.index("auto"):
            # auto checks as it copies only in a context that has neither saved
            # nor restored; this one is new, but the tensors it registers hold
            # the live state of a Checkpointer that has: check every chunk first.
            cfg = C.SnapConfig.from_buffer_copy(self.cfg)
            cfg.restore_verify = C.RESTORE_VERIFY.index("first")
        self._ctx = C.Context(cfg)
        self._frozen = False
        self._keys = None

    def _stream(self):
        return torch.cuda.current_stream().cuda_stream if self._cuda else None

    # ---- the cycle ------------------------------------------------------

    def _check_open(self):
        if self._ctx is None:
            raise SnapError(C.ESTATE, "this Checkpointer is closed")

    def fence(self):
        """Wait until the last snapshot's copy has read the registered memory
        (on the GPU, for CUDA tensors: the current stream waits). The
        optimizer's step() calls it; call it before writing parameters or
        buffers any other way."""
        if self._ctx is not None and self._frozen:
            self._ctx.fence(self._stream())

    def save(self, step):
        """Snapshot everything as `step` (> the last saved or restored step).
        Returns once the copy is queued (fence first if the optimizer has not
        stepped since the last save)."""
        self._check_open()
        step = int(step)
        if self._frozen:
            self._ctx.fence(self._stream())
        entries, keys, n = self._plan()
        if self._keys != keys:
            self._register(entries)
        else:
            # same regions: keep the registered buffers (the plan reused them)
            self._entries = entries
            self._by_name.update((e.name, e) for e in entries[n:])
        for e in entries[n:]:   # the tensor entries are registered memory: nothing to fill
            if e.payload is not None:
                struct.pack_into("<Q", e.buf, 0, len(e.payload))
                e.buf[_HDR:_HDR + len(e.payload)] = np.frombuffer(e.payload, np.uint8)
            elif e.fill is not None:
                e.tensor.copy_(e.fill)
        self._frozen = True
        self._ctx.save(step, self._stream())
        self._last = step

    def wait(self):
        """Wait until the last save is committed by snapsmp; raises if it failed."""
        self._check_open()
        if self._frozen:
            self._ctx.wait()

    def latest(self):
        """The newest step restorable for this job (every rank committed it), or None."""
        self._check_open()
        return self._ctx.latest()

    def flush(self, step=None, wait=True):
        """Ask snapsmp to persist `step` (default: the newest restorable) to its flush directory."""
        self._check_open()
        self._ctx.flush(C.STEP_LATEST if step is None else int(step), wait)

    @property
    def relayouts(self):
        """How many times the context was re-opened with a new layout."""
        return self._relayouts

    # ---- restore --------------------------------------------------------

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
        steps given up. An explicit step never falls back."""
        self._check_open()
        self.fell_back_from = []
        while True:
            got = self._restore_once(step)
            if not isinstance(got, tuple):
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
                found = self._ctx.describe(mem)
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

    # ---- the end ----------------------------------------------------------

    def close(self):
        """Wait for the last snapshot to commit, disconnect, unwrap the optimizer."""
        if self._ctx is None:
            return
        ctx, self._ctx = self._ctx, None
        atexit.unregister(self._atexit)
        self._restore_step()
        if self._hook is not None:
            self._hook.remove()
        try:
            ctx.close()        # waits for the copy of the last save, which reads the buffers below
        finally:
            self._entries = self._by_name = None

    def __del__(self):
        # A Checkpointer dropped without close(): its context must go before
        # the buffers its copy threads may still be reading.
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
