"""Signatures: simhash fingerprints from text (the schemes), from vectors (random
hyperplanes) and the Jaccard similarity of shingles, with their compiled text pass.

They know nothing of the storage engine; a test checks the contract."""
