"""Fingerprints and hashes as values: ints, big-endian bytes or rows of 64-bit words,
checked and converted. Every layer takes fingerprints through these functions, so each
form is accepted, and each error worded, alike."""

from __future__ import annotations

import numbers

import numpy as np

from .errors import InputError, InputTypeError

MAX_FP = (1 << 64) - 1


def check_fp(fp):
    """A fingerprint as a Python int, after checking its type and range."""
    if type(fp) is int and 0 <= fp <= MAX_FP:
        return fp                   # the common case, without the generic checks below
    if isinstance(fp, bool) or not isinstance(fp, numbers.Integral):
        raise InputTypeError(
            f"fingerprint must be an int, got {type(fp).__name__} {fp!r:.60}")
    v = int(fp)
    if not 0 <= v <= MAX_FP:
        raise InputError(f"fingerprint {v} is out of range: it must be in [0, 2**64)")
    return v


def fp_array(fps):
    """Fingerprints as a contiguous uint64 array, checking every value."""
    if isinstance(fps, np.ndarray):
        if fps.ndim != 1:
            raise InputError(f"fingerprints must be a 1-d array, got shape {fps.shape}")
        if fps.dtype == np.uint64:
            return np.ascontiguousarray(fps)
        if fps.dtype.kind == "u":
            return fps.astype(np.uint64)
        if fps.dtype.kind == "i":
            if fps.size and fps.min() < 0:
                i = int(np.argmax(fps < 0))
                raise InputError(f"fingerprint {int(fps[i])} at position {i} is negative: "
                                 f"fingerprints must be in [0, 2**64)")
            return fps.astype(np.uint64)
        raise InputTypeError(f"fingerprints must be an integer array, got dtype {fps.dtype}")
    if type(fps) is not list:
        fps = list(fps)
    if set(map(type, fps)) <= {int}:      # ints only (no bool, no float): numpy checks
        try:                               # their range, without a call per value
            return np.array(fps, dtype=np.uint64)
        except OverflowError:
            pass                           # the value out of range is named below
    out = []
    for i, fp in enumerate(fps):
        try:
            out.append(check_fp(fp))
        except InputError as e:
            raise type(e)(f"at position {i}: {e}") from None
    return np.array(out, dtype=np.uint64)


def check_wide_fp(fp, width, what="fingerprint"):
    """A `width`-bit fingerprint as a Python int: an int in [0, 2**width), big-endian
    bytes of exactly width/8, or (width 128 and 256) a row of width/64 uint64 words, most
    significant first, as the (n, words) arrays of fingerprints hold them."""
    if isinstance(fp, np.ndarray) and fp.ndim == 1 and width > 64:
        if fp.dtype != np.uint64 or len(fp) != width // 64:
            raise InputTypeError(f"a {what} as an array is a row of {width // 64} uint64 "
                                 f"words at width {width}, got {fp.dtype} of shape "
                                 f"{fp.shape}")
        v = 0
        for w in fp.tolist():
            v = (v << 64) | w
        return v
    if isinstance(fp, (bytes, bytearray, memoryview)):
        fp = bytes(fp)
        if len(fp) != width // 8:
            raise InputError(f"{what} {fp[:40]!r} is {len(fp)} bytes; a width-{width} "
                             f"{what} in bytes is exactly {width // 8} (big-endian)")
        return int.from_bytes(fp, "big")
    if isinstance(fp, bool) or not isinstance(fp, numbers.Integral):
        raise InputTypeError(f"{what} must be an int or bytes, got {type(fp).__name__} "
                             f"{fp!r:.60}")
    v = int(fp)
    if v < 0 or v >> width:
        raise InputError(f"{what} {v} is out of range: at width {width} it must be in "
                         f"[0, 2**{width})")
    return v


def words_array(values, width, what="fingerprint"):
    """`width`-bit values as a C-contiguous (n, width/64) uint64 array, most significant
    word first: from such an array (or a 1-d one at width 64), or from ints or bytes."""
    words = width // 64
    if isinstance(values, np.ndarray):
        if values.ndim == 1 and words == 1:
            try:
                return fp_array(values).reshape(-1, 1)
            except InputError as e:
                raise type(e)(str(e).replace("fingerprint", what)) from None
        if values.ndim != 2 or values.shape[1] != words:
            raise InputError(f"an array of width-{width} values must have shape "
                             f"(n, {words}), got {values.shape}")
        if values.dtype.kind not in "ui":
            raise InputTypeError(f"{what}s must be an integer array, got dtype {values.dtype}")
        if values.dtype.kind == "i" and values.size and values.min() < 0:
            i = int(np.argmax((values < 0).any(axis=1)))
            raise InputError(f"{what} at position {i} has a negative word: words are "
                             f"unsigned 64-bit")
        return np.ascontiguousarray(values, dtype=np.uint64)
    out = bytearray()
    n = 0
    for n, v in enumerate(values, 1):
        try:
            out += check_wide_fp(v, width, what).to_bytes(width // 8, "big")
        except InputError as e:
            raise type(e)(f"at position {n - 1}: {e}") from None
    return np.frombuffer(bytes(out), dtype=">u8").astype(np.uint64).reshape(n, words)


def fps_array(fps, width):
    """Fingerprints of `width` bits, checked, as the array batch calls take them: (n,)
    uint64 at width 64 (fp_array), (n, width/64) words above (words_array)."""
    return fp_array(fps) if width == 64 else words_array(fps, width)


def words_to_ints(arr):
    """The Python ints of an (n, words) uint64 array, most significant word first."""
    if arr.shape[1] == 1:
        return arr[:, 0].tolist()
    raw = arr.astype(">u8").tobytes()
    step = 8 * arr.shape[1]
    return [int.from_bytes(raw[i:i + step], "big") for i in range(0, len(raw), step)]
