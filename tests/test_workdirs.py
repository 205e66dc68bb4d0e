"""A workdir asked what its run is (t2t_jax/workdirs.py)."""

import dataclasses
import json

from t2t_jax import storage, workdirs
from t2t_jax.config import ExperimentConfig


def _record(path, dtype="bfloat16"):
  cfg = ExperimentConfig()
  cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype=dtype))
  (path / workdirs.RUN_INFO).write_text(json.dumps({"experiment": "demo",
                                                    "config": dataclasses.asdict(cfg)}))


def test_a_workdir_says_what_its_run_is_and_pins_its_dtype_only_once_trained(tmp_path):
  run = workdirs.Workdir(str(tmp_path))
  assert (run.record, run.settings, run.config, run.trained, run.trained_dtype) == (
      None, None, None, False, None)
  _record(tmp_path)
  assert run.settings[0] == "demo" and run.config.model.dtype == "bfloat16"
  # A first run that died before its first checkpoint pins nothing.
  assert not run.trained and run.trained_dtype is None
  (tmp_path / "checkpoints" / "7").mkdir(parents=True)   # locally: renamed into place whole
  (tmp_path / "checkpoints" / "8.orbax-checkpoint-tmp").mkdir()  # a write under way
  assert run.committed_steps() == [7] and run.trained and run.trained_dtype == "bfloat16"
  assert run.vocabulary == str(tmp_path / "spm.model")
  assert run.averaged == str(tmp_path / "averaged")


def test_a_damaged_record_is_named_and_stands_for_no_run(tmp_path):
  (tmp_path / workdirs.RUN_INFO).write_text('{"experiment": "demo", "conf')
  run = workdirs.Workdir(str(tmp_path))
  assert run.record is None and run.settings is None
  assert run.damaged.startswith("JSONDecodeError")


def test_the_record_is_read_once_per_version(tmp_path, monkeypatch):
  _record(tmp_path)
  reads = []
  real = storage.read_text
  monkeypatch.setattr(storage, "read_text", lambda p: (reads.append(p), real(p))[1])
  run = workdirs.Workdir(str(tmp_path))
  for _ in range(5):
    assert run.record["experiment"] == "demo" and run.config is not None
  assert len(reads) == 1
  _record(tmp_path, dtype="float32")  # rewritten: a new size, read again
  assert run.config.model.dtype == "float32" and len(reads) == 2
