"""Type stubs of the Hamming kernels and the pair join (ext/simindex/_join.pyx)."""

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]

def hamming(a: int, b: int) -> int: ...
def within(fps: U64, n: int, q: int, k: int) -> list[tuple[int, int]]: ...
def pairs_sorted(keys: U64, ids: U64, pmask: int, earlier: U64, k: int
                 ) -> tuple[U64, U64, npt.NDArray[np.uint8]]: ...
