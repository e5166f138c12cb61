"""atheris target: any bytes as manifest.msgpack either read as a manifest or raise a
simindex.Error, nothing else.

    pip install atheris && python3 tools/fuzz/fuzz_manifest.py -max_total_time=300
"""

import os
import sys
import tempfile

import atheris

with atheris.instrument_imports():
    import msgpack

    import simindex
    from simindex.engine import manifest
    from simindex.engine.plan import Plan

DIR = tempfile.mkdtemp(prefix="fuzz-manifest-")


def _value(fdp):
    kind = fdp.ConsumeIntInRange(0, 6)
    return [None, fdp.ConsumeInt(8), fdp.ConsumeUnicode(8), fdp.ConsumeBool(),
            fdp.ConsumeFloat(), [fdp.ConsumeInt(2)], {"k": fdp.ConsumeInt(2)}][kind]


def one(data):
    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeBool():                 # raw bytes
        raw = fdp.ConsumeBytes(fdp.remaining_bytes())
    else:                                 # a valid manifest with fields changed or dropped
        m = manifest.make(Plan(k=3, blocks=None, shards=16), "simindex-v1")
        for _ in range(fdp.ConsumeIntInRange(1, 3)):
            field = fdp.PickValueInList(sorted(m) + ["extra"])
            if fdp.ConsumeBool():
                m.pop(field, None)
            else:
                m[field] = _value(fdp)
        raw = msgpack.packb(m, unicode_errors="surrogatepass")
    with open(os.path.join(DIR, manifest.NAME), "wb") as f:
        f.write(raw)
    try:
        m = manifest.read(DIR)
        m.check_same(k=3, blocks=None, shards=16, scheme=None)
        assert m.plan.ntables == m.tables
    except simindex.Error:
        pass


if __name__ == "__main__":
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()
