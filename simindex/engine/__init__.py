"""The storage engine: fingerprints kept in block-permutation tables in LMDB, the write
protocol that makes every committed insert durable, and the compiled query kernel.

It imports nothing from the layers above it (signatures, the Index API, datasets, the
integrations); a test checks the contract."""
