"""Build of the compiled modules, each next to the Python layer it serves: the storage engine's
(ext/simindex/engine/, over LMDB and zlib) and the signatures' (ext/simindex/signatures/: xxh3,
MD5 from OpenSSL). docs/design/layout.md says what each holds."""
import platform

from Cython.Build import cythonize
from setuptools import Extension, setup

# popcnt is in every x86-64 CPU since 2008; elsewhere the compiler's builtin picks the
# native instruction by itself. No -march=native: wheels must run on other machines.
extra = ["-O3"]
if platform.machine() in ("x86_64", "AMD64"):
    extra.append("-mpopcnt")


def compiled(package, name, libraries=()):
    folder = f"ext/simindex/{package}"
    return Extension(f"simindex.{package}.{name}", sources=[f"{folder}/{name}.pyx"],
                     include_dirs=[folder], libraries=list(libraries),
                     extra_compile_args=extra)


def core(name, libraries=()):
    return compiled("engine", name, libraries)


modules = [
    core("_layout"),                      # the on-disk format's constants, for Python
    core("_lmdb", ["lmdb"]),              # environments, transactions, errors, resize gate
    core("_permute"),                     # permuted keys of the tables
    core("_slabs", ["lmdb", "z"]),        # the slab codec and a shard's state
    core("_records", ["lmdb", "z"]),      # the record codec
    core("_join"),                        # Hamming kernels and the pair join
    core("_query", ["lmdb"]),             # the query engine
    # xxh3 comes from the system header (Debian libxxhash-dev), compiled inline; MD5 from
    # OpenSSL (libssl-dev) for the compatibility schemes.
    compiled("signatures", "_fingerprint", ["crypto"]),
    compiled("signatures", "_text"),                        # the text pass: tokens, shingles, codes, sketches
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
