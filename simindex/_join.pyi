"""Type stubs of the Hamming kernels and the pair join (ext/simindex/_join.pyx)."""

from typing import Optional

import numpy as np
import numpy.typing as npt

_U64 = npt.NDArray[np.uint64]

def hamming(a: int, b: int) -> int: ...
def within(fps: _U64, n: int, q: int, k: int) -> list[tuple[int, int]]: ...
def pairs_sorted(keys: _U64, ids: _U64, pmask: int, earlier: _U64, k: int,
                 probes: Optional[_U64] = ..., flips: int = ...
                 ) -> tuple[_U64, _U64, npt.NDArray[np.uint8]]: ...
