"""Checks and encodings of what the engine stores: ids, records, meta (msgpack).

All msgpack use of the package goes through this module, with fixed options and bounded
input, so a damaged file can never make the decoder allocate without limit.
"""

from __future__ import annotations

import numbers
import struct
from typing import Any, Optional

import msgpack
import numpy as np

from ._layout import ID_TAG_BYTES as _TAG_BYTES, ID_TAG_INT as _TAG_INT
from ._layout import ID_TAG_STR as _TAG_STR, MAX_ID_KEY
from ._records import encode_ids as _encode_ids
from ..errors import CorruptError, InputError, InputTypeError
from ..values import MAX_FP, check_fp, check_wide_fp, fps_array, words_array

MAX_ID_BYTES = MAX_ID_KEY - 1    # LMDB's key limit less the type tag
MAX_META_BYTES = 16 << 20

_NONE = msgpack.packb(None)


def encode_id(id_):
    """The records key of an id: a type tag then the value, so 1, "1" and b"1" never collide."""
    if isinstance(id_, str):
        try:
            raw = id_.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InputError(f"id {id_!r} is not valid Unicode text: {e.reason}") from None
        tag = _TAG_STR
    elif isinstance(id_, (bytes, bytearray, memoryview)):
        raw = bytes(id_)
        tag = _TAG_BYTES
    elif isinstance(id_, numbers.Integral) and not isinstance(id_, bool):
        v = int(id_)
        if not 0 <= v <= MAX_FP:
            raise InputError(f"id {v} is out of range: int ids must be in [0, 2**64)")
        return _TAG_INT + v.to_bytes(8, "big")
    else:
        raise InputTypeError(
            f"id must be str, bytes or int, got {type(id_).__name__} {id_!r:.60}")
    if len(raw) > MAX_ID_BYTES:
        raise InputError(f"id is {len(raw)} bytes long; the limit is {MAX_ID_BYTES} bytes")
    return tag + raw


def encode_ids(ids):
    """encode_id of every id of a list, compiled for int and str ids."""
    return _encode_ids(ids if type(ids) is list else list(ids), encode_id, MAX_ID_BYTES)


def int_ids(ids):
    """A range or integer numpy array of ids as a uint64 array (records.put makes their
    keys without a Python object per id), after checking the range; None for other ids."""
    if isinstance(ids, range):
        if len(ids) and not (0 <= min(ids[0], ids[-1]) and max(ids[0], ids[-1]) <= MAX_FP):
            bad = ids[0] if not 0 <= ids[0] <= MAX_FP else ids[-1]
            raise InputError(f"id {bad} is out of range: int ids must be in [0, 2**64)")
        if len(ids) and max(ids[0], ids[-1]) >= 1 << 63:
            return None                  # beyond numpy's arange: the generic path
        return np.arange(ids.start, ids.stop, ids.step, dtype=np.int64).astype(np.uint64)
    if isinstance(ids, np.ndarray) and ids.ndim == 1 and ids.dtype.kind in "iu":
        if ids.dtype.kind == "i" and ids.size and ids.min() < 0:
            i = int(np.argmax(ids < 0))
            raise InputError(f"id {int(ids[i])} is out of range: int ids must be in "
                             f"[0, 2**64) (at position {i})")
        return np.ascontiguousarray(ids, dtype=np.uint64)
    return None


def decode_id(key):
    """The id a records key stands for, with its original type."""
    tag, raw = key[:1], key[1:]
    if tag == _TAG_STR:
        return raw.decode("utf-8")
    if tag == _TAG_BYTES:
        return raw
    if tag == _TAG_INT and len(raw) == 8:
        return int.from_bytes(raw, "big")
    raise CorruptError(f"a stored id has an unknown type tag {tag!r}")


def encode_records(items, fingerprints=None, width=64):
    """(id keys, fingerprint array, packed metas) of add_many's arguments, all checked first:
    items (id, fp) or (id, fp, meta), or with `fingerprints` a list of ids and their
    fingerprints. The array is (n,) uint64 at width 64, (n, width/64) above."""
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
        raise InputTypeError(f"add_many takes an iterable of records (or of ids), got "
                             f"{type(items).__name__} {items!r:.60}")
    if fingerprints is not None:
        ints = int_ids(items)
        ids = ints if ints is not None else items.tolist() \
            if isinstance(items, np.ndarray) and items.dtype.kind in "iu" else list(items)
        fps = fps_array(fingerprints, width)
        if len(ids) != len(fps):
            raise InputError(f"add_many got {len(ids)} ids and {len(fps)} fingerprints")
        return (ids if ints is not None else encode_ids(ids)), fps, [_NONE] * len(ids)
    idks, fpl, metas = [], [], []
    for n, item in enumerate(items):
        if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
            raise InputTypeError(
                f"item {n} must be (id, fingerprint) or (id, fingerprint, meta), "
                f"got {item!r:.80}")
        try:
            idks.append(encode_id(item[0]))
            fpl.append(check_fp(item[1]) if width == 64 else check_wide_fp(item[1], width))
            metas.append(pack_meta(item[2] if len(item) == 3 else None, item[0]))
        except InputError as e:
            raise type(e)(f"item {n}: {e}") from None
    if width != 64:
        return idks, words_array(fpl, width), metas
    return idks, np.array(fpl, dtype=np.uint64), metas


# A meta value stored with its text's sketch (simindex/signatures/similarity.py) for the similarity
# check of later text calls: msgpack extension SKETCH_EXT whose data is the sketch's length
# (u16, big-endian), the sketch, the text's shingle count (u64) and the packed meta value.
# unpack() hands back the meta value alone; stored_sketch() the sketch and count.
SKETCH_EXT = 83
MAX_SKETCH_BYTES = 512          # similarity.SKETCH values of 4 bytes
_EXT_DATA_AT = {0xC7: 3, 0xC8: 4, 0xC9: 6}    # ext 8/16/32: where the data begins
_SKETCH_HEAD = struct.Struct(">H")
_SKETCH_COUNT = struct.Struct(">Q")
_EXT_CODE = bytes([SKETCH_EXT])


class Packed(bytes):
    """A meta value already packed (with its text's sketch) by Index.text_record."""


def pack_meta(meta, id_=None, sketch=None):
    """The stored bytes of a meta value; `sketch`: (sketch bytes, shingle count) kept with
    it (see SKETCH_EXT)."""
    if type(meta) is Packed:
        b = bytes(meta)
        try:
            unpack_sketched(b)             # made by text_record; checked all the same
        except CorruptError as e:
            raise InputError(f"a packed meta value is not one simindex made: {e}") from None
        return b
    if isinstance(meta, msgpack.ExtType) and meta.code == SKETCH_EXT:
        raise InputError(f"meta may not be a msgpack extension of type {SKETCH_EXT}: "
                         f"simindex keeps text sketches in it")
    if meta is None and sketch is None:
        return _NONE
    return _packed(msgpack.Packer(use_bin_type=True), meta, id_, sketch)


def pack_metas(metas: list, ids: list, sketches: Optional[list] = None) -> list:
    """pack_meta of many plain meta values (no Packed), with their ids (for errors) and
    optionally their sketches: one packer for all of them."""
    packer = msgpack.Packer(use_bin_type=True)
    if sketches is None:
        return [_packed(packer, m, i, None) for m, i in zip(metas, ids)]
    return [_packed(packer, m, i, s) for m, i, s in zip(metas, ids, sketches)]


def _packed(packer: msgpack.Packer, meta: Any, id_: Any, sketch: Optional[tuple]) -> bytes:
    try:
        b = packer.pack(meta)
    except (TypeError, ValueError, OverflowError) as e:
        packer.reset()
        who = "" if id_ is None else f" of id {id_!r:.60}"
        raise InputError(f"meta{who} cannot be stored as msgpack: {e}") from None
    extra = ""
    if sketch is not None:
        sk, count = sketch
        if len(sk) % 4 or len(sk) > MAX_SKETCH_BYTES or not 0 <= count < 1 << 64:
            raise InputError(f"a text sketch is {len(sk)} bytes of a set of {count}")
        n = 2 + len(sk) + 8 + len(b)       # msgpack's ext 8/16/32 header, then the data
        head = (b"\xc7" + n.to_bytes(1, "big") if n < 1 << 8 else
                b"\xc8" + n.to_bytes(2, "big") if n < 1 << 16 else
                b"\xc9" + n.to_bytes(4, "big"))
        b = b"".join((head, _EXT_CODE, _SKETCH_HEAD.pack(len(sk)), sk,
                      _SKETCH_COUNT.pack(count), b))
        extra = " with the text's sketch"
    if len(b) > MAX_META_BYTES:
        raise InputError(f"meta is {len(b)} bytes packed{extra}; the limit is "
                         f"{MAX_META_BYTES}")
    return b


def _sketched(b):
    """(sketch, shingle count, packed meta value) of stored meta bytes that hold a sketch,
    or None; ValueError when they claim to and do not."""
    at = _EXT_DATA_AT.get(b[0]) if b else None
    if at is None or len(b) < at or b[at - 1] != SKETCH_EXT:
        return None
    size = int.from_bytes(b[1:at - 1], "big")
    if len(b) != at + size:
        raise ValueError(f"its extension holds {len(b) - at} bytes, not {size}")
    if size < 10:
        raise ValueError(f"its text sketch extension of {size} bytes is too short")
    (n,) = _SKETCH_HEAD.unpack_from(b, at)
    end = at + 2 + n
    if n % 4 or n > MAX_SKETCH_BYTES or len(b) < end + 8:
        raise ValueError(f"its text sketch of {n} bytes is not one")
    (count,) = _SKETCH_COUNT.unpack_from(b, end)
    return bytes(b[at + 2:end]), count, b[end + 8:]


def unpack(b, what="value"):
    """Decode msgpack written by this package (a meta value without its sketch); damage
    raises CorruptError."""
    if b == _NONE:
        return None
    try:
        sk = _sketched(b)
        return msgpack.unpackb(b if sk is None else sk[2], raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several unrelated types on damage
        raise CorruptError(f"a stored {what} cannot be decoded: {_why(e)}") from None


def unpack_sketched(b):
    """(meta value, (sketch, shingle count) or None) of stored meta bytes (None: None)."""
    if b is None:
        return None, None
    try:
        sk = _sketched(b)
        if sk is None:
            return unpack(b, "meta value"), None
        return msgpack.unpackb(sk[2], raw=False, strict_map_key=False), sk[:2]
    except CorruptError:
        raise
    except Exception as e:  # msgpack raises several unrelated types on damage
        raise CorruptError(f"a stored meta value cannot be decoded: {_why(e)}") from None


def stored_sketch(b):
    """(sketch, shingle count) kept with stored meta bytes, or None."""
    if b is None:
        return None
    try:
        sk = _sketched(b)
    except Exception as e:
        raise CorruptError(f"a stored meta value cannot be decoded: {_why(e)}") from None
    return None if sk is None else sk[:2]


def _why(e):
    """What a decoding error says, or its kind when it says nothing."""
    return str(e) or f"{type(e).__name__} (not the msgpack this package writes)"


def pack(value):
    return msgpack.packb(value, use_bin_type=True)


# A write-buffer log record: msgpack [id key, fingerprint, meta bytes] (simindex/engine/writebuffer.py);
# the fingerprint is an int at width 64 and big-endian bin of width/8 bytes above.
MAX_LOG_RECORD = 1 + (MAX_ID_BYTES + 1 + 5) + (2 + 1024 // 8) + (MAX_META_BYTES + 5)


def pack_log_record(idkey, fp, meta_bytes, width=64):
    f = fp if width == 64 else fp.to_bytes(width // 8, "big")
    return msgpack.packb([idkey, f, meta_bytes], use_bin_type=True)


def unpack_log_record(b, width=64):
    """(id key, fingerprint as an int, meta bytes) of a write-buffer log record of an index
    of `width` bits, every field checked; CorruptError when it is not one this package
    wrote for that width."""
    if len(b) > MAX_LOG_RECORD:
        raise CorruptError(f"a log record of {len(b)} bytes is longer than any record")
    try:
        v = msgpack.unpackb(b, raw=False, use_list=True, max_bin_len=MAX_META_BYTES,
                            max_str_len=0, max_array_len=3, max_map_len=0, max_ext_len=0)
    except Exception as e:  # msgpack raises several unrelated types on damage
        raise CorruptError(f"a log record cannot be decoded: {e}") from None
    if not (type(v) is list and len(v) == 3 and type(v[0]) is bytes and type(v[2]) is bytes):
        raise CorruptError("a log record is not [id key, fingerprint, meta]")
    idkey, fp, meta = v
    if width == 64:
        if type(fp) is not int or not 0 <= fp <= MAX_FP:
            raise CorruptError(f"a log record's fingerprint {fp!r:.80} is not a 64-bit int")
    elif type(fp) is not bytes or len(fp) != width // 8:
        raise CorruptError(f"a log record's fingerprint {fp!r:.80} is not {width // 8} "
                           f"bytes (the index has width {width})")
    else:
        fp = int.from_bytes(fp, "big")
    try:
        decode_id(idkey)
    except (CorruptError, UnicodeDecodeError):
        raise CorruptError(f"a log record's id key {idkey[:20]!r} is not valid") from None
    if not 1 <= len(idkey) <= MAX_ID_BYTES + 1 or (idkey[:1] == _TAG_INT and len(idkey) != 9):
        raise CorruptError(f"a log record's id key {idkey[:20]!r} has a bad length")
    try:
        msgpack.unpackb(meta, raw=False, strict_map_key=False)
    except Exception as e:
        raise CorruptError(f"a log record's meta cannot be decoded: {e}") from None
    return idkey, fp, meta
