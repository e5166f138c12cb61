"""Reliability trials shared by the tests (small sizes) and tools/reliability.py (large).

Each trial runs the index in real processes, damages or kills them, reopens the index and
returns figures; a test asserts the figures that must be zero are zero.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

import simindex
from simindex import _testing as hook

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
SIZES = {"many": 64, "single": 16, "bulk": 5000, "io": 64}


def batch(b, mode):
    """The ids and fingerprints of batch `b` (deterministic, so a checker can rebuild it)."""
    n = SIZES[mode]
    return [f"{b}.{i}" for i in range(n)], \
        np.random.default_rng(b).integers(0, 2**64, n, dtype=np.uint64)


def spawn(code, *args, **kw):
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


# A writer that adds deterministic batches and prints "ack N" after each call returns.
WRITER = r"""
import sys, numpy as np, simindex, simindex._testing
from simindex.engine._layout import SLAB_ENTRIES
# a merge of more than a slab's entries in a transaction of its own: kills fall between too
simindex._testing.tune(merge_inline=SLAB_ENTRIES)
path, b, mode, shards = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
n = {"many": 64, "single": 16, "bulk": 5000}[mode]
idx = simindex.Index(path, k=3, shards=shards)       # a writable open replays first
print("ready", flush=True)
while True:
    fps = np.random.default_rng(b).integers(0, 2**64, n, dtype=np.uint64)
    ids = [f"{b}.{i}" for i in range(n)]
    if mode == "single":
        for i, fp in zip(ids, fps):
            idx.add(i, int(fp))
    else:
        idx.add_many(ids, fps, jobs=2 if mode == "bulk" else 1)
    print("ack", b, flush=True)
    b += 1
"""

REPLAYER = r"""
import sys, simindex, simindex._testing
# many small shard transactions to be killed between, a few shards of a pass at a time
simindex._testing.tune(apply_chunk=13, sort_entries=20)
simindex.Index(sys.argv[1])
print("replayed", flush=True)
"""


def acks(out):
    return [int(line.split()[1]) for line in out.splitlines() if line.startswith("ack ")]


def run_and_kill(path, start, mode, delay, shards=8):
    """Start a writer at batch `start`, SIGKILL it `delay` s after it opened; its acks."""
    p = spawn(WRITER, path, start, mode, shards)
    first = p.stdout.readline()            # "ready": the open (and its replay) is done
    time.sleep(delay)
    p.send_signal(signal.SIGKILL)
    out, err = p.communicate()
    assert p.returncode == -signal.SIGKILL, (first, err)
    return acks(out)


def stage_unapplied(path, batches, mode="many"):
    """Commit batches to records/ only, as a writer killed before it touched the shards."""
    idx = simindex.Index(path)
    for b in batches:
        ids, fps = batch(b, mode)
        hook.commit_unapplied(idx, ids, fps)
    hook.crash(idx)


def recover(path, acked, mode, upto=None):
    """Reopen for writing (replay) and check: figures of lost records, partial batches,
    shards disagreeing, and the recovery time."""
    t0 = time.perf_counter()
    idx = simindex.Index(path)
    took = time.perf_counter() - t0
    try:
        problems = idx.verify()
        bad_shards = {p.split()[0] for p in problems}
        if idx.stats()["unapplied"]:
            bad_shards.add("pending")
        lost = 0
        for b in acked:
            ids, fps = batch(b, mode)
            found = idx.query_many(fps, k=0)
            # found through the tables (nothing is pending), and stored
            lost += sum(1 for i, ms in zip(ids, found) if i not in {m.id for m in ms})
        partial = 0
        top = max(acked, default=-1) if upto is None else upto
        for b in range(max(acked, default=-1) + 1, top + 2):
            ids, _ = batch(b, mode)
            present = [i in idx for i in ids]
            if mode == "single":
                partial += present != sorted(present, reverse=True)   # a prefix of its adds
            else:
                partial += any(present) and not all(present)          # all or nothing
    finally:
        idx.close()
    return {"lost": lost, "partial": partial, "disagreeing": len(bad_shards),
            "problems": problems, "recovery_s": took}


def crash_trials(path, n, seed, kinds=("many", "single", "bulk", "replay")):
    """`n` kill -9 trials on one index, spread over `kinds`; a list of figures per trial."""
    rng = random.Random(seed)
    out = []
    start = {k: 1_000_000 * i for i, k in enumerate(kinds)}    # one id range per kind
    paths = {k: os.path.join(path, k) for k in kinds}
    for t in range(n):
        kind = kinds[t % len(kinds)]
        p = paths[kind]
        if kind == "replay":
            if not os.path.exists(p):
                simindex.Index(p, k=3, shards=8).close()
            todo = list(range(start[kind], start[kind] + 100))
            stage_unapplied(p, todo)
            q = spawn(REPLAYER, p)
            time.sleep(rng.uniform(0.15, 1.0))
            q.kill()
            q.communicate()
            acked, mode = todo, "many"
        else:
            delay = rng.uniform(0.0, 0.6)
            acked = run_and_kill(p, start[kind], kind, delay)
            mode = kind
        fig = recover(p, acked, mode)
        fig["kind"] = kind
        out.append(fig)
        start[kind] = max(acked, default=start[kind]) + 2
    return out


# ---------------------------------------------------------------- I/O error injection
IO_WRITER = r"""
import sys, numpy as np, simindex
path, batches, phase = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def add(idx, b):
    fps = np.random.default_rng(b).integers(0, 2**64, 64, dtype=np.uint64)
    idx.add_many([f"{b}.{i}" for i in range(64)], fps)
    print("ack", b, flush=True)
if phase == "recover":                   # no fault now: reopen, replay, write
    with simindex.Index(path) as idx:
        add(idx, 9000)
    sys.exit()
try:
    idx = simindex.Index(path, k=3, shards=4)
except simindex.Error as e:
    print("openfail", type(e).__name__, e, flush=True)
    idx = None
if idx is not None:
    for b in range(batches):
        try:
            add(idx, b)
        except simindex.Error as e:
            print("fail", b, type(e).__name__, e, flush=True)
            try:
                add(idx, 5000)
                print("accepted after a failure", flush=True)
            except simindex.StorageError as e:
                print("refused", "reopen" in str(e), flush=True)
            break
    try:
        idx.close()                      # applies what group commit left to the shards
    except simindex.Error as e:
        print("closefail", type(e).__name__, e, flush=True)
"""


def io_counts(path, batches=3):
    """How many of each write syscall a clean writer run makes (strace -c)."""
    out = os.path.join(path + ".count")
    subprocess.run(["strace", "-f", "-qq", "-c", "-U", "name,calls", "-o", out,
                    sys.executable, "-c", IO_WRITER, path, str(batches), "write"],
                   env=ENV, capture_output=True, check=True, timeout=120)
    counts = {}
    for line in open(out):
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    shutil.rmtree(path, ignore_errors=True)
    return counts


def io_trial(path, syscall, error, when, batches=3):
    """One writer run with the `when`-th `syscall` failing with `error`: a list of what
    went wrong (empty when the rules held) and whether a failure was injected."""
    p = subprocess.run(["strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={syscall}",
                        "-e", f"inject={syscall}:error={error}:when={when}",
                        sys.executable, "-c", IO_WRITER, path, str(batches), "write"],
                       env=ENV, capture_output=True, text=True, timeout=120)
    wrong = []
    if p.returncode != 0 or "Traceback" in p.stderr:
        wrong.append(f"exit {p.returncode}: {p.stderr[-600:]}")
    r = subprocess.run([sys.executable, "-c", IO_WRITER, path, str(batches), "recover"],
                       env=ENV, capture_output=True, text=True, timeout=120)
    if r.returncode != 0 or "ack 9000" not in r.stdout:
        wrong.append(f"recovery failed: exit {r.returncode}: {r.stderr[-600:]}")
    lines = p.stdout.splitlines()
    failed = [ln for ln in lines if ln.startswith(("fail ", "openfail ", "closefail "))]
    for ln in failed:
        if ln.split()[2 if ln.startswith("fail ") else 1] not in ("StorageError",
                                                                   "DiskFullError"):
            wrong.append(f"untyped or odd error: {ln}")
    if any(ln.startswith("fail ") for ln in failed) and "refused True" not in lines:
        wrong.append("a handle that saw a write error did not refuse the next write")
    acked = [b for b in acks(p.stdout) if b != 9000]
    if not wrong and os.path.exists(path):
        fig = recover(path, acked + [9000], "io", upto=batches)
        if fig["lost"] or fig["partial"] or fig["disagreeing"]:
            wrong.append(f"after reopen: {fig}")
        tried = {int(ln.split()[1]) for ln in failed if ln.startswith("fail ")}
        with simindex.Index(path, readonly=True) as idx:
            extra = [b for b in list(range(batches)) + [5000]
                     if b not in acked and b not in tried and f"{b}.0" in idx]
        if extra:
            wrong.append(f"batches {extra} are present but were refused or never tried")
    return wrong, bool(failed)


# ---------------------------------------------------------------- corrupt files
CHECKER = r"""
import json, sys, numpy as np, simindex
path, probes, first = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
out = {}

def answers(idx):
    return [sorted((str(m.id), m.distance) for m in ms)
            for ms in idx.query_many(np.array(probes, dtype=np.uint64))] + \
        [[str(r) for r in idx.get(f"d{i}") or ()] for i in range(len(probes) - 80 + 1)]

def verify(idx):
    try:
        return idx.verify()
    except simindex.Error as e:
        return [f"raised {type(e).__name__}: {e}"]

try:
    if first == "verify":            # what README advises after a suspected disk fault
        with simindex.Index(path, readonly=True) as idx:
            out["verify"] = verify(idx)
        if not out["verify"]:
            with simindex.Index(path) as idx:
                out["answers"] = answers(idx)
    else:                            # query a damaged index straight away
        with simindex.Index(path) as idx:
            out["answers"] = answers(idx)
            out["verify"] = verify(idx)
except simindex.Error as e:
    out["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def build_pristine(path, n=3000, shards=4):
    """An index with several runs, a removal and a compaction; (probes, answers)."""
    rng = np.random.default_rng(11)
    fps = rng.integers(0, 2**64, n, dtype=np.uint64)
    with simindex.Index(path, k=3, shards=shards) as idx:
        idx.add_many([f"d{i}" for i in range(n // 2)], fps[:n // 2])
        idx.compact()
        idx.add_many([f"d{i}" for i in range(n // 2, n)], fps[n // 2:])
        idx.remove("d7")
        # every stored fingerprint, some near ones, and get() of every id (and of one more)
        probes = [int(x) for x in fps] + [int(x) ^ 0b1011 for x in fps[:80]]
        answers = [sorted((str(m.id), m.distance) for m in ms) for ms in idx.query_many(probes)]
        answers += [[str(r) for r in idx.get(f"d{i}") or ()] for i in range(n + 1)]
    return probes, answers


def targets(path):
    """Files a corruption trial may damage."""
    names = ["manifest.msgpack"]
    for sub in sorted(os.listdir(path)):
        if sub == "records" or sub.startswith("shard-"):
            names += [f"{sub}/data.mdb", f"{sub}/lock.mdb"]
    return names


def damage(path, seed):
    """Damage the copy at `path` the way `seed` picks; returns a description."""
    rng = random.Random(seed)
    files = targets(path)
    kind = rng.choice(["flip", "flip", "flip", "truncate", "zero-page", "delete-shard"])
    if kind == "delete-shard":
        sub = rng.choice([d for d in os.listdir(path) if d.startswith("shard-")])
        shutil.rmtree(os.path.join(path, sub))
        return f"deleted {sub}/"
    # data files more often than the others
    name = rng.choice([f for f in files if f.endswith("data.mdb")] * 3 + files)
    f = os.path.join(path, name)
    size = os.path.getsize(f)
    with open(f, "r+b") as fh:
        if kind == "truncate" or size == 0:
            new = rng.randrange(0, max(size, 1))
            fh.truncate(new)
            return f"{name} truncated {size} -> {new}"
        if kind == "zero-page":
            page = rng.randrange(0, max(size // 4096, 1))
            fh.seek(page * 4096)
            fh.write(bytes(min(4096, size - page * 4096)))
            return f"{name} page {page} zeroed"
        at = []
        for _ in range(rng.choice([1, 2, 4, 16])):
            pos = rng.randrange(size)
            fh.seek(pos)
            b = fh.read(1)
            fh.seek(pos)
            fh.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
            at.append(pos)
        return f"{name} bits flipped at {at}"


PAGE_KINDS = ("meta", "branch", "leaf", "overflow")


def page_kinds(f):
    """{kind: [page numbers]} of LMDB data file `f`: its two meta pages, then each page by
    the flags of its header (the pages inside an overflow run, and free pages, have none of
    these and are left out)."""
    data = open(f, "rb").read()
    kinds = {k: [] for k in PAGE_KINDS}
    psize = 4096
    for pgno in range(len(data) // psize):
        head = data[pgno * psize:pgno * psize + 16]
        flags = int.from_bytes(head[10:12], "little")
        if pgno < 2:
            kinds["meta"].append(pgno)
        elif int.from_bytes(head[0:8], "little") == pgno:
            kind = {1: "branch", 2: "leaf", 4: "overflow"}.get(flags & 7)
            if kind:
                kinds[kind].append(pgno)
    return kinds


def damage_byte(path, seed):
    """Change one byte of one page of a data file of the copy at `path`: a page kind
    (meta, branch, leaf, overflow) of records/ or of a shard taken at random, then a byte
    of its header (one time in three) or anywhere in it. Returns a description."""
    rng = random.Random(seed)
    subs = ["records"] + sorted(d for d in os.listdir(path) if d.startswith("shard-"))
    sub = rng.choice(["records", rng.choice(subs[1:])])
    f = os.path.join(path, sub, "data.mdb")
    kinds = {k: v for k, v in page_kinds(f).items() if v}
    kind = rng.choice(sorted(kinds))
    pgno = rng.choice(kinds[kind])
    off = rng.randrange(16) if rng.random() < 1 / 3 else rng.randrange(4096)
    with open(f, "r+b") as fh:
        fh.seek(pgno * 4096 + off)
        old = fh.read(1)[0]
        new = (old + rng.randrange(1, 256)) % 256
        fh.seek(pgno * 4096 + off)
        fh.write(bytes([new]))
    return f"{sub}/data.mdb {kind} page {pgno} byte {off}: {old:#04x} -> {new:#04x}"


def corrupt_trial(pristine, probes, answers, work, seed, cli=False, first="verify",
                  how=damage):
    """Copy the pristine index, damage it (`how`: damage or damage_byte), open, verify and
    query it in a child process (`first`="query": query before verifying). Returns
    (description, outcome, list of rule violations)."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(pristine, work)
    what = how(work, seed)
    wrong = []
    try:
        p = subprocess.run([sys.executable, "-c", CHECKER, work, json.dumps(probes), first],
                           env=ENV, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return what, "hang", ["the checker hung"]
    if p.returncode < 0:
        return what, "crash", [f"host crash: signal {-p.returncode}"]
    if p.returncode != 0 or "Traceback" in p.stderr:
        return what, "traceback", [f"untyped error: {p.stderr[-800:]}"]
    out = json.loads(p.stdout)
    answers = json.loads(json.dumps(answers))          # tuples as JSON lists, as the child's
    if "error" in out:
        outcome = "error"
        if ": " not in out["error"] or len(out["error"]) < 20:
            wrong.append(f"an error without a reason: {out['error']}")
    else:
        outcome = "opened"
        if out.get("answers", answers) != answers and not out["verify"]:
            wrong.append("queries are wrong but verify() reports nothing")
        if out["verify"]:
            outcome = "reported"
    if cli:
        c = subprocess.run([sys.executable, "-m", "simindex.cli", "verify", work], env=ENV,
                           capture_output=True, text=True, timeout=120)
        if c.returncode < 0 or "Traceback" in c.stderr:
            wrong.append(f"simindex verify: exit {c.returncode} {c.stderr[-400:]}")
        elif outcome in ("error", "reported") and c.returncode != 1:
            wrong.append(f"simindex verify exited {c.returncode} on a damaged index")
    return what, outcome, wrong


# ---------------------------------------------------------------- disk full
DISK_FULL = r"""
import json, os, resource, sys, numpy as np, simindex
root, how = sys.argv[1], sys.argv[2]
path = os.path.join(root, "idx")
def batch(b):
    return [f"{b}.{i}" for i in range(2000)], \
        np.random.default_rng(b).integers(0, 2**64, 2000, dtype=np.uint64)
if how == "tmpfs":                       # space that is freed later
    with open(os.path.join(root, "ballast"), "wb") as f:
        f.write(bytes(2 << 20))
out = {"acked": []}
idx = simindex.Index(path, k=3, shards=4)
b = 0
while b < 10000:
    try:
        idx.add_many(*batch(b))
    except simindex.Error as e:
        out["error"] = [type(e).__name__, str(e), getattr(e, "errno", None)]
        break
    out["acked"].append(b)
    b += 1
present = [i in idx for i in batch(b)[0]]                 # reads still work
out["failed_batch"] = "all" if all(present) else "none" if not any(present) else "partial"
try:
    idx.add("after", 1)
    out["refused"] = None
except simindex.Error as e:
    out["refused"] = [type(e).__name__, str(e)]
idx.close()
if how == "tmpfs":
    os.remove(os.path.join(root, "ballast"))
else:
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
with simindex.Index(path) as idx:                          # reopens and replays
    out["pending"] = idx.stats()["unapplied"]
    out["lost"] = sum(1 for a in out["acked"] for i, ms in
                      zip(batch(a)[0], idx.query_many(batch(a)[1], k=0))
                      if i not in {m.id for m in ms})
    idx.add_many(*batch(b + 1))                            # and accepts writes
    out["verify"] = idx.verify()
print(json.dumps(out))
"""


def disk_full_trial(work, how):
    """Fill a 12 MiB tmpfs (in a private mount namespace) or hit RLIMIT_FSIZE; the child's
    report, or None when a tmpfs cannot be mounted here."""
    os.makedirs(work, exist_ok=True)
    if how == "tmpfs":
        cmd = ["unshare", "-m", "sh", "-c",
               'mount -t tmpfs -o size=12m tmpfs "$1" || exit 77; shift; exec "$@"', "sh",
               work, sys.executable, "-c", DISK_FULL, work, how]
        pre = None
    else:
        import resource

        def pre():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (6 << 20, resource.RLIM_INFINITY))
        cmd = [sys.executable, "-c", DISK_FULL, work, how]
    try:
        p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300,
                           preexec_fn=pre)
    except FileNotFoundError:
        return None
    if how == "tmpfs" and p.returncode in (1, 77) and not p.stdout:
        return None                       # no permission for namespaces or mounts
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
    return json.loads(p.stdout)


# ---------------------------------------------------------------- write-buffer writers
BUFFERED_WRITER = r"""
import sys, simindex, simindex._testing
path, n, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
simindex._testing.tune(fold_age=3600.0)        # nothing folds by age while the parent looks
fp = lambda i: sum(((i * 0x9E3779B97F4A7C15 + 12345 + w * 0x5851F42D4C957F2D) % 2**64)
                   << (width - 64 * (w + 1)) for w in range(width // 64))
idx = simindex.Index(path, k=3, shards=4, sync=False, width=width)
for i in range(n):
    idx.add(f"r{i}", fp(i), meta={"i": i})
print("added", simindex._testing.buffered(idx), simindex._testing.log_path(idx), flush=True)
for line in sys.stdin:
    if line.strip() == "flush":
        idx.flush()
        print("flushed", flush=True)
"""


def start_buffered(path, n, width=64):
    """A process that adds n records (conftest.fp_of(i, width)) through a write buffer and
    waits (stdin "flush" flushes); (the process, the path of its log)."""
    p = spawn(BUFFERED_WRITER, path, n, width, stdin=subprocess.PIPE)
    line = p.stdout.readline().split()
    assert line[:2] == ["added", str(n)], (line, p.stderr.read() if p.poll() is not None else "")
    return p, line[2]


def kill(p):
    """SIGKILL a process and wait for it."""
    p.send_signal(signal.SIGKILL)
    p.communicate()
