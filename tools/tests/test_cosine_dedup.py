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


def test_the_workflow_stops_quietly_when_its_reader_closes_the_pipe(tmp_path):
    """`python3 tools/cosine_dedup.py | head -1`: no traceback, the status of `cat` there
    (here the reader closes the pipe before the first line is written)."""
    for i in range(20):
        (tmp_path / f"p{i}").mkdir()
        (tmp_path / f"p{i}" / "copyright").write_text(f"notice {i} " + "some words " * 50)
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "tools", "cosine_dedup.py"),
                          "--dir", str(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=120) == 141 and b"Traceback" not in err, err
