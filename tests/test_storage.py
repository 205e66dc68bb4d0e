"""The storage seam (t2t_jax/storage.py): what differs between a local folder and a bucket."""

import json
import os

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


def test_a_file_written_through_the_seam_appears_whole_or_not_at_all(tmp_path, monkeypatch):
  """`writing`: locally a sibling renamed into place, in a bucket one object write at the
  end; a write that raises leaves the old contents and no stray file in either."""
  for bucket in (False, True):
    with monkeypatch.context() as m:
      writes = []
      if bucket:
        _as_bucket(m, writes)
      path = tmp_path / f"out{bucket}.txt"
      path.write_text("old\n")
      try:
        with storage.writing(str(path)) as f:
          f.write("half")
          raise KeyboardInterrupt
      except KeyboardInterrupt:
        pass
      assert path.read_text() == "old\n" and writes == []
      with storage.writing(str(path)) as f:
        f.write("new\n")
        assert path.read_text() == "old\n"  # nothing shows before the block ends
      assert path.read_text() == "new\n"
      assert writes == ([4] if bucket else [])
  assert sorted(p.name for p in tmp_path.iterdir()) == ["outFalse.txt", "outTrue.txt"]


def test_a_replaced_folder_is_the_old_one_until_the_new_one_is_whole(tmp_path):
  out = tmp_path / "averaged"
  out.mkdir()
  (out / "averaged.json").write_text("old")
  try:
    with storage.replacing_folder(str(out)) as tmp:
      (tmp_path / "averaged.tmp" / "params").write_text("half")
      assert tmp == str(out) + ".tmp"
      raise KeyboardInterrupt
  except KeyboardInterrupt:
    pass
  assert [p.name for p in tmp_path.iterdir()] == ["averaged"]
  assert (out / "averaged.json").read_text() == "old"
  with storage.replacing_folder(str(out)) as tmp:
    open(os.path.join(tmp, "params"), "w").write("new")
  assert [p.name for p in tmp_path.iterdir()] == ["averaged"]
  assert sorted(p.name for p in out.iterdir()) == ["params"]


def test_a_folder_built_locally_for_a_bucket_uploads_its_marker_last(tmp_path, monkeypatch):
  """Export's layout: transformers reads a folder from its config.json, so in a bucket the
  other files must be there before it (no rename to make the folder appear at once)."""
  copied = []
  monkeypatch.setattr(storage, "is_remote", lambda path: str(path).startswith(str(tmp_path)))
  real = storage.copy

  def copy(source, target):  # a bucket needs no folder before its objects
    copied.append(os.path.basename(target))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    real(source, target)
  monkeypatch.setattr(storage, "copy", copy)
  out = str(tmp_path / "export")
  with storage.replacing_folder(out, build_locally=True, last=("config.json",)) as local:
    assert not local.startswith(str(tmp_path))  # built on this machine's disk
    for name in ("config.json", "a.json", "model.safetensors"):
      open(os.path.join(local, name), "w").write(name)
  assert copied == ["a.json", "model.safetensors", "config.json"]
  assert not os.path.exists(local)
  with storage.local_folder(str(tmp_path / "sweep")) as local:
    open(os.path.join(local, "table3.md"), "w").write("| row |")
  assert (tmp_path / "sweep" / "table3.md").read_text() == "| row |"
  assert copied[-1] == "table3.md"


def test_a_discarded_folder_is_moved_aside_before_it_is_deleted(tmp_path, monkeypatch):
  """Pruning strips a checkpoint by moving its training item out first: a kill leaves it
  whole or gone. Shown by failing the deletion: the item is already out of the checkpoint."""
  item = tmp_path / "checkpoints" / "5" / "training"
  item.mkdir(parents=True)
  (item / "data").write_text("x" * 100)
  monkeypatch.setattr(storage.shutil, "rmtree", lambda *a, **k: None)
  storage.discard_tree(str(item), str(tmp_path / "discard"), "5")
  assert not item.exists() and (tmp_path / "discard" / "5" / "data").exists()
  item.mkdir()
  storage.discard_tree(str(item), str(tmp_path / "discard"), "5")
  assert (tmp_path / "discard" / "5.1").exists()
