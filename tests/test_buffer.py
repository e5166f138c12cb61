"""The write buffer of sync=False indexes: single adds go to a per-process log and memory,
queries see them exactly, and a dead writer's records come back at the next writable open.

Real files and real processes throughout: writers are killed with SIGKILL, logs are cut and
damaged on disk, a disk fills up on a small tmpfs.
"""

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import simindex
from simindex import _testing as hook
from conftest import buffer_logs as logs, fp_of, planted_family, popcount
from trials import ENV, spawn, start_buffered


def oracle(model, q, k):
    """[(id, fp, distance, meta)] of every record within k of q, sorted by distance, then
    insertion order (model: id -> (fp, meta) in the order of each id's latest add)."""
    out = [(i, fp, d, meta) for i, (fp, meta) in model.items() if (d := popcount(fp ^ q)) <= k]
    order = {i: n for n, i in enumerate(model)}
    return sorted(out, key=lambda m: (m[2], order[m[0]]))


def put(model, id_, fp, meta=None):
    model.pop(id_, None)
    model[id_] = (fp, meta)


def markers(idx):
    return hook.log_markers(idx)


@pytest.fixture
def no_age_fold(monkeypatch):
    """Nothing folds by age while a test looks at the buffer (slow machines)."""
    monkeypatch.setattr(*hook.KNOBS["fold_age"], 3600.0)


# ---------------------------------------------------------------- exactness
def test_buffered_queries_equal_a_brute_force_and_the_answers_after_flush(tmp_path, rng,
                                                                          no_age_fold):
    path = str(tmp_path / "i")
    k = 3
    model = {}
    stored = [(f"s{i}", rng.getrandbits(64)) for i in range(300)]
    with simindex.Index(path, k=k, shards=4) as idx:
        idx.add_many([(i, fp, {"n": n}) for n, (i, fp) in enumerate(stored)])
    for n, (i, fp) in enumerate(stored):
        put(model, i, fp, {"n": n})
    idx = simindex.Index(path, sync=False)
    bases = [stored[5][1], stored[6][1], rng.getrandbits(64), 0, (1 << 64) - 1]
    ops = []
    for b, base in enumerate(bases):
        # every distance 0..k+1, bits packed, spread, and on the edges 0 and 63
        for j, fp in enumerate(planted_family(rng, base, k)):
            ops.append((f"p{b}.{j}", fp, [b, j]))
    ops += [("s7", bases[0] ^ 0b11, "replaces a stored id, now near base 0"),
            ("s5", rng.getrandbits(64), "moves a stored near-copy away"),
            ("p0.1", rng.getrandbits(64), None),            # replaces a buffered id
            ("p1.4", bases[1] ^ (1 << 63), "back within k"),  # and another, near again
            (17, bases[2], None), (b"raw", bases[2] ^ 1, None), ("17", bases[2] ^ 3, None)]
    for i, fp, meta in ops:
        idx.add(i, fp, meta=meta)
        put(model, i, fp, meta)
    assert hook.buffered(idx) == len(ops)
    assert len(logs(path)) == 1
    queries = bases + [b ^ (1 << 17) for b in bases] + [rng.getrandbits(64) for _ in range(20)]
    before = {}
    for q in queries:
        for kq in range(k + 1):
            got = idx.query(q, k=kq)
            assert [tuple(m) for m in got] == oracle(model, q, kq)
            before[q, kq] = got
    assert hook.buffered(idx) == len(ops)             # queries never fold
    idx.flush()
    assert hook.buffered(idx) == 0 and logs(path) == []
    for (q, kq), got in before.items():
        assert idx.query(q, k=kq) == got
    assert len(idx) == len(model) and idx.verify() == []
    idx.close()


def test_query_text_and_verify_see_buffered_records(tmp_path, no_age_fold):
    with simindex.Index(tmp_path / "i", sync=False) as idx:
        idx.add_text("a", "the quick brown fox jumps over the lazy dog", meta={"w": 9})
        idx.add_text("b", "the quick brown fox jumps over the lazy cat")
        got = idx.query_text("the quick brown fox jumps over the lazy dog")
        assert got[0].id == "a" and got[0].meta == {"w": 9}
        assert idx.query_text("the quick brown fox jumps over the lazy dog",
                              where=lambda m: m.id != "a") == [m for m in got if m.id != "a"]
        assert hook.buffered(idx) == 2


class BufferMachine(RuleBasedStateMachine):
    """Buffered adds mixed with every other call, against a plain model."""

    BASES = [0, (1 << 64) - 1, 0x0123456789ABCDEF]
    fps = st.builds(lambda b, bits: b ^ sum(1 << x for x in set(bits)),
                    st.sampled_from(BASES), st.lists(st.integers(0, 63), max_size=4))
    ids = st.one_of(st.integers(0, 12), st.text("ab", min_size=1, max_size=2))
    metas = st.one_of(st.none(), st.integers(-5, 5), st.text("xy", max_size=3))

    def __init__(self):
        super().__init__()
        import tempfile
        self.dir = tempfile.mkdtemp(prefix="simindex-buf-")
        self.model = {}
        self.idx = None
        self.saved = None

    @initialize(fold=st.sampled_from([1, 3, 8, 4096]), shards=st.sampled_from([1, 4]))
    def open(self, fold, shards):
        self.saved = hook.tune(fold=fold, fold_age=3600.0)
        self.idx = simindex.Index(f"{self.dir}/i", k=3, shards=shards, sync=False)

    @rule(id_=ids, fp=fps, meta=metas)
    def add(self, id_, fp, meta):
        self.idx.add(id_, fp, meta=meta)
        put(self.model, id_, fp, meta)

    @rule(items=st.lists(st.tuples(ids, fps), max_size=5))
    def add_many(self, items):
        self.idx.add_many(items)
        for id_, fp in items:
            put(self.model, id_, fp)

    @rule(id_=ids)
    def remove(self, id_):
        assert self.idx.remove(id_) == (id_ in self.model)
        self.model.pop(id_, None)

    @rule(id_=ids)
    def get(self, id_):
        r = self.idx.get(id_)
        want = self.model.get(id_)
        assert (r is None and want is None) or (r.fingerprint, r.meta) == want

    @rule(fp=fps, kq=st.integers(0, 3))
    def query(self, fp, kq):
        assert [tuple(m) for m in self.idx.query(fp, k=kq)] == oracle(self.model, fp, kq)

    @rule(fps_=st.lists(fps, max_size=3))
    def query_many(self, fps_):
        got = self.idx.query_many(fps_)
        assert [[tuple(m) for m in ms] for ms in got] == [oracle(self.model, q, 3) for q in fps_]

    @rule()
    def length(self):
        assert len(self.idx) == len(self.model)

    @rule()
    def flush(self):
        self.idx.flush()
        assert hook.buffered(self.idx) == 0

    @rule()
    def reopen(self):
        self.idx.close()
        self.idx = simindex.Index(f"{self.dir}/i", sync=False)

    @invariant()
    def bounded(self):
        if self.idx is not None:
            assert hook.buffered(self.idx) <= hook.KNOBS["fold"][0].FOLD

    def teardown(self):
        try:
            if self.idx is not None:
                assert len(self.idx) == len(self.model)
                assert self.idx.verify() == []
                self.idx.close()
                assert logs(f"{self.dir}/i") == []
        finally:
            hook.tune(**self.saved)
            shutil.rmtree(self.dir, ignore_errors=True)


TestBufferMachine = BufferMachine.TestCase


def test_threads_adding_and_querying_find_every_acknowledged_record(tmp_path, monkeypatch):
    monkeypatch.setattr(*hook.KNOBS["fold"], 16)       # folds all the time, under the queries
    idx = simindex.Index(tmp_path / "i", k=3, shards=4, sync=False)
    acked, errors = [], []
    stop = threading.Event()

    def writer(w):
        for n in range(1500):
            idx.add(f"w{w}.{n}", fp_of(w * 10**6 + n))
            acked.append((f"w{w}.{n}", fp_of(w * 10**6 + n)))

    def reader(seed):
        r = random.Random(seed)
        try:
            while not stop.is_set():
                if not acked:
                    continue
                # acknowledged before the query; half of them just added (most likely in a
                # buffer that another thread is folding)
                n = len(acked)
                i, fp = acked[r.randrange(max(0, n - 8), n) if r.random() < 0.5
                              else r.randrange(n)]
                got = idx.query(fp ^ 0b101)
                assert [m.id for m in got if m.id == i] == [i], (i, got)
                assert all(popcount(m.fingerprint ^ fp ^ 0b101) == m.distance for m in got)
        except BaseException as e:
            errors.append(e)

    readers = [threading.Thread(target=reader, args=(s,)) for s in range(2)]
    writers = [threading.Thread(target=writer, args=(w,)) for w in range(2)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert not errors, errors[0]
    assert len(idx) == 3000 and idx.verify() == []
    for i, fp in acked[::97]:
        assert [m.id for m in idx.query(fp, k=0)] == [i]
    idx.close()


# ---------------------------------------------------------------- other processes
VISIBILITY_READER = r"""
import sys, simindex
fp = lambda i: (i * 0x9E3779B97F4A7C15 + 12345) % 2**64
with simindex.Index(sys.argv[1], readonly=True) as idx:
    print(len(idx), sum(1 for i in range(50) if idx.query(fp(i), k=0)))
"""


def test_another_process_sees_buffered_records_after_the_fold_only(tmp_path):
    path = str(tmp_path / "i")
    p, _log = start_buffered(path, 50)
    try:
        out = subprocess.run([sys.executable, "-c", VISIBILITY_READER, path], env=ENV,
                             capture_output=True, text=True, check=True).stdout.split()
        assert out == ["0", "0"]
        p.stdin.write("flush\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "flushed"
        out = subprocess.run([sys.executable, "-c", VISIBILITY_READER, path], env=ENV,
                             capture_output=True, text=True, check=True).stdout.split()
        assert out == ["50", "50"]
    finally:
        p.stdin.close()
        p.wait(timeout=60)
    assert logs(path) == []


def test_an_add_folds_a_buffer_older_than_the_age_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(*hook.KNOBS["fold_age"], 0.2)
    path = str(tmp_path / "i")
    with simindex.Index(path, sync=False) as idx:
        idx.add("a", 1)
        time.sleep(0.3)
        idx.add("b", 2)                          # folds "a" first
        assert hook.buffered(idx) == 1
        out = subprocess.run([sys.executable, "-c",
                              "import sys, simindex\n"
                              "print(len(simindex.Index(sys.argv[1], readonly=True)))", path],
                             env=ENV, capture_output=True, text=True, check=True).stdout
        assert out.strip() == "1"
        time.sleep(0.3)
        assert [m.id for m in idx.query(2, k=0)] == ["b"]   # a query folds an old buffer too
        assert hook.buffered(idx) == 0


def test_a_full_buffer_folds(tmp_path, monkeypatch, no_age_fold):
    monkeypatch.setattr(*hook.KNOBS["fold"], 10)
    path = str(tmp_path / "i")
    with simindex.Index(path, sync=False) as idx:
        for i in range(25):
            idx.add(i, fp_of(i))
        assert hook.buffered(idx) == 5
        assert len(markers(idx)) == 1              # the last fold's; earlier ones dropped
    with simindex.Index(path) as idx:
        assert len(idx) == 25 and markers(idx) == []


FORKER = r"""
import os, sys, time, simindex
path = sys.argv[1]
fp = lambda i: (i * 0x9E3779B97F4A7C15 + 12345) % 2**64
idx = simindex.Index(path, k=3, shards=4, sync=False)
for i in range(20):
    idx.add(f"r{i}", fp(i))
pid = os.fork()
if pid == 0:                              # the child must not write to the parent's log
    try:
        idx.add("child", 1)
        print("child wrote", flush=True)
    except simindex.ClosedError:
        print("child refused", flush=True)
    idx.close()                           # harmless on the inherited copy
    time.sleep(600)                       # outlives the parent, without exec
    os._exit(0)
print("parent", pid, flush=True)
time.sleep(600)
"""


def test_a_forked_child_neither_writes_to_nor_holds_the_parents_log(tmp_path):
    path = str(tmp_path / "i")
    out, err = (open(tmp_path / name, "w+") for name in ("out", "err"))
    # its own session: the child is killed with the parent's group however the test ends,
    # and the output is in files, so that what went wrong is in the failure's message
    p = subprocess.Popen([sys.executable, "-c", FORKER, path], env=ENV, stdout=out,
                         stderr=err, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(open(tmp_path / "out").read().splitlines()) < 2 and p.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        lines = [x.split() for x in open(tmp_path / "out").read().splitlines()]
        why = (lines, p.poll(), open(tmp_path / "err").read()[-3000:])
        assert len(lines) == 2 and ["child", "refused"] in lines, why
        (child,) = [int(x[1]) for x in lines if x[0] == "parent"]
        p.send_signal(signal.SIGKILL)             # the parent dies; its child lives on
        p.wait()
        os.kill(child, 0)
        with simindex.Index(path) as idx:         # so the log's lock must be free
            assert len(idx) == 20 and "child" not in idx
            assert logs(path) == []
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
        out.close()
        err.close()


GC_INSIDE = r"""
import gc, sys, simindex, simindex._testing
path = sys.argv[1]
simindex._testing.tune(fold=50)
fp = lambda i: (i * 0x9E3779B97F4A7C15 + 12345) % 2**64
idx = simindex.Index(path, k=3, shards=4, sync=False)


class Holder:
    pass


gc.set_threshold(1)                   # a collection at almost every allocation
for i in range(1500):
    h = Holder()
    h.me, h.idx = h, simindex.Index(path, sync=False)   # a second handle in a cycle
    del h                             # collected later, maybe inside one of idx's calls
    idx.add(f"r{i}", fp(i))
    assert [m.id for m in idx.query(fp(i), k=0)] == [f"r{i}"]
gc.set_threshold(700)
gc.collect()
idx.flush()
print(len(idx), idx.verify() == [], flush=True)
idx.close()
"""


def test_a_handle_the_garbage_collector_closes_inside_a_call_neither_hangs_nor_tears(tmp_path):
    p = subprocess.run([sys.executable, "-c", GC_INSIDE, str(tmp_path / "i")], env=ENV,
                       capture_output=True, text=True, timeout=120)   # a deadlock: hangs
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["1500", "True"]
    with simindex.Index(tmp_path / "i") as idx:
        assert len(idx) == 1500 and idx.verify() == [] and logs(str(tmp_path / "i")) == []


# ---------------------------------------------------------------- files and errors
def test_an_index_without_pending_dir_opens_and_buffers(tmp_path):
    path = str(tmp_path / "i")
    with simindex.Index(path) as idx:
        idx.add("a", 1)
    os.rmdir(os.path.join(path, "pending"))       # as made by code before the buffer
    with simindex.Index(path, readonly=True) as ro:
        assert len(ro) == 1
    assert not os.path.exists(os.path.join(path, "pending"))  # read-only: untouched
    with simindex.Index(path, sync=False) as idx:
        idx.add("b", 2)
        assert hook.buffered(idx) == 1 and len(logs(path)) == 1
    with simindex.Index(path) as idx:
        assert len(idx) == 2


def test_bad_input_writes_nothing(tmp_path, no_age_fold):
    path = str(tmp_path / "i")
    with simindex.Index(path, sync=False) as idx:
        idx.add("a", 1)
        log = os.path.join(path, "pending", logs(path)[0])
        size = os.path.getsize(log)
        for args, kw in [((None, 1), {}), (("x", -1), {}), (("x", 1.0), {}),
                         (("x", 1), {"meta": object()}), (("x" * 600, 1), {})]:
            with pytest.raises((simindex.InputError, simindex.InputTypeError)):
                idx.add(*args, **kw)
        assert hook.buffered(idx) == 1 and os.path.getsize(log) == size
        assert "x" not in idx


def test_sync_true_adds_do_not_buffer(tmp_path):
    path = str(tmp_path / "i")
    with simindex.Index(path) as idx:
        idx.add("a", 1)
        assert not hook.has_buffer(idx) and logs(path) == []
        out = subprocess.run([sys.executable, "-c",
                              "import sys, simindex\n"
                              "print(len(simindex.Index(sys.argv[1], readonly=True)))", path],
                             env=ENV, capture_output=True, text=True, check=True).stdout
        assert out.strip() == "1"


DISK_FULL = r"""
import json, os, sys, simindex, simindex._testing
root, phase = sys.argv[1], sys.argv[2]
path = os.path.join(root, "idx")
fp = lambda i: (i * 0x9E3779B97F4A7C15 + 12345) % 2**64
simindex._testing.tune(fold_age=3600.0)
if phase == "fold":
    simindex._testing.tune(fold=40)            # folds fill the disk while logs come and go
idx = simindex.Index(path, k=3, shards=2, sync=False)
st = os.statvfs(root)
with open(os.path.join(root, "ballast"), "wb") as f:   # leave ~600 KiB
    f.write(bytes(max(0, st.f_bavail * st.f_frsize - (600 << 10))))
out = {"acked": 0}
meta = "m" * 4000
while out["acked"] < 100000:
    try:
        idx.add(f"r{out['acked']}", fp(out["acked"]), meta=meta)
    except simindex.Error as e:
        out["error"] = [type(e).__name__, str(e)]
        break
    out["acked"] += 1
n = out["acked"]
out["failed_found"] = bool(idx.query(fp(n), k=0))
out["acked_found"] = sum(1 for i in range(n) if idx.query(fp(i), k=0))
os.remove(os.path.join(root, "ballast"))
try:
    idx.add("after", 1)                   # room again
    out["after"] = None
except simindex.Error as e:
    out["after"] = type(e).__name__
idx.close()
with simindex.Index(path) as idx:         # reopens, and replays a log left behind
    out["len"] = len(idx)
    out["present"] = sum(1 for i in range(n) if idx.get(f"r{i}") == (f"r{i}", fp(i), meta))
    out["failed_present"] = f"r{n}" in idx
    out["after_present"] = "after" in idx
    out["verify"] = idx.verify()
    out["logs"] = os.listdir(os.path.join(path, "pending"))
print(json.dumps(out))
"""


@pytest.mark.parametrize("phase", ["log", "fold"])
def test_a_full_disk_makes_add_raise_and_keeps_earlier_records(tmp_path, phase):
    """Phase log: the log write fails (the handle goes on once there is room). Phase fold:
    mostly the fold's records/ commit fails (the handle refuses writes; the log keeps the
    buffered records for the next open)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("mounting a small tmpfs needs root and unshare (util-linux)")
    work = str(tmp_path / "w")
    os.makedirs(work)
    cmd = ["unshare", "-m", "sh", "-c",
           'mount -t tmpfs -o size=8m tmpfs "$1" || exit 77; shift; exec "$@"', "sh",
           work, sys.executable, "-c", DISK_FULL, work, phase]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    if p.returncode in (1, 77) and not p.stdout:
        pytest.skip("this machine does not allow a private mount namespace with a tmpfs")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    import json
    r = json.loads(p.stdout)
    kind, message = r["error"]
    assert kind == "DiskFullError" and "disk is full" in message, r
    assert work in message                                  # names the path
    in_log = ".log" in message
    if phase == "log":
        assert in_log
    # the failed record is not added; every acknowledged one is found, before and after
    assert r["acked"] > 0 and r["acked_found"] == r["acked"] and not r["failed_found"]
    assert r["present"] == r["acked"] and not r["failed_present"]
    # a failed log write leaves the handle usable; a failed commit makes it refuse writes
    assert r["after"] == (None if in_log else "StorageError")
    assert r["after_present"] == in_log
    assert r["len"] == r["acked"] + in_log
    assert r["verify"] == [] and r["logs"] == []
