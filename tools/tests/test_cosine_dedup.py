"""tools/cosine_dedup.py: deduplication by cosine similarity of documents' vectors, with
simhash signatures from random hyperplanes or from words, checked against the exact pairs."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_cosine_workflow_runs_end_to_end(tmp_path):
    base = " ".join(f"clause{i} of the license text" for i in range(300))
    docs = {"a": base, "b": base + " with one more line", "c": base.replace("clause7 ", ""),
            "d": "an entirely different notice " * 40, "e": "yet another text body " * 50}
    for name, text in docs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "copyright").write_text(text)
    for signature in ("hyperplanes", "words"):
        p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "cosine_dedup.py"),
                            "--dir", str(tmp_path), "--signature", signature, "--cosine", "0.95"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert "5 documents" in p.stdout
        assert "exact answer: 3 pairs; found 3 (recall 1.000), none wrong: True" in p.stdout
