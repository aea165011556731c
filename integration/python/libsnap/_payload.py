# SPDX-License-Identifier: BSD-3-Clause
"""The regions libsnap.torch fills with pickles (meta, numpy and Python RNG
states, extra objects): an 8-byte little-endian length, the pickle, and room
to spare, so a payload that grows a little keeps its region."""
import pickle
import struct

from . import _capi as C
from ._capi import SnapError

FORMAT = 1   # of the meta region's dictionary
_HDR = 8     # bytes of the length header


def _pack(obj):
    return pickle.dumps(obj, protocol=4)


def _room(n):
    """Bytes of a pickled region for a payload of n bytes: room for twice
    that, in whole pages (4 KiB at least)."""
    return (_HDR + max(2 * n, 4096 - _HDR) + 4095) // 4096 * 4096


def _read_payload(buf, name):
    n = struct.unpack_from("<Q", buf, 0)[0]
    if n > len(buf) - _HDR:
        raise SnapError(C.ECORRUPT, f"region {name!r}: length header {n} exceeds its {len(buf) - _HDR} bytes")
    return bytes(buf[_HDR:_HDR + n])
