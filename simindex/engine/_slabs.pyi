"""Type stubs of the slab codec (ext/simindex/engine/_slabs.pyx)."""

from typing import Optional

import numpy as np
import numpy.typing as npt

from ._lmdb import Env, Txn

_U64 = npt.NDArray[np.uint64]
RUN_DTYPE: np.dtype

def sort_entries(keys: _U64, seqs: _U64, out_k: Optional[_U64] = ...,
                 out_s: Optional[_U64] = ...) -> tuple[_U64, _U64]: ...
def write_run(txn: Txn, db: str, run_id: int, keys: _U64, seqs: _U64,
              lows: Optional[_U64] = ...) -> int: ...
def read_run(txn: Txn, db: str, run_id: int, count: int, check: bool = ...,
             low_words: int = ...) -> tuple[_U64, ...]: ...
def delete_run(txn: Txn, db: str, run_id: int) -> int: ...
def load_state(txn: Txn, ntables: int) -> tuple[int, npt.NDArray, int]: ...
def read_applied(envs: list[Env], ntables: int) -> list[int]: ...
