"""Build of the compiled modules: ext/simindex/_core.pyx (LMDB, zlib) and _fingerprint.pyx (xxh3)."""
import platform

from Cython.Build import cythonize
from setuptools import Extension, setup

# popcnt is in every x86-64 CPU since 2008; elsewhere the compiler's builtin picks the
# native instruction by itself. No -march=native: wheels must run on other machines.
extra = ["-O3"]
if platform.machine() in ("x86_64", "AMD64"):
    extra.append("-mpopcnt")

core = Extension(
    "simindex._core",
    sources=["ext/simindex/_core.pyx"],
    libraries=["lmdb", "z"],
    extra_compile_args=extra,
)

# xxh3 comes from the system header (Debian libxxhash-dev), compiled inline; MD5 from OpenSSL.
fingerprint = Extension(
    "simindex._fingerprint",
    sources=["ext/simindex/_fingerprint.pyx"],
    libraries=["crypto"],            # MD5 of the compatibility schemes (libssl-dev)
    extra_compile_args=extra,
)

setup(
    ext_modules=cythonize(
        [core, fingerprint],
        include_path=["ext", "ext/simindex"],
        compiler_directives={
            "language_level": 3,
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "embedsignature": True,
        },
    ),
)
