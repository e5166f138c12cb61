"""Type stubs of the compiled text pass (ext/simindex/_text.pyx)."""

from typing import Any, Optional

import numpy as np
import numpy.typing as npt

VOTE_KINDS: tuple[int, ...]
SKETCH: int

def build_tables() -> tuple[npt.NDArray[np.uint32], ...]: ...
def signature(text: str, width: int, vote_kind: int = ..., vote_words: int = ...,
              mh_words: int = ..., sketch: bool = ...,
              shingles: bool = ...) -> tuple[int, int, Optional[bytes],
                                             Optional[npt.NDArray[np.uint64]]]: ...
def signatures(texts: list[Any], width: int, vote_kind: int = ..., vote_words: int = ...,
               mh_words: int = ..., sketch: bool = ...,
               shingles: bool = ...) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64],
                                              Optional[list[bytes]],
                                              Optional[list[npt.NDArray[np.uint64]]]]: ...
def intersection_size(a: npt.NDArray[np.uint64], b: npt.NDArray[np.uint64]) -> int: ...
def minhash_codes(sets: list[npt.NDArray[np.uint64]], words: int) -> npt.NDArray[np.uint64]: ...
def sorted_set(raw: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]: ...
def sketch_of_set(exact: npt.NDArray[np.uint64]) -> bytes: ...
