"""Fault trials of the dataset workflow (`simindex dedup`), shared by the tests (small sizes)
and tools/reliability.py (many trials): real CLI processes racing on one index, a crawler
process beside a run. Each returns figures; the figures that must be zero are named so.
"""

import json
import os
import random
import shutil
import subprocess
import sys

import simindex

from trials import ENV, spawn

WORDS = [f"w{i}" for i in range(5000)]


def texts(n, seed):
    """`n` distinct texts of 40-80 random words (no two within a few bits of each other)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 80))) for _ in range(n)]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def read_texts(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def mirrored(work, rows, seed, first, second):
    """(texts, path of `first`.jsonl, path of `second`.jsonl): the same `rows` texts in
    both files, the second's in reverse order, each row's id its file's name and number."""
    os.makedirs(work, exist_ok=True)
    ts = texts(rows, seed)
    paths = []
    for name, order in ((first, ts), (second, list(reversed(ts)))):
        paths.append(os.path.join(work, f"{name}.jsonl"))
        write_jsonl(paths[-1], [{"id": f"{name}{i}", "text": t} for i, t in enumerate(order)])
    return ts, paths[0], paths[1]


def dedup_cmd(inp, out, index, *extra):
    return [sys.executable, "-m", "simindex", "dedup", str(inp), "--index", str(index),
            "--id-field", "id", "-o", str(out), "-q", *map(str, extra)]


def two_runs(work, rows, seed, *extra):
    """Two `dedup --index` runs at once on one index, over the same texts (the second in
    reverse order, under other ids), with the options `extra`: every text must be kept by
    exactly one of them.
    Returns {"kept by both": texts both kept, "kept by neither": ..., "failed runs": ...}."""
    ts, a, b = mirrored(work, rows, seed, "a", "b")
    index = os.path.join(work, "shared.idx")
    simindex.Index(index, k=3).close()          # made first: both runs open the same one
    procs = [subprocess.Popen(dedup_cmd(inp, os.path.join(work, f"out-{n}.jsonl"), index,
                                        *extra),
                              env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
             for n, inp in enumerate((a, b))]
    errors = [p.communicate(timeout=600)[1] for p in procs]
    failed = sum(p.returncode != 0 for p in procs)
    if failed:
        return {"kept by both": 0, "kept by neither": 0, "failed runs": failed,
                "errors": errors}
    ka, kb = (set(read_texts(os.path.join(work, f"out-{n}.jsonl"))) for n in (0, 1))
    with simindex.Index(index, readonly=True) as idx:
        problems = idx.verify()
        stored = len(idx)
    return {"kept by both": len(ka & kb), "kept by neither": len(set(ts) - ka - kb),
            "failed runs": 0, "records": stored, "problems": problems}


CRAWLER = r"""
import json, sys, simindex
idx = simindex.Index(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
admitted = []
for line in open(sys.argv[2], encoding="utf-8"):
    row = json.loads(line)
    if not idx.add_unique_text(row["id"], row["text"]):
        admitted.append(row["text"])
idx.close()
json.dump(admitted, open(sys.argv[3], "w"))
"""


def crawler_beside_a_run(work, rows, seed):
    """A crawler process admitting texts with add_unique_text while `dedup --index` runs
    on the same calibrated index, over the same texts (the crawler's in reverse order): no
    text may be both kept by the run and admitted by the crawler, and every text must be
    taken by one of them."""
    ts, a, b = mirrored(work, rows, seed, "run", "crawl")
    index = os.path.join(work, "crawl.idx")
    simindex.Index(index, calibration=simindex.calibrate([], 0.7)).close()
    got = os.path.join(work, "admitted.json")
    crawler = spawn(CRAWLER, index, b, got, stdin=subprocess.PIPE)
    assert crawler.stdout.readline().strip() == "ready", crawler.stderr.read()
    out = os.path.join(work, "kept.jsonl")
    run = subprocess.Popen(dedup_cmd(a, out, index), env=ENV, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    crawler.stdin.write("go\n")
    crawler.stdin.flush()
    run_err = run.communicate(timeout=600)[1]
    crawl_err = crawler.communicate(timeout=600)[1]
    if run.returncode or crawler.returncode:
        return {"kept and admitted": 0, "taken by neither": 0,
                "failed": int(bool(run.returncode)) + int(bool(crawler.returncode)),
                "errors": [run_err, crawl_err]}
    kept = set(read_texts(out))
    with open(got) as f:
        admitted = set(json.load(f))
    return {"kept and admitted": len(kept & admitted),
            "taken by neither": len(set(ts) - kept - admitted), "failed": 0,
            "kept": len(kept), "admitted": len(admitted)}


# ---------------------------------------------------------------- publishing outputs
OUTPUTS = ("out.jsonl", "removed.jsonl", "clusters.jsonl")

PUBLISHER = r"""
import hashlib, json, os, subprocess, sys
tmpfs, free_kib, src = sys.argv[1], int(sys.argv[2]), sys.argv[3]
names = json.loads(sys.argv[4])
before = {}
for n in names[:2]:                       # earlier outputs at two of the paths
    with open(os.path.join(tmpfs, n), "w") as f:
        f.write('{"earlier": true}\n' * 50)
    before[n] = hashlib.sha256(open(os.path.join(tmpfs, n), "rb").read()).hexdigest()
st = os.statvfs(tmpfs)
fill = st.f_bavail * st.f_frsize - free_kib * 1024
if fill > 0:
    with open(os.path.join(tmpfs, "filler"), "wb") as f:
        f.write(b"\0" * fill)
r = subprocess.run([sys.executable, "-m", "simindex", "dedup", src, "--id-field", "id",
                    "-q", "-o", os.path.join(tmpfs, names[0]),
                    "--removed", os.path.join(tmpfs, names[1]),
                    "--clusters", os.path.join(tmpfs, names[2])],
                   capture_output=True, text=True)
state = {}
for n in names:
    p = os.path.join(tmpfs, n)
    state[n] = hashlib.sha256(open(p, "rb").read()).hexdigest() if os.path.exists(p) \
        else None
left = sorted(n for n in os.listdir(tmpfs) if n not in names and n != "filler")
print(json.dumps({"rc": r.returncode, "stderr": r.stderr[-800:], "state": state,
                  "before": before, "left": left}))
"""


def publish_inputs(work, rows=3000, seed=3):
    """A JSON lines input of `rows` texts, a third of them near-copies of others."""
    os.makedirs(work, exist_ok=True)
    ts = texts(rows * 2 // 3, seed)
    rng = random.Random(seed)
    rows_ = [{"id": f"r{i}", "text": t} for i, t in enumerate(ts)]
    rows_ += [{"id": f"c{i}", "text": rng.choice(ts) + " copied"} for i in range(rows // 3)]
    src = os.path.join(work, "in.jsonl")
    write_jsonl(src, rows_)
    return src


def complete_outputs(work, src):
    """(the sha256 of each output of an uninterrupted run with enough space, the KiB of
    4 KiB pages the three take)."""
    import hashlib
    out = os.path.join(work, "complete")
    os.makedirs(out, exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "simindex", "dedup", src, "--id-field", "id",
                        "-q", "-o", os.path.join(out, OUTPUTS[0]),
                        "--removed", os.path.join(out, OUTPUTS[1]),
                        "--clusters", os.path.join(out, OUTPUTS[2])],
                       env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    pages = sum(-(-os.path.getsize(os.path.join(out, n)) // 4096) for n in OUTPUTS)
    return {n: hashlib.sha256(open(os.path.join(out, n), "rb").read()).hexdigest()
            for n in OUTPUTS}, 4 * pages


def full_disk_publish(work, src, free_kib, complete):
    """One run of `dedup -o --removed --clusters` onto a 20 MB tmpfs (in a private mount
    namespace) filled to leave `free_kib`: None when no tmpfs can be mounted here, else
    what went wrong (empty: the outputs are all the complete ones, or all as they were,
    and no temporary file is left)."""
    d = os.path.join(work, f"tmpfs-{free_kib}")
    os.makedirs(d, exist_ok=True)
    cmd = ["unshare", "-m", "sh", "-c",
           'mount -t tmpfs -o size=20m tmpfs "$1" || exit 77; shift; exec "$@"', "sh",
           d, sys.executable, "-c", PUBLISHER, d, str(free_kib), src, json.dumps(OUTPUTS)]
    try:
        p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    except FileNotFoundError:
        return None
    if p.returncode == 77 or (p.returncode and not p.stdout):
        return None
    got = json.loads(p.stdout)
    wrong = []
    state, before = got["state"], got["before"]
    if got["rc"] == 0:
        if state != complete:
            wrong.append(f"exit 0 but outputs {state} are not the complete ones")
    else:
        if "no output was written" not in got["stderr"] or "Traceback" in got["stderr"]:
            wrong.append(f"exit {got['rc']}: {got['stderr']}")
        if {n: state[n] for n in before} != before or state[OUTPUTS[2]] is not None:
            wrong.append(f"failed, but outputs changed: {state} (before {before})")
    if got["left"]:
        wrong.append(f"left behind: {got['left']}")
    return wrong, got["rc"]


def injected_publish(work, src, syscall, when, complete, error="ENOSPC"):
    """One run of `dedup -o --removed --clusters` whose `when`-th `syscall` fails with
    `error` (strace), two of its outputs already there: what went wrong (empty when every
    output is the complete one, or every path holds what it held; nothing else left), the
    exit status, and whether the failure was injected at all."""
    import hashlib
    d = os.path.join(work, f"inject-{syscall}-{when}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    before = {}
    for n in OUTPUTS[:2]:
        with open(os.path.join(d, n), "w") as f:
            f.write('{"earlier": true}\n')
        before[n] = hashlib.sha256(b'{"earlier": true}\n').hexdigest()
    p = subprocess.run(["strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={syscall}",
                        "-e", f"inject={syscall}:error={error}:when={when}",
                        sys.executable, "-m", "simindex", "dedup", src, "--id-field", "id",
                        "-q", "-o", os.path.join(d, OUTPUTS[0]),
                        "--removed", os.path.join(d, OUTPUTS[1]),
                        "--clusters", os.path.join(d, OUTPUTS[2])],
                       env=ENV, capture_output=True, text=True, timeout=300)
    state = {n: hashlib.sha256(open(os.path.join(d, n), "rb").read()).hexdigest()
             if os.path.exists(os.path.join(d, n)) else None for n in OUTPUTS}
    wrong = []
    if p.returncode == 0:
        if state != complete:
            wrong.append(f"exit 0 but outputs {state} are not the complete ones")
    else:
        if "Traceback" in p.stderr or "no output was written" not in p.stderr:
            wrong.append(f"exit {p.returncode}: {p.stderr[-800:]}")
        if {n: state[n] for n in before} != before or state[OUTPUTS[2]] is not None:
            wrong.append(f"failed, but outputs changed: {state}")
    left = sorted(set(os.listdir(d)) - set(OUTPUTS))
    if left:
        wrong.append(f"left behind: {left}")
    return wrong, p.returncode


# ---------------------------------------------------------------- records put back
def put_back(work, seed):
    """An index whose records/ was put back to a copy taken partway (a restored backup):
    the names of the opens (writable, read-only, repair, verify) that did NOT refuse it."""
    import numpy as np
    rng = random.Random(seed)
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, f"put-back-{seed}")
    n, at = rng.randint(200, 5000), None
    at = rng.randint(1, n - 1)
    fps = np.random.default_rng(seed).integers(0, 2**64, n, dtype=np.uint64)
    ids = [f"d{i}" for i in range(n)]
    sync = rng.random() < 0.5
    with simindex.Index(path, k=3, shards=4, sync=sync) as idx:
        idx.add_many(ids[:at], fps[:at])
    shutil.copytree(os.path.join(path, "records"), path + ".copy")
    with simindex.Index(path, sync=sync) as idx:
        for s in range(at, n, 250):
            idx.add_many(ids[s:s + 250], fps[s:s + 250])
    shutil.rmtree(os.path.join(path, "records"))
    shutil.copytree(path + ".copy", os.path.join(path, "records"))
    accepted = []
    for name, opening in (("writable", lambda: simindex.Index(path)),
                          ("read-only", lambda: simindex.Index(path, readonly=True)),
                          ("repair", lambda: simindex.repair(path))):
        try:
            x = opening()
            if hasattr(x, "close"):
                x.close()
            accepted.append(name)
        except simindex.RecordsLostError:
            pass
    r = subprocess.run([sys.executable, "-m", "simindex", "verify", path], env=ENV,
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 1 or "committed records are missing" not in r.stderr:
        accepted.append("verify")
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(path + ".copy", ignore_errors=True)
    return accepted


def publish_calls(work, src):
    """How many of each syscall a publishing trial's run makes (strace -c), two of its
    outputs already there as in injected_publish."""
    d = os.path.join(work, "count")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for n in OUTPUTS[:2]:
        with open(os.path.join(d, n), "w") as f:
            f.write('{"earlier": true}\n')
    out = os.path.join(work, "calls.txt")
    subprocess.run(["strace", "-f", "-qq", "-c", "-U", "name,calls", "-o", out,
                    sys.executable, "-m", "simindex", "dedup", src, "--id-field", "id", "-q",
                    "-o", os.path.join(d, OUTPUTS[0]), "--removed", os.path.join(d, OUTPUTS[1]),
                    "--clusters", os.path.join(d, OUTPUTS[2])],
                   env=ENV, capture_output=True, check=True, timeout=300)
    counts = {}
    for line in open(out):
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    return counts
