"""The manifest: magic, format version and every parameter of an index, checked on open."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Optional

from ._layout import (
    FORMAT_CLASSIC, FORMAT_FLIPS, FORMAT_LEDGERS, FORMAT_VERSION as FORMAT, LAYOUT_V1,
    LAYOUT_V2 as LAYOUT, MANIFEST as NAME, MANIFEST_MAGIC as MAGIC, SLAB_BYTES, V1_MAX_ENTRIES, WIDTH,
)
from .._version import __version__ as _version
from .codec import pack, unpack
from ..scheme_names import NAMES, known as known_scheme
from ..errors import CorruptError, FormatError, NotAnIndexError, ParameterError, StorageError
from .plan import WIDTHS, Plan

MAX_LEDGERS = 1024

# Slab layouts a table may hold, and the field that names each one's slab size: v1 (16
# bytes per entry; still read) and v2 (offset-coded entries, ~10 bytes; what this version
# writes). A writable open upgrades the manifest to v2 before its first write, so older
# code refuses an index that may hold v2. The layout and field names are on disk: they keep
# the word "block" for a slab.
_LAYOUTS = {LAYOUT_V1: ("block_entries", V1_MAX_ENTRIES), LAYOUT: ("block_bytes", SLAB_BYTES)}
_MAX_BYTES = 1 << 16


def make(plan, scheme=None, calibration=None) -> dict:
    """The manifest of a new index with `plan`, fingerprint `scheme` and the `calibration`
    of its radius (or None), in format 3: its records carry checksums, so versions that
    read only formats 1 and 2 refuse it rather than misread them."""
    m = {"magic": MAGIC, "format": FORMAT, "width": plan.width, "k": plan.k,
         "blocks": plan.blocks, "prefix_blocks": plan.prefix_blocks, "shards": plan.shards,
         "tables": plan.ntables, "layout": LAYOUT, "block_bytes": SLAB_BYTES,
         "scheme": scheme, "created_by": f"simindex {_version}"}
    if calibration is not None:
        m["calibration"] = dict(calibration)
    return m


def write(dirpath, manifest):
    """Write atomically: a temporary file, fsync, rename, fsync of the directory."""
    path = os.path.join(dirpath, NAME)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(pack(manifest))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise StorageError(e.errno, f"cannot write {path}: {e.strerror}") from None


@dataclass(frozen=True)
class Manifest:
    """The manifest of one index, read and checked once per open and passed down from
    there: its fields as attributes, and what callers make of them (the Plan, whether
    records carry checksums, the check of reopen parameters). It pickles (the Ray servers
    get it from the driver); its Plan is built again where it is first asked for."""

    path: str                        # the index directory it was read from
    format: int
    width: int
    k: int
    blocks: int
    prefix_blocks: Optional[int]     # None in format 1: blocks - k
    shards: int
    tables: int
    layout: str
    scheme: Optional[str]            # the scheme's name, also where the file holds an alias
    created_by: Optional[str]
    ledgers: int                     # environments the records are split over (by id)
    _file: dict = field(repr=False, compare=False)   # the fields as the file holds them

    @property
    def calibration(self) -> Optional[dict]:
        """The stored calibration (a copy), or None; where the file names the index's
        scheme by an alias, the calibration names it by its name too."""
        cal = self._file.get("calibration")
        if cal is None:
            return None
        if self._file.get("scheme") != self.scheme:
            return dict(cal, scheme=self.scheme)
        return dict(cal)

    @property
    def raw(self) -> dict:
        """The fields as the file holds them (a copy: an alias stays an alias), for
        writing it back."""
        return dict(self._file)

    @property
    def record_sums(self) -> bool:
        """Whether the index's records carry checksums (format 3)."""
        return self.format >= FORMAT

    def with_ledgers(self, ledgers: int) -> dict:
        """The fields of this manifest for the same index split over `ledgers` ledgers
        (format 4; one ledger keeps the file's own format)."""
        raw = self.raw
        raw.pop("ledgers", None)
        if ledgers > 1:
            raw.update(format=FORMAT_LEDGERS, ledgers=ledgers)
        return raw

    @cached_property
    def plan(self) -> Plan:
        """The Plan of the stored parameters, built once; CorruptError when no plan has
        them or their table count is not the stored one."""
        try:
            plan = Plan(k=self.k, blocks=self.blocks, shards=self.shards,
                        prefix_blocks=self.prefix_blocks, width=self.width)
        except ParameterError as e:
            raise CorruptError(f"{self.path}: the manifest holds impossible parameters: "
                               f"{e}") from None
        if plan.ntables != self.tables:
            raise CorruptError(f"{self.path}: the manifest's table count does not match k "
                               f"and blocks")
        return plan

    def check_same(self, **given: Any) -> None:
        """Raise when a parameter passed on reopen differs from the stored one, naming
        both (None: not given)."""
        for name, value in given.items():
            stored = getattr(self, name)
            if name == "prefix_blocks" and stored is None:
                stored = self.blocks - self.k                         # format 1
            if value is not None and stored != value:
                raise ParameterError(
                    f"{name}={value!r} was given, but the index was built with "
                    f"{name}={stored!r}; reopen without it or with the stored value")

    def __getstate__(self) -> dict:
        """The fields without the built Plan: its compiled tables do not pickle."""
        state = dict(self.__dict__)
        state.pop("plan", None)
        return state


def read(dirpath) -> Manifest:
    """The manifest of the index at `dirpath`, each field checked; raises with the reason.
    Its scheme (and its calibration's) is the scheme's name, also where the file records an
    alias: the file keeps what it records."""
    return _manifest(dirpath, _load(dirpath))


def _manifest(dirpath, m: dict) -> Manifest:
    """The Manifest of the checked fields `m` of the file in `dirpath`."""
    return Manifest(path=dirpath, format=m["format"], width=m["width"], k=m["k"],
                    blocks=m["blocks"], prefix_blocks=m.get("prefix_blocks"),
                    shards=m["shards"], tables=m["tables"], layout=m["layout"],
                    scheme=known_scheme(m.get("scheme")), created_by=m.get("created_by"),
                    ledgers=m.get("ledgers", 1), _file=m)


def _load(dirpath):
    """The manifest as the file holds it, each field checked."""
    path = os.path.join(dirpath, NAME)
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        raise NotAnIndexError(f"{dirpath} is not a simindex index: {NAME} is missing") from None
    except IsADirectoryError:
        raise CorruptError(f"{path} is a directory, not a manifest") from None
    if len(raw) > _MAX_BYTES:
        raise CorruptError(f"{path} is larger than any manifest ({_MAX_BYTES} bytes)")
    if not raw:
        raise CorruptError(f"{path} is empty")
    m = unpack(raw, what=f"manifest ({path})")
    if not isinstance(m, dict) or m.get("magic") != MAGIC:
        raise CorruptError(f"{path} is not a simindex manifest (bad magic)")
    fmt = m.get("format")
    if isinstance(fmt, bool) or fmt not in (FORMAT_CLASSIC, FORMAT_FLIPS, FORMAT,
                                            FORMAT_LEDGERS):
        raise FormatError(f"{path} has on-disk format {fmt!r}; this simindex reads formats "
                          f"{FORMAT_CLASSIC} to {FORMAT_LEDGERS}")
    ledgers = m.get("ledgers")
    if (fmt == FORMAT_LEDGERS) != (ledgers is not None) or (ledgers is not None and (
            isinstance(ledgers, bool) or not isinstance(ledgers, int) or
            not 2 <= ledgers <= MAX_LEDGERS)):
        raise CorruptError(f"{path}: format {fmt} with field 'ledgers' {ledgers!r} (format "
                           f"{FORMAT_LEDGERS} holds a count of 2 to {MAX_LEDGERS} ledgers, "
                           f"other formats none)")
    if (fmt != FORMAT_CLASSIC) != ("prefix_blocks" in m):
        raise CorruptError(f"{path}: format {fmt} "
                           f"{'has no' if fmt == FORMAT_CLASSIC else 'needs'} field "
                           f"'prefix_blocks'")
    layout = m.get("layout")
    field, value = _LAYOUTS.get(layout, (None, None)) if isinstance(layout, str) else (None, None)
    width = m.get("width")
    if field is None or m.get(field) != value or width not in WIDTHS or \
            (width != WIDTH and (fmt == FORMAT_CLASSIC or layout != LAYOUT)):
        raise FormatError(f"{path} names layout {m.get('layout')!r}, width {width!r}, format "
                          f"{fmt}; this simindex reads {' or '.join(_LAYOUTS)} at width "
                          f"{WIDTH}, and {LAYOUT} in formats {FORMAT_FLIPS} and {FORMAT} at "
                          f"widths {', '.join(map(str, WIDTHS[1:]))}")
    scheme = m.get("scheme")
    if scheme is not None and known_scheme(scheme) is None:
        raise FormatError(f"{path}: the index uses fingerprint scheme {scheme!r}, which this "
                          f"simindex does not know (known: {', '.join(NAMES)})")
    cal = m.get("calibration")
    if cal is not None and not _calibration_ok(cal, m):
        raise CorruptError(f"{path}: field 'calibration' is {cal!r:.200}, not the calibration "
                           f"of this index's radius")
    counts = ("k", "blocks", "shards", "tables") + \
        (("prefix_blocks",) if fmt != FORMAT_CLASSIC else ())
    for field in counts:
        v = m.get(field)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise CorruptError(f"{path}: field {field!r} is {v!r}, not a count")
    return m


_CALIBRATION = {"scheme": str, "width": int, "k": int, "min_similarity": float,
                "measure": str, "recall": float, "expected_recall": float}


def _calibration_ok(cal, m) -> bool:
    """A stored calibration has its fields with their types, names the index's own scheme,
    width and k, a threshold in (0, 1] and shares in [0, 1]."""
    if not isinstance(cal, dict) or set(cal) != set(_CALIBRATION):
        return False
    for name, kind in _CALIBRATION.items():
        v = cal[name]
        if isinstance(v, bool) or not isinstance(v, (int, float) if kind is float else kind):
            return False
    scheme = known_scheme(cal["scheme"])
    return (scheme is not None and scheme == known_scheme(m.get("scheme")) and
            cal["width"] == m.get("width") and
            cal["k"] == m.get("k") and 0 < cal["min_similarity"] <= 1 and
            0 < cal["recall"] < 1 and 0 <= cal["expected_recall"] <= 1 and
            cal["measure"] in ("jaccard", "containment"))


def check_calibration(calibration, scheme, plan) -> None:
    """Refuse, before a new index is made, a calibration that is not one of this index's
    scheme, width and k (a manifest holding it would not open)."""
    if not _calibration_ok(calibration, {"scheme": scheme, "width": plan.width,
                                         "k": plan.k}):
        raise ParameterError(
            f"calibration={calibration!r:.300} is not a calibration of scheme {scheme!r} at "
            f"width {plan.width} and k={plan.k} (see simindex.calibrate and "
            f"Calibration.stored())")


def upgrade(m: Manifest) -> Manifest:
    """Name the current slab layout in an older index's manifest before writing to it
    (every other field as the file holds it)."""
    if m.layout == LAYOUT:
        return m
    raw = m.raw
    del raw[_LAYOUTS[m.layout][0]]
    raw.update(layout=LAYOUT, block_bytes=_LAYOUTS[LAYOUT][1])
    write(m.path, raw)
    return replace(m, layout=LAYOUT, _file=raw)
