"""The storage seam (t2t_jax/storage.py): what differs between a local folder and a bucket."""

import json

from t2t_jax import storage


def _as_bucket(monkeypatch, counted):
  """Local files standing in for a bucket's objects (etils reads local paths too), every
  object write counted in bytes."""
  monkeypatch.setattr(storage, "is_remote", lambda path: True)
  real = storage.write_atomic

  def write_atomic(path, data):
    counted.append(len(data.encode() if isinstance(data, str) else data))
    real(path, data)
  monkeypatch.setattr(storage, "write_atomic", write_atomic)


LINE = json.dumps({"step": 100, "loss": 1.234567, "learning_rate": 7e-4,
                   "tokens_per_sec": 668000.0, "host_ms_per_step": 1.5}) + "\n"


def test_a_bucket_log_is_written_once_per_flush_not_once_per_line(tmp_path, monkeypatch):
  """1,000 log lines, a checkpoint (a flush) every 14 of them, as base_ende logs every 100
  steps and checkpoints every 1,400: more than 10x fewer bytes uploaded than rewriting the
  object at every line, and the object holds every line once, in order."""
  path = str(tmp_path / "metrics.jsonl")
  per_line, per_flush = [], []
  with monkeypatch.context() as m:
    _as_bucket(m, per_line)
    for _ in range(1000):  # what every line cost before: a rewrite of the growing object
      storage.append_lines(path, [LINE])
  (tmp_path / "metrics.jsonl").unlink()
  with monkeypatch.context() as m:
    _as_bucket(m, per_flush)
    log = storage.AppendLog(path)
    for n in range(1, 1001):
      log.append([LINE.replace("100", str(n), 1)])
      if n % 14 == 0:
        log.flush()
    log.flush()
  assert len(per_flush) == 1000 // 14 + 1 and log.bytes_written == sum(per_flush)
  assert sum(per_line) >= 10 * sum(per_flush), (sum(per_line), sum(per_flush))
  steps = [json.loads(l)["step"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert steps == list(range(1, 1001))


def test_a_local_log_appends_each_line_at_once(tmp_path):
  path = tmp_path / "metrics.jsonl"
  log = storage.AppendLog(str(path))
  log.append([LINE])
  assert path.read_text() == LINE  # before any flush



def test_a_bucket_path_without_gcsfs_is_one_line_naming_the_extra(monkeypatch):
  import importlib.util
  import pytest
  from t2t_jax.errors import UserError
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "gcsfs" else real(name, *a))
  monkeypatch.delenv("EPATH_USE_TF", raising=False)
  with pytest.raises(UserError, match=r'gs://b/run: gs:// paths need gcsfs: pip install -e '
                                      r'"\.\[gcs\]"'):
    storage.exists("gs://b/run")
