# SPDX-License-Identifier: BSD-3-Clause
"""What a snapshot holds, planned at every Checkpointer.save(): one region
per model and optimizer state tensor (registered by pointer), and the
pickled values (meta: param_groups and non-tensor state; the RNGs; extra).

The tensor regions are built once per layout and kept while every tensor is
where it was. Each save reads, for every model and optimizer state tensor,
its address, shape, dtype and contiguity (nothing short of these catches a
tensor replaced, resized or viewed anew at the same address), with the
state_dict() names, the optimizer's state keys, parameters, group sizes and
state count; any difference is a new layout. The pickled values are taken
at every save; a pickle is made again only when a key built from the value
(a deep copy of its plain values: numbers, strings, tuples) differs, and a
value that is not made of plain values is pickled every save."""
import hashlib
import operator
from itertools import chain, repeat
import random

import numpy as np
import torch

from . import _capi as C
from . import _support
from ._entry import _Entry, _nbytes, _reg_shape, _snap_dtype
from ._payload import _HDR, FORMAT, _pack, _room

_T = torch.Tensor
_ptr, _size, _contig = _T.data_ptr, _T.size, _T.is_contiguous
_dtype = operator.attrgetter("dtype")
_SCALARS = (int, bool, str, bytes, type(None))
_M = torch.nn.Module
# what Module.state_dict() reads of each module (torch 2.x adds pre-hooks)
_DICTS = operator.attrgetter(*(["_parameters", "_buffers", "_modules", "_state_dict_hooks"]
                               + (["_state_dict_pre_hooks"] if hasattr(_M(), "_state_dict_pre_hooks") else [])))
_NONPERSIST = operator.attrgetter("_non_persistent_buffers_set")


def _plain_class(c):
    """A module class whose state_dict() is Module's own, item by item."""
    return (c.state_dict is _M.state_dict and c._save_to_state_dict is _M._save_to_state_dict
            and getattr(c, "get_extra_state", _M.get_extra_state) is _M.get_extra_state)


class _ModelState:
    """model.state_dict(keep_vars=True), called again only when it could
    differ: the dict of the last call is kept while every module reachable
    from the model holds the same parameters, buffers, submodules (the same
    objects under the same names), non-persistent buffer names and no
    state_dict hook, and every class involved uses Module's state_dict().
    Reading those is a few dict walks; the call itself is a Python
    recursion over every module (most of a save's time on a cold cache).
    A tensor's own changes (p.data = ..., resize_) keep its object: the
    layout check (_Plan._layout) reads every tensor's address and shape."""

    def __init__(self, model):
        self.model = model
        self.msd = None
        self.vals = None    # (msd, its values) as _Plan._layout last checked them

    @staticmethod
    def _sig(mods):
        """What state_dict() reads of `mods`: names, the objects' identities
        (the cache holds the objects, so an id is not reused), non-persistent
        names, classes. Identities, not ==: a tensor's == is elementwise."""
        dicts = list(chain.from_iterable(map(_DICTS, mods)))
        objs = list(chain.from_iterable(map(dict.values, dicts)))
        return (list(chain.from_iterable(dicts)), list(map(id, objs)), list(map(_NONPERSIST, mods)),
                list(map(type, mods))), objs

    def get(self):
        if self.msd is not None:
            mods, classes, sig = self.key[:3]
            if all(map(_plain_class, classes)):
                now, _ = self._sig(mods)
                if now == sig:
                    return self.msd
        msd = self.model.state_dict(keep_vars=True)
        mods = list(self.model.modules())
        classes = set(map(type, mods))
        (names, ids, nonp, types), objs = self._sig(mods)
        self.msd = self.key = None
        # a state_dict hook or a class with its own: the call every save
        if all(map(_plain_class, classes)) and not any(map(len, chain.from_iterable(
                _DICTS(m)[3:] for m in mods))):
            self.key = (mods, classes, (names, ids, [frozenset(x) for x in nonp], types), objs)
            self.msd = msd
        return msd


def _key(v):
    """A key that equals another value's key only if both pickle to the same
    value: plain values by type and value (floats by their bits, so 0.0 and
    -0.0, 1 and 1.0 differ), tuples element by element. None for anything
    else (it may change in place, or compare equal while differing)."""
    t = type(v)
    if t is float:
        return (float, v.hex())
    if t in _SCALARS:
        return (t, v)
    if t is tuple:
        parts = tuple(map(_key, v))
        return None if None in parts else (tuple, parts)
    return None


def _dict_key(d):
    """_key of a dict built afresh for this save (its values may be shared)."""
    parts = []
    for k, v in d.items():
        kk, kv = _key(k), _key(v)
        if kk is None or kv is None:
            return None
        parts.append((kk, kv))
    return tuple(parts)


def _groups_key(groups):
    """_dict_key of every group as _groups() packs it, but its params (the
    group sizes are the layout's)."""
    out = []
    for g in groups:
        k = _dict_key({k: v for k, v in g.items() if k != "params"})
        if k is None:
            return None
        out.append(k)
    return tuple(out)


class _Plan:
    """The planning half of Checkpointer (a mixin: the state is Checkpointer's)."""

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
        """The layout as of now: (signature, non-tensor optimizer state,
        state keys per parameter index, the state per parameter index).
        Equal signatures -> the tensor entries of the last plan still hold:
        the signature has every model and optimizer state tensor's address,
        shape, dtype and contiguity, the state_dict() names, the state keys,
        the optimizer parameters' addresses, group sizes and state count."""
        kept = self._model_state.vals
        if kept is not None and kept[0] is msd:   # the kept state_dict: its values were checked
            vals = kept[1]
        else:
            vals = list(msd.values())
            if not all(map(isinstance, vals, repeat(_T))):
                for name, t in msd.items():
                    if not isinstance(t, _T):
                        raise TypeError(f"model state {name!r} is a {type(t).__name__}, not a tensor; pass it in extra")
            self._model_state.vals = (msd, vals)
        other = {}
        state = self._opt.state
        if len(state) == len(index) and list(map(id, state)) == list(map(id, index)):
            # the state's keys are the parameters in order: its values line
            # up with them (no lookup: a tensor's hash is Python code)
            sts = list(state.values())
        else:
            sts = list(map(state.get, index))
        if all(sts) and set(map(type, sts)) == {dict}:   # every parameter has state: loops in C
            planned = dict(enumerate(sts))
            keys = dict(enumerate(map(tuple, sts)))
            tensors = list(chain.from_iterable(map(dict.values, sts)))
        else:
            planned = {i: st for i, st in enumerate(sts) if st}
            keys = {i: tuple(st) for i, st in planned.items()}
            tensors = [v for st in planned.values() for v in st.values()]
        if not all(map(isinstance, tensors, repeat(_T))):
            tensors = [v for v in tensors if isinstance(v, _T)]
            for i, st in planned.items():
                for k, v in st.items():
                    if not isinstance(v, _T):
                        other.setdefault(i, {})[k] = v
        ts = vals + tensors
        # one C-level loop per attribute: the cheapest way torch offers to
        # read them (about 0.1 us a tensor each)
        sig = (tuple(msd), tuple(keys.items()), list(map(_ptr, index)), list(map(_ptr, ts)),
               list(map(_size, ts)), list(map(_dtype, ts)), list(map(_contig, ts)),
               tuple(len(g["params"]) for g in self._opt.param_groups), len(state))
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
        msd = self._model_state.get()
        generic = self._okind == "generic"
        index = [] if generic else self._index()
        # Building the tensor entries is most of a save's time; they are
        # kept while the layout is the same. What is saved as a value (the
        # non-tensor state, param_groups, RNGs, extra) is taken every save.
        sig, other, keys, planned = self._layout(msd, index)
        if self._cache is None or self._cache[0] != sig or self._cache[6] is not self.shards:
            self._cache = None
            tensors, tkeys, meta_shapes, shards = self._tensors(msd, index, planned)
            self._cache = (sig, tensors, tkeys, meta_shapes, shards, False, self.shards)
        cache = self._cache
        _, tensors, tkeys, meta_shapes, shards, accounted, _ = cache
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
                asig = (tuple(keys.items()), tuple(k for e, k in zip(tensors, tkeys) if e.name.startswith("optim/")),
                        tuple(map(len, groups)), len(self._opt.state))
                if asig != self._accounted:
                    _support.account(self._opt, planned, groups)
                    self._accounted = asig
                self._cache = cache = cache[:5] + (True,) + cache[6:]
        meta_name = self._meta_name()
        zero = None
        if self._okind == "zero":
            # what ZeroRedundancyOptimizer.state_dict() consolidates: the
            # global index of each local parameter and the exposed groups
            # (an LR scheduler steps those; the shard's follow at step())
            zero = {"global_index": self._zero_index(), "groups": self._groups(self.optimizer.param_groups)}

        def meta():
            m = {"format": FORMAT, "optimizer": self._cls_name(), "param_groups": groups,
                 "state_keys": {i: list(ks) for i, ks in keys.items()}, "state_other": other,
                 "shapes": meta_shapes, "shards": shards, "rank": self.rank, "world_size": self.world_size,
                 "torch": torch.__version__, "optimizer_path": self._okind,
                 "regions": [e.name for e in entries] + [meta_name]}
            if zero is not None:
                m["zero"] = zero
            return _pack(m)

        # the regions list, shapes and shards are the layout's (the cache's
        # identity is part of the key); the values are taken now
        mk = (meta_name, tuple(e.name for e in entries[len(tensors):]), _groups_key(groups),
              tuple((i, _dict_key(st)) for i, st in other.items()),
              None if zero is None else (tuple(zero["global_index"]), _groups_key(zero["groups"])))
        if mk[2] is None or any(k is None for _, k in mk[3]) or (zero is not None and mk[4][1] is None):
            mk = None
        entries.append(self._bytes_entry(meta_name, C.KIND["other"], self._pickled(meta_name, mk, meta, cache)))
        # RNGs: torch's states are copied into buffers of their own (staged).
        entries.append(self._staged("rng/torch", torch.get_rng_state))
        if torch.cuda.is_available():
            for d in range(torch.cuda.device_count()):
                entries.append(self._staged(f"rng/cuda/{d}", lambda d=d: torch.cuda.get_rng_state(d)))
        nst = np.random.get_state()
        nk = None
        if type(nst) is tuple and len(nst) == 5 and isinstance(nst[1], np.ndarray):
            nk = (_key(nst[0]), nst[1].dtype.str, nst[1].tobytes(), _key(nst[2]), _key(nst[3]), _key(nst[4]))
            if None in nk:
                nk = None
        entries.append(self._bytes_entry("rng/numpy", C.KIND["rng"], self._pickled("rng/numpy", nk, lambda: _pack(nst))))
        rst = random.getstate()
        # (version, a tuple of ints, gauss_next): ints compare as they pickle
        rk = (rst[0], rst[1], _key(rst[2])) if type(rst) is tuple and len(rst) == 3 and \
            type(rst[0]) is int and type(rst[1]) is tuple else None
        if rk is not None and rk[2] is None and rst[2] is not None:
            rk = None
        entries.append(self._bytes_entry("rng/random", C.KIND["rng"], self._pickled("rng/random", rk, lambda: _pack(rst))))
        for k, obj in self.extra.items():
            val = obj.state_dict() if hasattr(obj, "state_dict") and callable(obj.state_dict) else obj
            ek = _dict_key(val) if type(val) is dict else _key(val)

            def pack(val=val, k=k):
                try:
                    return _pack(val)
                except Exception as e:
                    raise TypeError(f"extra {k!r}: cannot pickle it ({e})") from None
            entries.append(self._bytes_entry("extra/" + k, C.KIND["other"], self._pickled("extra/" + k, ek, pack)))
        n = len(tensors)
        return entries, tkeys + [e.key() for e in entries[n:]], n

    def _pickled(self, name, key, make, cache=None):
        """make()'s bytes, or the last ones made for `name` when `key` (not
        None) equals the key they were made for."""
        got = self._pickles.get(name)
        if key is not None and got is not None and got[2] is cache and got[0] == key:
            return got[1]
        data = make()
        if key is None:
            self._pickles.pop(name, None)
        else:
            self._pickles[name] = (key, data, cache)
        return data

    def _old(self, name):
        if self._entries is None:
            return None
        return self._by_name.get(name)

    def _bytes_entry(self, name, kind, data):
        old = self._old(name)
        if old is not None and old.payload is data:
            return old
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
