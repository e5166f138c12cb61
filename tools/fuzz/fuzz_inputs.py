"""atheris target: input lines (TSV, JSON lines, every fingerprint format) and whole
streams (gzip included) either parse or raise BadLine, nothing else.

    pip install atheris && python3 tools/fuzz/fuzz_inputs.py -max_total_time=300
"""

import io
import sys

import atheris

with atheris.instrument_imports():
    from simindex import inputs
    from simindex.errors import BadLine


def one(data):
    fdp = atheris.FuzzedDataProvider(data)
    fmt = fdp.PickValueInList(["tsv", "jsonl", None])
    fp_format = fdp.PickValueInList(list(inputs.FP_FORMATS))
    raw = fdp.ConsumeBytes(fdp.remaining_bytes())
    try:
        inputs.parse_line(raw.decode("utf-8", "replace"), fmt or "tsv", fp_format, "f:1")
    except BadLine:
        pass
    stream = io.BufferedReader(io.BytesIO(raw))
    orig = inputs.open_input
    inputs.open_input = lambda path: ("f", stream)
    try:
        for _ in inputs.read_items(["f.gz" if raw[:2] == b"\x1f\x8b" else "f"], fmt,
                                   fp_format, max_line=4096):
            pass
    except BadLine:
        pass
    finally:
        inputs.open_input = orig


if __name__ == "__main__":
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()
