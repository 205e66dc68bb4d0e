"""JSON-lines files (metrics.jsonl): read back whatever was written whole.

A host crash or a network filesystem can leave the last line torn; every reader skips such a
line with a warning naming it, instead of failing every later resume or plot.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def read(path: str) -> list[dict[str, Any]]:
  """The objects of the file's lines, in order, without blank and undecodable lines."""
  from t2t_jax import storage
  return parse(storage.read_bytes(path), path)


def parse(data: bytes, path: str) -> list[dict[str, Any]]:
  """`read` of the bytes of `path`, already read."""
  rows = []
  text = data.decode("utf-8", errors="replace")
  for number, line in enumerate(text.splitlines(), start=1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      row = None
    if not isinstance(row, dict):
      print(f"warning: {path} line {number} is not a whole JSON object (a torn write?); "
            f"skipped", file=sys.stderr, flush=True)
      continue
    rows.append(row)
  return rows
