"""The dataset workflow of `simindex dedup`: rows read from JSONL, CSV or Parquet, judged in
input order against an index, and written out with their reports."""
