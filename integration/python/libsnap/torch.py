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
import os
import struct
import types
import weakref

import numpy as np
import torch

from . import _capi as C
from ._capi import MismatchError, SnapError
from ._load import load_state_dict
from ._payload import _HDR
from ._plan import _ModelState, _Plan
from ._restore import _Restore, _dist
from ._support import UnsupportedError, classify, unwrap_model


__all__ = ["Checkpointer", "load_state_dict", "MismatchError", "SnapError", "UnsupportedError"]


class Checkpointer(_Plan, _Restore):
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
        self._model_state = _ModelState(self._model)
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
        self._passed = None        # (step, why): a newer step the last restore() passed over (snapsmp said)
        self._relayouts = 0
        self._accounted = None     # the optimizer layout last checked against its state_dict()
        self._cache = None         # (layout, its tensor entries, ...) of the last plan: _plan()
        self._pickles = {}         # region name -> (key, pickle, layout) of its last value: _pickled()
        self._written = {}         # region name -> (buffer, payload) last written into it
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
        self._prepared = False     # the layout was sent ahead (prepare()), or a save or restore sent it
        if self._state_known():
            self._prepare_ahead()

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
            out = orig(*args, **kwargs)
            c = me()
            if c is not None and c._ctx is not None and not c._prepared:
                # Once, after the first step: it created the optimizer's
                # state (Adam's moments), so the layout is known now, a
                # training step before the first save needs it.
                c._prepared = True
                if not c._frozen and c._state_known():
                    c._prepare_ahead()
            return out

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

    def _state_known(self):
        """Whether the optimizer's state exists for every parameter it
        steps (or is taken whole through its state_dict()): the layout the
        first save registers is then the one of now."""
        if self._okind == "generic":
            return True
        st = self._opt.state
        return all(st.get(p) for g in self._opt.param_groups for p in g["params"])

    def prepare(self):
        """Register the layout of now and send it to snapsmp ahead of the
        first save (snap_prepare): the daemon reserves this rank's slot
        files, and in a mesh maps them and makes the parity files, while
        training runs, so the first save and its protect find them ready.
        Called by the constructor when the optimizer's state already exists
        and otherwise after the optimizer's first step() (where an error is
        left for the first save to raise); a save whose layout differs
        registers again, as always. Raises what the first save would: an
        UnsupportedError for state a snapshot would miss, SnapError
        (SNAP_ENOSPC) when the layout does not fit the daemon's budget."""
        self._check_open()
        if self._frozen:
            return
        entries, keys, _ = self._plan()
        if self._keys != keys:
            self._register(entries)
        self._ctx.prepare()
        self._prepared = True

    def _prepare_ahead(self):
        """prepare() where the Checkpointer calls it itself. What it raises
        (a refused optimizer state, SNAP_ENOSPC) the first save raises too:
        it plans and sends the layout again. So the error comes where it
        did without the prepare, from save(), not from the constructor or
        from inside the optimizer's step()."""
        try:
            self.prepare()
        except Exception:
            pass

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
        written = self._written
        for e in entries[n:]:   # the tensor entries are registered memory: nothing to fill
            if e.payload is not None:
                w = written.get(e.name)
                if w is not None and w[0] is e.buf and w[1] is e.payload:
                    continue    # the buffer holds these bytes (only save() and a restore write it)
                struct.pack_into("<Q", e.buf, 0, len(e.payload))
                e.buf[_HDR:_HDR + len(e.payload)] = np.frombuffer(e.payload, np.uint8)
                written[e.name] = (e.buf, e.payload)
            elif e.fill is not None:
                e.tensor.copy_(e.fill)
        self._frozen = self._prepared = True
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
