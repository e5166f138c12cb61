"""Build of the compiled modules (ext/simindex/): the core's modules (LMDB, zlib) and
_fingerprint (xxh3, MD5 from OpenSSL). See README "Layout of the code" for what each holds."""
import platform

from Cython.Build import cythonize
from setuptools import Extension, setup

# popcnt is in every x86-64 CPU since 2008; elsewhere the compiler's builtin picks the
# native instruction by itself. No -march=native: wheels must run on other machines.
extra = ["-O3"]
if platform.machine() in ("x86_64", "AMD64"):
    extra.append("-mpopcnt")


def core(name, libraries=()):
    return Extension(f"simindex.{name}", sources=[f"ext/simindex/{name}.pyx"],
                     include_dirs=["ext/simindex"], libraries=list(libraries),
                     extra_compile_args=extra)


modules = [
    core("_layout"),                      # the on-disk format's constants, for Python
    core("_lmdb", ["lmdb"]),              # environments, transactions, errors, resize gate
    core("_permute"),                     # permuted keys of the tables
    core("_blocks", ["lmdb", "z"]),       # the block codec and a shard's state
    core("_records", ["lmdb", "z"]),      # the record codec
    core("_join"),                        # Hamming kernels and the pair join
    core("_query", ["lmdb"]),             # the query engine
    # xxh3 comes from the system header (Debian libxxhash-dev), compiled inline; MD5 from
    # OpenSSL (libssl-dev) for the compatibility schemes.
    core("_fingerprint", ["crypto"]),
    core("_text"),                        # the text pass: tokens, shingles, codes, sketches
]

setup(
    ext_modules=cythonize(
        modules,
        include_path=["ext"],
        compiler_directives={
            "language_level": 3,
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "embedsignature": True,
        },
    ),
)
