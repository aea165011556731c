# SPDX-License-Identifier: BSD-3-Clause
"""A region as libsnap.torch registers it (libsnap.torch.Checkpointer): the
torch <-> libsnap dtype names, the registered shape of a tensor, and _Entry,
which says what a region is and where its bytes come from."""
import torch

from . import _capi as C

_DT = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
       torch.uint8: "u8", torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
       torch.bool: "bool"}
_TORCH = {v: k for k, v in _DT.items()}



def _snap_dtype(t, name):
    try:
        return _DT[t.dtype]
    except KeyError:
        raise TypeError(f"{name}: dtype {t.dtype} has no libsnap equivalent "
                        f"(supported: {', '.join(str(d) for d in _DT)})") from None


def _nbytes(t):
    return t.numel() * t.element_size()   # torch 1.13 has no Tensor.nbytes


def _reg_shape(shape):
    """The shape registered for a tensor: a 0-dim tensor is one element, [1]
    (its true shape travels in the meta region)."""
    return tuple(shape) if len(shape) else (1,)




class _Entry:
    """One region: what it is registered as, and where its bytes come from."""
    __slots__ = ("name", "kind", "dtype", "shape", "gshape", "offset", "tensor", "buf", "room", "payload",
                 "fill", "device")

    def __init__(self, name, kind, dtype, shape, gshape=None, offset=None, tensor=None, buf=None, room=0,
                 payload=None, fill=None):
        self.name, self.kind, self.dtype, self.shape = name, kind, dtype, tuple(shape)
        self.gshape = tuple(gshape) if gshape is not None else self.shape
        self.offset = tuple(offset) if offset is not None else (0,) * len(self.shape)
        self.tensor, self.buf, self.room, self.payload, self.fill = tensor, buf, room, payload, fill
        self.device = C.DEVICE_CUDA if tensor is not None and tensor.is_cuda else C.DEVICE_HOST

    def key(self):
        """What must not change between registration and a save."""
        if self.payload is not None:
            return (self.name, "bytes", self.room)
        t = self.tensor
        return (self.name, t.data_ptr(), _nbytes(t), self.dtype, self.shape, self.gshape, self.offset, self.device)

    def ptr_bytes(self):
        if self.payload is not None:
            return self.buf.ctypes.data, self.room
        return self.tensor.data_ptr(), _nbytes(self.tensor)
