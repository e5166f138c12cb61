"""Shared test helpers: hypothesis profiles, a brute-force oracle, planted near-duplicates."""

import os
import random
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=40, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "dev", max_examples=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "deep", max_examples=500, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Settings:
    """How a test's index runs: "tuned" (group commit off: every batch reaches the shards'
    runs, merges and slabs at once), "shipped" (the defaults users get: group commit on)
    or "buffered" (the defaults with sync=False: single adds go through the write buffer)."""

    def __init__(self, name):
        self.name = name
        self.sync = name != "buffered"

    def __repr__(self):
        return self.name


SETTINGS = ["tuned", "shipped", "buffered"]


@pytest.fixture
def settings(request):
    """Parametrize a test with `@pytest.mark.parametrize("settings", SETTINGS,
    indirect=True)` to run it under each Settings; open indexes with sync=settings.sync."""
    return Settings(request.param)


@pytest.fixture(autouse=True)
def group_commit(request):
    """In this process tests apply every batch to the shards at once (group commit off), so
    small batches still make the runs, merges and slabs they are written to reach. Tests
    marked group_commit (test_group_commit.py), or run under shipped or buffered Settings,
    run with the shipped GROUP_LIMIT, and so do child processes. The same tests leave every
    merge of more than two slabs' entries for a transaction of its own (MERGE_INLINE), so
    that small indexes take that path too."""
    from simindex import _testing
    from simindex.engine._layout import SLAB_ENTRIES
    callspec = getattr(request.node, "callspec", None)
    shipped = callspec is not None and callspec.params.get("settings", "tuned") != "tuned"
    if request.node.get_closest_marker("group_commit") or shipped:
        yield
    else:
        with _testing.tuned(group=0, merge_inline=2 * SLAB_ENTRIES):
            yield


def fp_of(i, width=64):
    """A fixed, well-spread fingerprint for record number i (at 128 and 256 bits, one such
    word per 64 bits, each shifted by its own constant)."""
    return sum(((i * 0x9E3779B97F4A7C15 + 12345 + w * 0x5851F42D4C957F2D) % 2**64)
               << (width - 64 * (w + 1)) for w in range(width // 64))


def scratch_dir(prefix):
    """A new directory for a test that checks answers, not what reaches the disk (a state
    machine or a property test opening hundreds of indexes): in memory (/dev/shm) where
    the machine has it, so the fsync LMDB makes at every commit of every shard returns at
    once. The same calls are made; the caller removes the directory."""
    shm = "/dev/shm"
    return tempfile.mkdtemp(prefix=prefix, dir=shm if os.access(shm, os.W_OK) else None)


@contextmanager
def scratch(prefix):
    """scratch_dir() for the length of a block (a property test's example), then removed."""
    d = scratch_dir(prefix)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def buffer_logs(path):
    """The write-buffer log files of the index at `path` (their names, sorted)."""
    d = os.path.join(path, "pending")
    return sorted(n for n in os.listdir(d) if n.endswith(".log")) if os.path.isdir(d) else []


if hasattr(int, "bit_count"):                    # Python 3.10 on: several times faster
    def popcount(x):
        """The number of bits set in x (a Python or numpy integer, at any width)."""
        return int(x).bit_count()
else:
    def popcount(x):
        """The number of bits set in x (a Python or numpy integer, at any width)."""
        return bin(x).count("1")


def brute(stored, q, k):
    """{id: distance} of every stored (id -> fp) within k bits of q: the oracle."""
    return {i: d for i, fp in stored.items() if (d := popcount(fp ^ q)) <= k}


def within(found, k):
    """The part of an oracle's {id: distance} within k bits (brute at a smaller k)."""
    return {i: d for i, d in found.items() if d <= k}


def brute_pairs(stored, k):
    """{(id_a, id_b): d} over stored (id -> fp), ids ordered by insertion (dict order)."""
    items = list(stored.items())
    fps = np.array([fp for _, fp in items], dtype=np.uint64)
    out = {}
    for i, (ia, fa) in enumerate(items):
        x = np.bitwise_xor(fps[i + 1:], np.uint64(fa))
        d = np.unpackbits(x.view(np.uint8).reshape(-1, 8), axis=1).sum(axis=1)
        for j in np.nonzero(d <= k)[0]:
            out[(ia, items[i + 1 + j][0])] = int(d[j])
    return out


def flip(fp, bits):
    for b in bits:
        fp ^= 1 << b
    return fp


def planted_family(rng, base, k, width=64):
    """Fingerprints at every distance 0..k+1 from base: bits packed together, spread
    across the word, and on the edge bits 0 and 63."""
    out = []
    for d in range(k + 2):
        start = rng.randrange(0, width - d + 1) if d else 0
        out.append(flip(base, range(start, start + d)))                    # packed
        out.append(flip(base, rng.sample(range(width), d)))                # spread
        edge = ([0, 63] + [b for b in range(1, 63)])[:d]
        out.append(flip(base, edge))                                       # edge bits
    return out


def block_ranges(blocks, width=64):
    """Bit ranges (low, high) of each block, most significant first (README's rule)."""
    base, extra = divmod(width, blocks)
    out, top = [], width
    for b in range(blocks):
        w = base + 1 if b < extra else base
        out.append((top - w, top))
        top -= w
    return out


def one_table_family(rng, base, k, blocks):
    """For every set of k blocks, a fingerprint differing from base by one bit in each of
    them: it shares base's prefix in exactly one table, so each table must do its part."""
    from itertools import combinations
    ranges = block_ranges(blocks)
    out = []
    for combo in combinations(range(blocks), k):
        out.append(flip(base, [rng.randrange(*ranges[b]) for b in combo]))
        if len(out) >= 64:
            break
    return out


def shard_boundary_fps(k):
    """Fingerprints straddling leading-byte (shard) boundaries and the all-0/all-1 words."""
    out = []
    for lead in (0x0F, 0x10, 0x7F, 0x80, 0xFF, 0x00):
        base = (lead << 56) | ((1 << 56) - 1 if lead in (0x0F, 0x7F) else 0)
        out.append(base)
        for b in (56, 57, 59, 60, 63, 0, 1):
            out.append(base ^ (1 << b))
        out.append(flip(base, [56, 57, 58][:k]))
    return out


@pytest.fixture
def rng():
    return random.Random(1234)


def run_py(code, *args, timeout=120, check=True, **kw):
    """Run a Python snippet in a fresh interpreter (real processes, no shared state)."""
    p = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                       text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"subprocess failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


@contextmanager
def ledger_server(path, ledger=0):
    """A Ray ledger server run in this process (its calls, without Ray) on ledger `ledger`
    of the index at `path`, made empty (k=3, 2 shards) when missing."""
    import simindex
    from simindex.distributed.servers import LedgerServer
    from simindex.engine import manifest
    if not os.path.exists(os.path.join(path, manifest.NAME)):
        simindex.Index(path, k=3, shards=2).close()
    led = LedgerServer(manifest.read(str(path)), False, ledger)
    try:
        yield led
    finally:
        led.close()


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray (2 CPUs) for the module, started inside a loopback-only network
    namespace, so no test traffic can leave 127.0.0.0/8."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'simindex[ray]')")
    sandbox = pytest.importorskip("simindex.distributed.sandbox")
    why = sandbox.loopback_only()
    if why:
        pytest.skip(f"no loopback-only network namespace for Ray: {why}")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING",
             object_store_memory=256 << 20)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
