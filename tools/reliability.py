"""Run the reliability trials and print the figures docs/design/reliability.md shows.

    python3 tools/reliability.py                      # a few minutes
    python3 tools/reliability.py --crashes 200 --corrupt 300 --bytes 500 --io-stride 1
    python3 tools/reliability.py --parts bytes --bytes 500      # one kind of trial

The trials are the tests' own (tests/trials.py), at larger sizes. Exit status 1 when a
figure that must be zero is not.
"""

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import simindex  # noqa: E402
import dataset_trials  # noqa: E402
import trials  # noqa: E402

SWEEP = [("fdatasync", "EIO"), ("pwrite64", "ENOSPC"), ("pwrite64", "EIO"),
         ("writev", "ENOSPC"), ("writev", "EIO"), ("fsync", "EIO")]

READER = r"""
import sys, time, numpy as np, simindex
idx = simindex.Index(sys.argv[1], readonly=True)
probes = np.random.default_rng(0).integers(0, 2**64, 200, dtype=np.uint64)
n, end = 0, time.time() + float(sys.argv[2])
while time.time() < end:
    for ms in idx.query_many(probes):
        assert len({m.id for m in ms}) == len(ms) and all(m.distance <= 3 for m in ms)
    n += len(probes)
print("queries", n)
"""


def crashes(work, n, seed):
    os.makedirs(work, exist_ok=True)
    figs = trials.crash_trials(work, n, seed)
    rec = sorted(f["recovery_s"] for f in figs)
    return {"trials run": len(figs),
            "kinds": ", ".join(f"{k} {sum(f['kind'] == k for f in figs)}"
                               for k in ("many", "single", "bulk", "replay")),
            "acknowledged records lost": sum(f["lost"] for f in figs),
            "unacknowledged calls found partial": sum(f["partial"] for f in figs),
            "shards disagreeing after recovery": sum(f["disagreeing"] for f in figs),
            "recovery time p50 / max": f"{statistics.median(rec) * 1e3:.1f} ms / "
                                       f"{max(rec) * 1e3:.1f} ms"}


def concurrency(work, readers, writers, seconds):
    path = os.path.join(work, "conc")
    simindex.Index(path, k=3, shards=8).close()
    rs = [trials.spawn(READER, path, seconds) for _ in range(readers)]
    hold = trials.spawn("import sys, time, simindex, simindex._testing as hook\n"
                        "i = simindex.Index(sys.argv[1], readonly=True)\n"
                        "with hook.snapshot(i):\n    print('holding', flush=True)\n"
                        "    time.sleep(600)", path)
    hold.stdout.readline()
    hold.kill()                        # a reader killed inside its read transactions
    hold.communicate()
    ws = [trials.spawn(trials.WRITER, path, 100000 * (w + 1), "many", 8)
          for w in range(writers)]
    time.sleep(seconds)
    errors, queries, acked = 0, 0, []
    for w in ws:
        w.kill()
        out, err = w.communicate()
        acked += trials.acks(out)
        errors += "Traceback" in err
    for r in rs:
        out, err = r.communicate()
        errors += r.returncode != 0
        queries += int(out.split()[1]) if out.startswith("queries") else 0
    fig = trials.recover(path, acked, "many", upto=max(acked, default=0))
    return {"reader processes (one more killed inside a transaction) / writer processes":
            f"{readers} / {writers}",
            "queries answered during writes / batches acknowledged":
            f"{queries:,} / {len(acked)}",
            "errors seen by readers and writers": errors,
            "records lost after the writers were killed": fig["lost"]}


def io_sweep(work, stride):
    os.makedirs(work, exist_ok=True)
    counts = trials.io_counts(os.path.join(work, "count"))
    runs = injected = 0
    bad = []
    for syscall, error in SWEEP:
        for when in range(1, counts[syscall] + 1, stride):
            wrong, did = trials.io_trial(os.path.join(work, f"{syscall}{error}{when}"),
                                         syscall, error, when)
            runs += 1
            injected += did
            bad += wrong
    return {"I/O injection points swept": f"{runs} ({', '.join(f'{s}={e}' for s, e in SWEEP)}"
                                          f"; {injected} hit a write)",
            "I/O injection mismatches": len(bad)}, bad


def disk_full(work):
    out, bad = [], 0
    for how in ("tmpfs", "fsize"):
        r = trials.disk_full_trial(os.path.join(work, "full-" + how), how)
        if r is None:
            out.append(f"{how}: not permitted here")
            continue
        ok = (r["error"][0] == "DiskFullError" and r["failed_batch"] != "partial"
              and r["lost"] == 0 and not r["verify"] and r["refused"] is not None)
        bad += not ok
        out.append(f"{how}: {r['error'][0]}")
    return {"disk full (12 MiB tmpfs, ulimit -f 6 MiB)": "; ".join(out),
            "disk full trials with loss or a partial batch": bad}


def shared(work, n):
    """Two dedup --index runs at once, and a crawler's add_unique_text beside a run, `n`
    trials each on their own index."""
    both = neither = failed = admitted = 0
    bad = []
    for t in range(n):
        got = dataset_trials.two_runs(os.path.join(work, f"two-{t}"), 12000, t)
        both += got["kept by both"]
        neither += got["kept by neither"]
        failed += got["failed runs"]
        bad += [f"two runs, trial {t}: {e[-1500:]}" for e in got.get("errors", []) if e]
        got = dataset_trials.crawler_beside_a_run(os.path.join(work, f"crawl-{t}"), 8000, t)
        admitted += got["kept and admitted"] + got["taken by neither"]
        failed += got["failed"]
        bad += [f"crawler, trial {t}: {e[-1500:]}" for e in got.get("errors", []) if e]
        shutil.rmtree(os.path.join(work, f"two-{t}"), ignore_errors=True)
        shutil.rmtree(os.path.join(work, f"crawl-{t}"), ignore_errors=True)
    return {"trials run": f"{n} pairs of dedup --index runs at once (12,000 texts), {n} "
                          f"runs beside a crawler's add_unique_text (8,000 texts)",
            "texts kept by both runs, or by neither": both + neither,
            "texts both kept by a run and admitted by the crawler, or by neither": admitted,
            "runs that failed": failed}, bad


def publishing(work, stride):
    """dedup's three outputs on a filling tmpfs (every 4 KiB around what they take), and
    each fsync, rename, link and every `stride`-th write of a run failing in turn."""
    src = dataset_trials.publish_inputs(work)
    complete, kib = dataset_trials.complete_outputs(work, src)
    sizes = [kib + d for d in range(-64, 16, 4)] + [0, 100, kib // 2, kib * 4]
    bad, runs, failed, tmpfs = [], 0, 0, True
    for free in sizes:
        got = dataset_trials.full_disk_publish(work, src, free, complete)
        if got is None:
            tmpfs = False
            break
        runs += 1
        failed += got[1] != 0
        bad += got[0]
    swept = []
    if shutil.which("strace"):
        counts = dataset_trials.publish_calls(work, src)
        for syscall in ("fsync", "fdatasync", "rename", "link", "write"):
            step = stride if syscall == "write" else 1
            for when in range(1, counts.get(syscall, 0) + 1, step):
                wrong, rc = dataset_trials.injected_publish(work, src, syscall, when,
                                                            complete, "EIO" if syscall in (
                                                                "fsync", "fdatasync") else
                                                            "ENOSPC")
                runs += 1
                failed += rc != 0
                bad += wrong
            swept.append(f"{syscall} {counts.get(syscall, 0)}")
    return {"publishing trials": f"{runs} ({len(sizes) if tmpfs else 0} free-space sizes "
                                 f"of a 20 MB tmpfs; calls failed in turn: "
                                 f"{', '.join(swept) or 'no strace'}; {failed} runs failed)",
            "runs that left outputs half published, changed, or a temporary file": len(bad)
            }, bad


def ray_writes(work, n):
    """`dedup --ray` runs with one write task killed (kill -9 of its worker) in each: the
    published outputs hold exactly the parts of an uninterrupted run, and the same command
    runs again over them."""
    try:
        import ray
        import psutil                   # (Ray's own copy, importable once Ray is)
        from simindex.distributed import datasets as ray_dedup
        from simindex.distributed.sandbox import loopback_only
    except ImportError as e:
        return {"Ray write-task kills": f"skipped: {e}"}, []
    why = loopback_only()
    if why:
        return {"Ray write-task kills": f"skipped: {why}"}, []
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    bad, killed = [], 0
    try:
        src = os.path.join(work, "in")
        os.makedirs(src, exist_ok=True)
        ts = dataset_trials.texts(8000, 5)
        for f in range(4):
            dataset_trials.write_jsonl(os.path.join(src, f"{f}.jsonl"),
                                       [{"id": f"{f}.{i}", "text": t + (" x" if i % 3 else "")}
                                        for i, t in enumerate(ts[f::4])])
        want = os.path.join(work, "want")
        ray_dedup.dedup(src, want, removed=want + ".removed", id_field="id", k=6)

        def read(d):
            return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))}
        for t in range(n):
            out = os.path.join(work, f"out-{t}")
            done = []

            def kill_a_writer():
                end = time.time() + 120
                while not done and time.time() < end:
                    for p in psutil.process_iter(["cmdline"]):
                        if any("ray::_write" in c for c in (p.info["cmdline"] or [])):
                            os.kill(p.pid, 9)
                            done.append(p.pid)
                            return
                    time.sleep(0.002)
            import threading
            th = threading.Thread(target=kill_a_writer)
            th.start()
            try:
                ray_dedup.dedup(src, out, removed=out + ".removed", id_field="id", k=6)
            except Exception as e:                      # noqa: BLE001 - counted
                bad.append(f"trial {t}: the run failed: {e}")
            th.join()
            killed += bool(done)
            for suffix in ("", ".removed"):
                if os.path.isdir(out + suffix) and read(out + suffix) != read(want + suffix):
                    bad.append(f"trial {t}: {out + suffix} holds {sorted(os.listdir(out + suffix))}")
            try:
                ray_dedup.dedup(src, out, removed=out + ".removed", id_field="id", k=6)
                if read(out) != read(want):
                    bad.append(f"trial {t}: the run again wrote other parts")
            except Exception as e:                      # noqa: BLE001 - counted
                bad.append(f"trial {t}: the run again failed: {e}")
    finally:
        ray.shutdown()
    return {"dedup --ray runs with a write task killed": f"{n} ({killed} kills landed)",
            "runs whose outputs were wrong or blocked the run again": len(bad)}, bad


def put_back(work, n):
    accepted = []
    for seed in range(n):
        accepted += dataset_trials.put_back(work, seed)
    return {"records/ put back to an older copy (each opened writable, read-only, "
            "repaired, verified)": f"{n} indexes",
            "opens that answered from fewer records than were committed": len(accepted)}


def corrupt(work, n):
    pristine = os.path.join(work, "pristine")
    probes, answers = trials.build_pristine(pristine)
    outcomes, crashes_, bad, raw = {}, 0, [], 0
    for seed in range(n):
        what, outcome, wrong = trials.corrupt_trial(pristine, probes, answers,
                                                    os.path.join(work, "c"), seed,
                                                    cli=seed % 5 == 0)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        crashes_ += outcome in ("crash", "hang")
        bad += [f"seed {seed} {what}: {w}" for w in wrong]
        # the same damage queried before any verify(): LMDB trusts its pages
        _, q, _ = trials.corrupt_trial(pristine, probes, answers, os.path.join(work, "c"),
                                       seed, first="query")
        raw += q in ("crash", "hang")
    return {"corrupt files tried": f"{n} (typed error {outcomes.get('error', 0)}, "
                                   f"verify reports {outcomes.get('reported', 0)}, "
                                   f"harmless {outcomes.get('opened', 0)})",
            "host crashes (open, verify(), then queries if sound)": crashes_,
            "wrong answers not reported by verify(), untyped errors": len(bad) - crashes_,
            "host crashes when queried before verify()": raw}, bad


def single_bytes(work, n):
    """One byte of one page changed per trial (trials.damage_byte), the copy then verified
    first and, apart, queried first: a wrong query or get() answer must be an error or be
    reported by verify(), and no order may crash the process."""
    pristine = os.path.join(work, "pristine-bytes")
    probes, answers = trials.build_pristine(pristine)
    outcomes, crashed, bad = {}, 0, []
    for seed in range(n):
        for first in ("verify", "query"):
            what, outcome, wrong = trials.corrupt_trial(
                pristine, probes, answers, os.path.join(work, "b"), seed,
                cli=first == "verify" and seed % 5 == 0, first=first, how=trials.damage_byte)
            if first == "verify":
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
            crashed += outcome in ("crash", "hang")
            bad += [f"seed {seed} ({first} first) {what}: {w}" for w in wrong]
    return {"single bytes changed": f"{n} (typed error {outcomes.get('error', 0)}, verify "
                                    f"reports {outcomes.get('reported', 0)}, harmless "
                                    f"{outcomes.get('opened', 0)})",
            "host crashes (verify() first, or queries first)": crashed,
            "single bytes: wrong answers not reported, untyped errors": len(bad) - crashed}, bad


BAD_VALUES = [-1, 2**64, 2**70, -2**63, 1.5, float("nan"), float("inf"), True, None, "x",
              b"\x00" * 600, "a" * 600, [1], {"a": 1}, object(), "\ud800", 10**30, (), 3j]


def bad_inputs(work, n, seed):
    rng = random.Random(seed)
    path = os.path.join(work, "bad")
    tracebacks = tried = 0
    with simindex.Index(path, k=3, shards=2) as idx:
        calls = [lambda v: idx.add(v, 1), lambda v: idx.add("id", v),
                 lambda v: idx.add("id", 1, meta=v if not isinstance(v, (int, str)) else
                                   object()),
                 lambda v: idx.add_many([("a", 1), (v, v)]),
                 lambda v: idx.add_many(["a", "b"], [1, v]), lambda v: idx.query(v),
                 lambda v: idx.query(1, k=v), lambda v: idx.query_many([1, v]),
                 lambda v: idx.add_unique("u", v), lambda v: idx.remove(v),
                 lambda v: simindex.Index(path, k=v), lambda v: simindex.Index(path, shards=v),
                 lambda v: simindex.find_all([1, v]), lambda v: simindex.hamming(1, v),
                 lambda v: simindex.fingerprint(v), lambda v: idx.add_many(v)]
        for _ in range(n):
            v = rng.choice(BAD_VALUES)
            tried += 1
            try:
                rng.choice(calls)(v)
            except simindex.Error:
                pass
            except Exception:
                tracebacks += 1
        tracebacks += idx.verify() != []          # nothing half-written
    lines = []
    good = ["a\t00ff00ff00ff00ff", '{"id": "b", "fingerprint": "ff"}', 'c\t12\t{"m": 1}']
    for _ in range(n):
        s = bytearray(rng.choice(good).encode())
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(3)
            at = rng.randrange(len(s) + 1)
            if op == 0:
                s[at:at] = bytes([rng.randrange(256)])
            elif op == 1 and s:
                del s[min(at, len(s) - 1)]
            else:
                s[at:at] = rng.choice([b"\t", b"{", b'"', b"\\u", b"-", b"\xff", b"9" * 30])
        lines.append(bytes(s).replace(b"\n", b" "))
    inp = os.path.join(work, "bad.txt")
    with open(inp, "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    for fmt in ("tsv", "jsonl"):
        p = subprocess.run([sys.executable, "-m", "simindex.cli", "build",
                            os.path.join(work, "cli"), inp, "--format", fmt, "--on-error",
                            "skip", "--quiet"], env=trials.ENV, capture_output=True)
        tried += len(lines)
        tracebacks += b"Traceback" in p.stderr or p.returncode not in (0, 1)
    return {"bad inputs tried (API calls, fuzzed CLI lines)": f"{tried:,}",
            "tracebacks": tracebacks}


PARTS = ("crashes", "concurrency", "io", "disk", "corrupt", "bytes", "bad", "shared",
         "publish", "putback", "raywrites")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--crashes", type=int, default=40, help="kill -9 trials")
    ap.add_argument("--corrupt", type=int, default=100, help="corrupt-file seeds")
    ap.add_argument("--bytes", type=int, default=200,
                    help="single-byte damage trials (each verified first, then queried first)")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"which trials to run, comma-separated (default: all of {','.join(PARTS)})")
    ap.add_argument("--io-stride", type=int, default=2,
                    help="sweep every Nth call of each syscall (1: all)")
    ap.add_argument("--bad", type=int, default=2000, help="bad API calls and CLI lines each")
    ap.add_argument("--seconds", type=float, default=5, help="readers/writers run time")
    ap.add_argument("--shared", type=int, default=20,
                    help="trials of runs racing on one index (each kind)")
    ap.add_argument("--ray-writes", type=int, default=11,
                    help="dedup --ray runs with a write task killed")
    ap.add_argument("--putback", type=int, default=20,
                    help="indexes whose records are put back to an older copy")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    parts = set(a.parts.split(","))
    if parts - set(PARTS):
        ap.error(f"unknown parts {sorted(parts - set(PARTS))}; known: {', '.join(PARTS)}")
    work = tempfile.mkdtemp(prefix="simindex-reliability-")
    rows, bad = [], []
    t0 = time.time()
    try:
        if "crashes" in parts:
            rows += crashes(os.path.join(work, "crash"), a.crashes, a.seed).items()
        if "concurrency" in parts:
            rows += concurrency(work, 2, 2, a.seconds).items()
        if "io" not in parts:
            pass
        elif shutil.which("strace"):
            fig, b = io_sweep(os.path.join(work, "io"), a.io_stride)
            rows += fig.items()
            bad += b
        else:
            rows.append(("I/O injection points swept", "skipped: strace is not installed"))
        if "disk" in parts:
            rows += disk_full(work).items()
        for part, run, n in (("corrupt", corrupt, a.corrupt), ("bytes", single_bytes, a.bytes)):
            if part in parts:
                fig, b = run(work, n)
                rows += fig.items()
                bad += b
        if "bad" in parts:
            rows += bad_inputs(work, a.bad, a.seed).items()
        if "shared" in parts:
            fig, b = shared(os.path.join(work, "shared"), a.shared)
            rows += fig.items()
            bad += b
        if "publish" in parts:
            fig, b = publishing(os.path.join(work, "publish"), 8 * a.io_stride)
            rows += fig.items()
            bad += b
        if "putback" in parts:
            rows += put_back(os.path.join(work, "putback"), a.putback).items()
        if "raywrites" in parts:
            fig, b = ray_writes(os.path.join(work, "raywrites"), a.ray_writes)
            rows += fig.items()
            bad += b
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("| figure | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    print(f"\n{time.time() - t0:.0f} s", file=sys.stderr)
    for b in bad:
        print("PROBLEM:", b, file=sys.stderr)
    must_be_zero = [v for k, v in rows if isinstance(v, int) and not k.startswith("trials")]
    return 1 if bad or any(must_be_zero) else 0


if __name__ == "__main__":
    sys.exit(main())
