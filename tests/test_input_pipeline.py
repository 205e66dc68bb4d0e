"""The input pipeline against the files it reads: coverage, token budgets, padding, layouts,
resumption, and clear errors for bad input."""

import collections
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from t2t_jax import data_sources, input_pipeline, registry
from t2t_jax.config import override
from t2t_jax.errors import UserError
from t2t_jax.special_tokens import EOS_ID, PAD_ID

from conftest import shared_data

REPO = Path(__file__).resolve().parents[1]


def _cfg(dataset, **changes):
  return override(registry.get("base_ende"),
                  {"data.dataset": dataset, "data.train_split": "train",
                   "data.dev_split": "valid", "data.test_split": "test2016",
                   "model.vocab_size": 2000, "train.tokens_per_step": 4000,
                   "train.max_tokens_per_batch": 1000, "data.max_length": 64, **changes})


@pytest.fixture(scope="module", params=[False, True], ids=["bucketed", "packed"])
def multi30k(request):
  path = shared_data("multi30k")
  cfg = _cfg(f"folder:{path}:en-de", **{"data.packing": request.param})
  return cfg, path, input_pipeline.load(cfg, num_devices=1)


def _sentences(row):
  """The EOS-terminated sentences of a row, then only PAD (one sentence unless packed)."""
  real = row[row != PAD_ID]
  assert (row[:len(real)] == real).all() and real[-1] == EOS_ID  # padding on the right only
  ends = np.nonzero(real == EOS_ID)[0]
  return [tuple(real[a + 1:b]) for a, b in zip(np.r_[-1, ends[:-1]], ends)]


def _rows(batch):
  """(source ids, target ids) of every sentence pair of the non-filler rows, EOS and
  padding removed: a packed row's sources and targets pair up in order."""
  out = []
  for src, tgt in zip(batch["inputs"].reshape(-1, batch["inputs"].shape[-1]),
                      batch["targets"].reshape(-1, batch["targets"].shape[-1])):
    if (src != PAD_ID).any():
      sources, targets = _sentences(src), _sentences(tgt)
      assert len(sources) == len(targets)
      out.extend(zip(sources, targets))
  return out


def _filled_rows(batch):
  return int((batch["targets"] != PAD_ID).any(-1).sum())


def test_one_epoch_yields_every_training_pair_once(multi30k):
  cfg, path, ds = multi30k
  with open(path / "train.en", encoding="utf-8") as f:
    en = f.read().split("\n")[:-1]
  with open(path / "train.de", encoding="utf-8") as f:
    de = f.read().split("\n")[:-1]
  # Independently tokenised from the files (whitespace-stripped, as the pipeline reads them).
  expected = collections.Counter(
      (tuple(ds.vocab.encode(s.strip())), tuple(ds.vocab.encode(t.strip())))
      for s, t in zip(en, de)
      if max(len(ds.vocab.encode(s.strip())), len(ds.vocab.encode(t.strip()))) + 1
      <= cfg.data.max_length)
  seen = collections.Counter()
  slots = real = 0
  for step in range(ds.steps_per_epoch):
    batch = ds.batch(step)
    seen.update(_rows(batch))
    length = batch["targets"].shape[-1]
    assert _filled_rows(batch) * length <= cfg.train.tokens_per_step  # the step's budget
    micro_tokens = batch["targets"].shape[2] * length
    assert micro_tokens <= cfg.train.tokens_per_step / ds.accum_steps + length
    slots += 2 * batch["inputs"].size
    real += int((batch["inputs"] != PAD_ID).sum() + (batch["targets"] != PAD_ID).sum())
  assert seen == expected
  assert sum(seen.values()) + ds.num_filtered == len(en)
  padding = 1 - real / slots
  info = ds.info()
  print(f"multi30k padding fraction: {padding:.3f} over {ds.steps_per_epoch} steps, "
        f"{info['num_shapes']} shapes")
  assert padding == pytest.approx(info["padding_fraction"], abs=1e-4)
  assert padding < (0.06 if ds.packed else 0.25)
  assert info["num_shapes"] == len(ds.train_shapes()) <= (2 if ds.packed else 50)


def test_eight_device_layout(multi30k):
  cfg, _, ds1 = multi30k
  ds8 = input_pipeline.Dataset(cfg, ds1.directory, num_devices=8)
  assert ds8.accum_steps == 1 and ds1.accum_steps == 4  # 4000 tokens, 1000 per micro-batch
  for step in (0, 7, ds1.steps_per_epoch + 3):
    b1, b8 = ds1.batch(step), ds8.batch(step)
    assert b8["inputs"].shape[:2] == (8, 1) and b1["inputs"].shape[:2] == (1, 4)
    assert b8["inputs"].shape[-1] == b1["inputs"].shape[-1]
    assert b8["targets"].shape[-1] == b1["targets"].shape[-1]
    # The same examples form step k whatever the device count.
    assert collections.Counter(_rows(b1)) == collections.Counter(_rows(b8))


def test_process_shards_partition_the_step(multi30k):
  cfg, _, ds = multi30k
  halves = [input_pipeline.Dataset(cfg, ds.directory, num_devices=2, process_index=p,
                                   process_count=2) for p in (0, 1)]
  whole = input_pipeline.Dataset(cfg, ds.directory, num_devices=4)
  for step in (0, 5):
    parts = [h.batch(step) for h in halves]
    for key in ("inputs", "targets"):
      joined = np.concatenate([p[key] for p in parts])
      np.testing.assert_array_equal(joined, whole.batch(step)[key])


def test_eval_batches_of_two_processes_partition_the_split(multi30k):
  """Each process feeds its own share of every dev batch, so the global devices see every
  example once (the dev loss is not computed whole on every process)."""
  cfg, _, ds = multi30k
  halves = [list(input_pipeline.Dataset(cfg, ds.directory, num_devices=2, process_index=p,
                                        process_count=2).eval_batches("valid")) for p in (0, 1)]
  whole = list(input_pipeline.Dataset(cfg, ds.directory, num_devices=4).eval_batches("valid"))
  assert len(halves[0]) == len(halves[1]) == len(whole)
  for a, b, w in zip(*halves, whole):
    for key in ("inputs", "targets"):
      np.testing.assert_array_equal(np.concatenate([a[key], b[key]]), w[key])
  assert sum(len(_rows(b)) for b in whole) == 1014


def test_restart_at_step_k_yields_the_same_batches(multi30k):
  cfg, _, ds = multi30k
  k = ds.steps_per_epoch - 2  # straddle an epoch boundary
  uninterrupted = ds.train_batches(0)
  for _ in range(k):
    next(uninterrupted)
  restarted = input_pipeline.load(cfg, num_devices=1).train_batches(k)
  for _ in range(5):
    a, b = next(uninterrupted), next(restarted)
    np.testing.assert_array_equal(a["inputs"], b["inputs"])
    np.testing.assert_array_equal(a["targets"], b["targets"])


def test_eval_batches_cover_the_split_and_raw_text_is_complete(multi30k):
  cfg, path, ds = multi30k
  rows = sum(len(_rows(b)) for b in ds.eval_batches("test2016"))
  src, ref = ds.raw("test2016")
  assert rows == len(src) == len(ref) == 1000
  with open(path / "test2016.de", encoding="utf-8") as f:
    assert ref == [line.strip() for line in f.read().split("\n")[:-1]]


def test_bucket_boundaries_follow_t2t():
  b = input_pipeline.bucket_boundaries(64)
  assert b[:5] == [8, 9, 10, 11, 12] and b[-1] == 64
  assert all(b2 > b1 for b1, b2 in zip(b, b[1:]))
  assert all(b2 <= max(b1 + 1, int(b1 * 1.1)) for b1, b2 in zip(b[:-2], b[1:-1]))


# --- bad input ----------------------------------------------------------------------


def _write(folder, files):
  folder.mkdir(parents=True, exist_ok=True)
  for name, content in files.items():
    (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode())


GOOD = {"train.en": "a b\nc d\n", "train.de": "x y\nz w\n", "valid.en": "a\n", "valid.de": "x\n",
        "test.en": "c\n", "test.de": "z\n"}


def _tiny(folder, tmp_path):
  return override(registry.get("demo"), {"data.dataset": f"folder:{folder}:en-de",
                                            "data.data_dir": str(tmp_path / "cache"),
                                            "model.vocab_size": 40})


@pytest.mark.parametrize("change, message", [
    ({"valid.de": None}, "missing file: {folder}/valid.de"),
    ({"train.de": "x y\nz w\nv\n"}, "line counts differ: {folder}/train.en has 2 lines, "
                                   "{folder}/train.de has 3"),
    ({"train.de": b"x y\nz \xff w\n"}, "{folder}/train.de line 2: invalid UTF-8"),
])
def test_bad_files_are_one_line_errors_and_leave_no_cache(tmp_path, change, message):
  folder = tmp_path / "data"
  files = {**GOOD, **change}
  _write(folder, {k: v for k, v in files.items() if v is not None})
  cfg = _tiny(folder, tmp_path)
  with pytest.raises(UserError) as e:
    input_pipeline.load(cfg, num_devices=1)
  assert message.format(folder=folder) in str(e.value)
  assert "\n" not in str(e.value)
  cache = tmp_path / "cache"
  assert not cache.exists() or not any(p.name == "meta.json" for p in cache.rglob("*"))
  # Fixed files then prepare normally: nothing half-written was trusted.
  for name in GOOD:
    (folder / name).unlink(missing_ok=True)
  _write(folder, {**GOOD, "train.en": "a b\nc d\ne\n", "train.de": "x y\nz w\nv\n"})
  ds = input_pipeline.load(cfg, num_devices=1)
  assert ds.info()["train_pairs"] == 3


def test_empty_pairs_are_dropped_and_counted(tmp_path):
  folder = tmp_path / "data"
  _write(folder, {**GOOD, "train.en": "a b\n\nc d\ne\n", "train.de": "x y\nq\nz w\n\n"})
  ds = input_pipeline.load(_tiny(folder, tmp_path), num_devices=1)
  assert ds.info()["train_pairs"] == 2
  assert ds.info()["dropped_empty"]["train"] == 2
  assert "2 empty pairs dropped" in ds.summary()


@pytest.mark.parametrize("spec, message", [
    ("nonsense", "unknown dataset spec 'nonsense'"),
    ("folder:/no/such/dir", "dataset folder not found: /no/such/dir"),
    ("tfds:wmt14_translate/de-en", "name the direction explicitly"),
])
def test_bad_specs(spec, message):
  with pytest.raises(UserError, match=message):
    data_sources.parse_spec(spec)


def test_bad_data_through_the_command_line_is_exit_2(tmp_path):
  folder = tmp_path / "data"
  _write(folder, {**GOOD, "train.de": "x y\n"})
  r = subprocess.run([sys.executable, "-m", "t2t_jax.main", "--experiment=demo",
                      f"--workdir={tmp_path / 'wd'}", f"--dataset=folder:{folder}:en-de",
                      "--set", f"data.data_dir={tmp_path / 'cache'}"],
                     cwd=REPO, capture_output=True, text=True, timeout=300)
  assert r.returncode == 2, r.stderr[-2000:]
  assert "Traceback" not in r.stderr
  assert f"error: line counts differ: {folder}/train.en has 2 lines" in r.stderr


def test_demo_corpus_is_deterministic_and_structured():
  a, b = data_sources.demo_corpus(0), data_sources.demo_corpus(0)
  assert a == b and data_sources.demo_corpus(1) != a
  src, tgt = a["train"]
  assert len(src) == data_sources.DEMO_SIZES["train"]
  held_out = set(a["test"][0]) | set(a["valid"][0])
  assert not held_out & set(src)
  # Structure: source is SVO with a plural-less "-s" verb; the target puts the verb last
  # with a person marker ("-t" singular subject, "-n" plural subject).
  for s, t in zip(src[:200], tgt[:200]):
    assert t.split()[-1][-2] in "tn" and t.endswith(".")
    assert t.split()[0] in {"lo", "la", "los", "las", "un", "una", "unos", "unas"}
  vocab = {w for line in src + tgt for w in line.replace(".", "").split()}
  assert 300 <= len(vocab) <= 1500


# --- the vocabulary: deterministic, shared, carried by the workdir --------------------


def _sampled_corpus(tmp_path, pairs=3000):
  """A folder of `pairs` demo pairs and a config whose vocabulary sample (1,000 sentences)
  is a fifth of its 2 x 3,000 training sentences."""
  folder = tmp_path / "corpus"
  demo = data_sources.demo_corpus(0)
  files = {}
  for split, (src, tgt) in demo.items():
    n = pairs if split == "train" else 50
    files[f"{split}.en"] = "".join(s + "\n" for s in src[:n])
    files[f"{split}.de"] = "".join(t + "\n" for t in tgt[:n])
  _write(folder, files)
  return folder, override(registry.get("demo"), {
      "data.dataset": f"folder:{folder}:en-de", "model.vocab_size": 120,
      "data.vocab_sample_sentences": 1000})


def test_two_preparations_give_the_same_vocabulary_and_ids(tmp_path):
  folder, cfg = _sampled_corpus(tmp_path)
  dirs = []
  for name in ("first", "second"):
    dirs.append(Path(input_pipeline.load(
        override(cfg, {"data.data_dir": str(tmp_path / name)}), num_devices=1).directory))
  meta = json.loads((dirs[0] / "meta.json").read_text())
  assert meta["vocab_sample_sentences"] == 1000 and meta["splits"]["train"] == 3000
  files = sorted(p.name for p in dirs[0].iterdir() if p.suffix in (".model", ".npy"))
  assert "spm.model" in files and "train.tgt.ids.npy" in files
  for name in files:
    assert (dirs[0] / name).read_bytes() == (dirs[1] / name).read_bytes(), name
  # Another sample size is another cache, never this one.
  other = input_pipeline._prepared_dir(override(cfg, {"data.vocab_sample_sentences": 999}),
                                       input_pipeline.resolve_source(cfg))
  assert Path(other).name != dirs[0].name


def test_two_processes_preparing_one_cache_at_once_both_use_the_first_landed(tmp_path):
  folder, cfg = _sampled_corpus(tmp_path)
  code = ("import sys; from t2t_jax import input_pipeline, registry; "
          "from t2t_jax.config import override; "
          f"cfg = override(registry.get('demo'), {{'data.dataset': 'folder:{folder}:en-de', "
          f"'model.vocab_size': 120, 'data.vocab_sample_sentences': 1000, "
          f"'data.data_dir': '{tmp_path / 'shared_cache'}'}}); "
          "ds = input_pipeline.load(cfg, num_devices=1); print('DIR', ds.directory); "
          "print('SHA', input_pipeline.file_sha256(ds.vocab.path))")
  procs = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for _ in range(2)]
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-2000:]
  assert outs[0][0] == outs[1][0]  # the same directory, the same vocabulary
  leftovers = [p.name for p in (tmp_path / "shared_cache").rglob("*") if ".tmp-" in p.name]
  assert leftovers == []


@pytest.mark.long
def test_a_workdir_keeps_its_vocabulary(tmp_path):
  """Training copies the vocabulary into WORKDIR; translate then needs no data cache, and a
  cache holding another vocabulary is a one-line error instead of wrong token ids."""
  folder, _ = _sampled_corpus(tmp_path)
  cache, workdir = tmp_path / "cache", tmp_path / "run"
  base = [sys.executable, "-m", "t2t_jax.main", "--experiment=demo", f"--workdir={workdir}",
          f"--dataset=folder:{folder}:en-de"]
  sets = {"data.data_dir": cache, "model.vocab_size": 120, "data.vocab_sample_sentences": 1000,
          "model.num_layers": 1, "model.d_model": 16, "model.d_ff": 16, "model.num_heads": 2,
          "model.d_k": 8, "model.d_v": 8, "train.steps": 3, "train.final_eval": False,
          "train.tokens_per_step": 256, "train.max_tokens_per_batch": 256}
  sets = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
  run = lambda mode, **kw: subprocess.run(base + [f"--mode={mode}"] + sets, cwd=REPO,
                                          capture_output=True, text=True, timeout=300, **kw)
  r = run("train")
  assert r.returncode == 0, r.stderr[-2000:]
  recorded = (workdir / "spm.model.sha256").read_text().strip()
  assert recorded == input_pipeline.file_sha256(workdir / "spm.model")
  shutil.rmtree(cache)
  r = run("translate", input="the big dog sees a cat\n")
  assert r.returncode == 0, r.stderr[-2000:]
  assert len(r.stdout.splitlines()) == 1 and not cache.exists()
  # A cache with another vocabulary under the same settings (e.g. built from other files).
  cfg_dir = Path(input_pipeline.prepared_dir(override(registry.get("demo"), {
      "data.dataset": f"folder:{folder}:en-de", "data.data_dir": str(cache),
      "model.vocab_size": 120, "data.vocab_sample_sentences": 1000})))
  assert input_pipeline.file_sha256(cfg_dir / "spm.model") == recorded  # rebuilt the same
  other = Path(input_pipeline.prepared_dir(override(registry.get("demo"), {
      "data.dataset": f"folder:{folder}:en-de", "data.data_dir": str(tmp_path / "other"),
      "model.vocab_size": 60, "data.vocab_sample_sentences": 1000})))
  shutil.copyfile(other / "spm.model", cfg_dir / "spm.model")
  r = run("eval", input="x\n")  # eval reads the cache's token ids: they would be wrong
  assert r.returncode == 2, r.stderr[-2000:]
  assert "error: the data cache" in r.stderr and "another vocabulary" in r.stderr
  assert "Traceback" not in r.stderr
  r = run("translate", input="x\n")  # translate reads only the workdir, whatever the cache
  assert r.returncode == 0 and len(r.stdout.splitlines()) == 1, r.stderr[-2000:]


def test_the_cache_follows_the_files_content_not_their_mtimes(tmp_path):
  """The same files copied elsewhere with new mtimes (a remount) reuse the prepared cache;
  one changed line prepares another."""
  folder, cfg = _sampled_corpus(tmp_path)
  cfg = override(cfg, {"data.data_dir": str(tmp_path / "cache")})
  first = input_pipeline.prepared_dir(cfg)
  copy = tmp_path / "elsewhere" / "corpus"
  shutil.copytree(folder, copy)
  for f in copy.iterdir():
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
  moved = override(cfg, {"data.dataset": f"folder:{copy}:en-de"})
  assert input_pipeline.prepared_dir(moved) == first
  lines = (copy / "valid.de").read_text().splitlines()
  (copy / "valid.de").write_text("\n".join(["ein anderer Satz"] + lines[1:]) + "\n")
  assert input_pipeline.prepared_dir(moved) != first


# Three splits of a tiny English-German corpus whose lines name their split and language, so
# a reader that takes the wrong split, key or direction is caught.
def _named_pairs(split: str, n: int = 40) -> list[dict[str, str]]:
  return [{"en": f"the {split} cat number {i} sleeps", "de": f"die {split} katze nummer {i}"}
          for i in range(n)]


def _check_prepared(cfg):
  """The cache's text: English sources and German targets of each split."""
  directory = input_pipeline.prepared_dir(cfg)
  for split in ("train", "validation", "test"):
    src, tgt = input_pipeline.load(cfg, num_devices=1).raw(split)
    assert src[3] == f"the {split} cat number 3 sleeps", (split, src[3])
    assert tgt[3] == f"die {split} katze nummer 3"
  return directory


def test_a_missing_optional_dependency_is_one_line_naming_its_extra(monkeypatch):
  import builtins
  real_import = builtins.__import__

  def no_tfds(name, *args, **kwargs):
    if name.startswith(("tensorflow_datasets", "datasets")):
      raise ImportError(name)
    return real_import(name, *args, **kwargs)
  monkeypatch.setattr(builtins, "__import__", no_tfds)
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
  monkeypatch.setitem(sys.modules, "datasets", None)
  with pytest.raises(UserError, match=r'tfds: source needs tensorflow_datasets.*"\.\[tfds\]"'):
    next(data_sources.iter_tfds_pairs("wmt14_translate/de-en", "train", "en", "de", None))
  with pytest.raises(UserError, match=r'hf: source needs datasets.*"\.\[hf\]"'):
    next(data_sources.iter_hf_pairs("wmt/wmt14/de-en", "train", "en", "de"))


@pytest.mark.extra("tfds", "tensorflow_datasets")
def test_the_tfds_source_reads_the_named_builder_split_and_direction(tmp_path):
  """Offline, through tfds's own mock of the builder: the `wmt14_translate/de-en` builder's
  (de, en) features are read in the spec's en-de direction, split by split, into a run that
  trains a step."""
  import tensorflow_datasets as tfds
  import tensorflow as tf
  from t2t_jax import train
  seen = []

  def as_dataset(builder, split, **kwargs):
    seen.append((builder.name, builder.builder_config.name, str(split)))
    rows = _named_pairs(str(split))
    return tf.data.Dataset.from_tensor_slices({k: [r[k] for r in rows] for k in ("de", "en")})
  cfg = override(registry.get("demo"), {
      "data.dataset": "tfds:wmt14_translate/de-en:en-de", "data.data_dir": str(tmp_path),
      "data.dev_split": "validation", "model.vocab_size": 100, "model.num_layers": 1,
      "model.d_model": 32, "model.d_ff": 64, "model.num_heads": 2, "model.d_k": 16,
      "model.d_v": 16, "train.steps": 1, "train.final_eval": False})
  with tfds.testing.mock_data(as_dataset_fn=as_dataset):
    _check_prepared(cfg)
    train.train_and_evaluate(cfg, str(tmp_path / "run"))
  assert ("wmt14_translate", "de-en", "train") in seen
  assert {s for _, _, s in seen} == {"train", "validation", "test"}


@pytest.mark.extra("tfds", "tensorflow_datasets")
def test_tfds_downloads_into_the_named_data_folder_and_its_cache_is_keyed_by_split(
    tmp_path, monkeypatch):
  """Issue 45 (16): tfds wrote to ~/tensorflow_datasets whatever T2T_JAX_DATA_DIR said (a
  cluster's scratch disk, a shared folder), and a cache prepared with other splits was
  taken for this one: another test split read the first one's text."""
  import tensorflow_datasets as tfds
  import tensorflow as tf
  data_dirs, real_builder = [], tfds.builder

  def builder(name, **kwargs):
    data_dirs.append(kwargs.get("data_dir"))
    return real_builder(name, **kwargs)

  def as_dataset(builder, split, **kwargs):
    rows = _named_pairs(str(split))
    return tf.data.Dataset.from_tensor_slices({k: [r[k] for r in rows] for k in ("de", "en")})
  monkeypatch.setenv("T2T_JAX_DATA_DIR", str(tmp_path / "scratch"))
  cfg = override(registry.get("demo"), {
      "data.dataset": "tfds:wmt14_translate/de-en:en-de", "data.dev_split": "validation",
      "model.vocab_size": 100})
  monkeypatch.setattr(tfds, "builder", builder)
  with tfds.testing.mock_data(as_dataset_fn=as_dataset):
    first = _check_prepared(cfg)
    other = override(cfg, {"data.test_split": "validation"})
    second = input_pipeline.prepared_dir(other)
  assert data_dirs and all(d == str(tmp_path / "scratch") for d in data_dirs)
  assert first != second and first.startswith(str(tmp_path / "scratch"))
  assert input_pipeline.load(other, num_devices=1).raw("validation")[0][3] == \
      "the validation cat number 3 sleeps"


def test_a_tfds_error_keeps_the_lines_that_say_what_to_download_by_hand():
  manual = ("Manual directory /data/manual does not exist or is empty. Create it and "
            "download/extract dataset artifacts in there using instructions:\n"
            "Download train.tgz from https://example.org/corpus and place it in manual_dir.\n")
  assert data_sources._tfds_message(manual).splitlines() == [
      manual.splitlines()[0], "Download train.tgz from https://example.org/corpus and place "
      "it in manual_dir."]
  assert data_sources._tfds_message("Dataset foo not found.\nAvailable: a, b") == \
      "Dataset foo not found."


@pytest.mark.extra("hf", "datasets")
def test_the_hf_source_reads_a_saved_dataset_into_a_training_run(tmp_path):
  """`hf:PATH:en-de` on a DatasetDict saved with save_to_disk (translation dicts, the Hub's
  layout): each split in the asked direction, through a training step; the cache is keyed by
  the saved files' content."""
  import datasets
  from t2t_jax import train
  saved = tmp_path / "saved"
  datasets.DatasetDict({split: datasets.Dataset.from_list(
      [{"translation": r} for r in _named_pairs(split)])
      for split in ("train", "validation", "test")}).save_to_disk(str(saved))
  cfg = override(registry.get("demo"), {
      "data.dataset": f"hf:{saved}:en-de", "data.dev_split": "validation",
      "model.vocab_size": 100, "model.num_layers": 1, "model.d_model": 32, "model.d_ff": 64,
      "model.num_heads": 2, "model.d_k": 16, "model.d_v": 16, "train.steps": 1,
      "train.final_eval": False})
  directory = _check_prepared(cfg)
  assert "/hf-saved-" in directory
  train.train_and_evaluate(cfg, str(tmp_path / "run"))
  with pytest.raises(UserError, match="rows have"):
    next(data_sources.iter_hf_pairs(str(saved), "train", "en", "fr"))


def test_the_cache_keeps_the_training_ids_without_their_text(tmp_path):
  """The training split's text is needed only to tokenise it: kept, it was half of a
  36M-pair cache (results/prepare_36m). Held-out splits keep theirs for BLEU."""
  cfg = override(registry.get("demo"), {"data.data_dir": str(tmp_path),
                                           "model.vocab_size": 100})
  directory = Path(input_pipeline.prepared_dir(cfg))
  names = {p.name for p in directory.iterdir()}
  assert not {"train.src.txt", "train.tgt.txt"} & names
  assert {"train.src.ids.npy", "valid.src.txt", "test.tgt.txt"} <= names
  ds = input_pipeline.load(cfg, num_devices=1)
  assert ds.info()["train_pairs"] > 0 and len(ds.raw("test")[0]) > 0


def test_an_incomplete_cache_folder_is_replaced_not_kept(tmp_path):
  """Issue 45 (7): a cache folder without meta.json (an interrupted copy) was kept as if
  another process had finished first; every run then prepared again and failed."""
  cfg = override(registry.get("demo"), {"data.data_dir": str(tmp_path),
                                           "model.vocab_size": 100})
  out_dir = input_pipeline._prepared_dir(cfg, input_pipeline.resolve_source(cfg))
  os.makedirs(out_dir)
  (Path(out_dir) / "train.src.txt").write_text("half a copy\n")
  directory = input_pipeline.prepared_dir(cfg)
  assert directory == out_dir and (Path(out_dir) / "meta.json").exists()
  assert input_pipeline.load(cfg, num_devices=1).info()["train_pairs"] > 0
  assert not list(Path(out_dir).parent.glob("*.incomplete-*"))


def test_split_names_cannot_leave_the_cache_and_an_empty_training_split_is_named(tmp_path):
  """Issue 45 (13): split names became file names unchecked (`../../x` wrote outside the
  cache), and an empty training split was SentencePiece's traceback."""
  from t2t_jax.config import ConfigError, validate
  with pytest.raises(ConfigError, match="data.dev_split: a split name"):
    validate(override(registry.get("demo"), {"data.dev_split": "../../x"}))
  folder = tmp_path / "data"
  _write(folder, {**GOOD, "train.en": "a\n\n", "train.de": "\nb\n"})
  with pytest.raises(UserError, match="the training split 'train' .* has no pairs"):
    input_pipeline.load(_tiny(folder, tmp_path), num_devices=1)


def test_a_damaged_workdir_vocabulary_is_named_not_unk_is_not_defined(tmp_path):
  """Issue 45 (13): the recorded spm.model.sha256 was never read."""
  cfg = override(registry.get("demo"), {"model.vocab_size": 100})
  cache = input_pipeline.prepared_dir(cfg)
  input_pipeline.record_vocab(str(tmp_path), cache)
  assert input_pipeline.workdir_vocab([str(tmp_path)]) == str(tmp_path / "spm.model")
  with open(tmp_path / "spm.model", "r+b") as f:
    f.seek(100)
    f.write(b"\0\0\0\0")
  with pytest.raises(UserError, match="spm.model is damaged"):
    input_pipeline.load_vocab(cfg, [str(tmp_path)])


def test_held_out_lines_stay_aligned_with_their_files_through_eval(tmp_path):
  """Issue 45 (12): pairs with an empty side were dropped from dev and test too, so
  eval/<split>.hyp was not aligned with the test file and BLEU silently used a subset. They
  are dropped from training only; an empty source translates to an empty line."""
  from t2t_jax import inference, train
  folder = tmp_path / "data"
  _write(folder, {"train.en": "a b\nc d\n\ne f\n" * 20, "train.de": "x y\nz w\nq\nv u\n" * 20,
                  "valid.en": "a\n\nc d\n", "valid.de": "x\ny\n\n",
                  "test.en": "c\n\na b\n", "test.de": "z\nw\nx y\n"})
  cfg = override(_tiny(folder, tmp_path), {
      "model.num_layers": 1, "model.d_model": 16, "model.d_ff": 16, "model.num_heads": 2,
      "model.d_k": 8, "model.d_v": 8, "train.steps": 2, "train.final_eval": False})
  ds = input_pipeline.load(cfg, num_devices=1)
  assert ds.info()["dropped_empty"] == {"train": 20, "valid": 0, "test": 0}
  assert ds.raw("test") == (["c", "", "a b"], ["z", "w", "x y"])
  assert ds.raw("valid") == (["a", "", "c d"], ["x", "y", ""])
  train.train_and_evaluate(cfg, str(tmp_path / "run"))
  inference.run_eval(cfg, str(tmp_path / "run"), splits=["test"], ds=ds)
  hyps = (tmp_path / "run" / "eval" / "test.hyp").read_text().split("\n")[:-1]
  assert len(hyps) == 3 and hyps[1] == ""


def test_a_failed_tfds_wmt_download_names_the_same_corpus_on_the_hub(monkeypatch):
  """statmt.org's WMT downloads fail often under tfds; the one-line error then gives the
  spec that reads the same corpus from the Hugging Face hub."""
  import sys
  import types

  class DownloadError(Exception):
    pass

  def builder(name, data_dir=None):
    raise DownloadError("Failed to get url http://www.statmt.org/wmt13/training-parallel-"
                        "commoncrawl.tgz. HTTP code: 503.")
  monkeypatch.setitem(sys.modules, "tensorflow_datasets",
                      types.SimpleNamespace(builder=builder))
  with pytest.raises(data_sources.DataError) as e:
    next(data_sources.iter_tfds_pairs("wmt14_translate/fr-en", "train", "en", "fr", None))
  assert "HTTP code: 503" in str(e.value) and "\n" not in str(e.value)
  assert "--dataset=hf:wmt/wmt14/fr-en:en-fr" in str(e.value)
  with pytest.raises(data_sources.DataError) as e:
    next(data_sources.iter_tfds_pairs("ted_hrlr_translate/pt_to_en", "train", "pt", "en",
                                      None))
  assert "hf:" not in str(e.value)


def test_a_long_preparation_stage_prints_its_progress_and_time_left(tmp_path, monkeypatch,
                                                                    capsys):
  """Reading and tokenising a WMT split take minutes each: inside them a line comes every
  PROGRESS_EVERY_S (here every chance), with the share done and the time left; the
  ids are the same as a preparation without the lines."""
  folder, cfg = _sampled_corpus(tmp_path, pairs=300)
  plain = Path(input_pipeline.load(override(cfg, {"data.data_dir": str(tmp_path / "a")}),
                                   num_devices=1).directory)
  capsys.readouterr()
  monkeypatch.setattr(input_pipeline, "PROGRESS_EVERY_S", 0.0)
  monkeypatch.setattr(input_pipeline, "TOKENISE_CHUNK", 100)
  logged = Path(input_pipeline.load(override(cfg, {"data.data_dir": str(tmp_path / "b")}),
                                    num_devices=1).directory)
  err = capsys.readouterr().err
  assert "reading train: 299 pairs (" in err
  # 300 sources then 300 targets, 100 a chunk: a line before each chunk after the first.
  for done, pct in ((100, 17), (300, 50), (500, 83)):
    assert f"tokenising train: {done:,d} of 600 sentences ({pct}%, " in err
  assert "s left)" in err
  for name in ("train.src.ids.npy", "train.tgt.ids.npy", "train.tgt.len.npy"):
    assert (plain / name).read_bytes() == (logged / name).read_bytes()


def test_tfds_gives_its_download_and_build_sizes_and_refuses_a_disk_too_small(
    tmp_path, monkeypatch, capsys):
  """Before a tfds download (WMT14 fr-en: gigabytes) the sizes from tfds's catalog and the
  free disk are one line; a disk with less room than download + build is a one-line error
  naming the setting that moves it, before anything is downloaded."""
  import shutil
  import sys
  import types
  downloads = []

  class Builder:
    data_dir = str(tmp_path / "tfds" / "wmt14_translate" / "fr-en" / "1.0.0")
    info = types.SimpleNamespace(download_size=6 * 2**30, dataset_size=15 * 2**30)

    def is_prepared(self):
      return False

    def download_and_prepare(self):
      downloads.append(True)

  monkeypatch.setitem(sys.modules, "tensorflow_datasets",
                      types.SimpleNamespace(builder=lambda name, data_dir=None: Builder()))
  Usage = collections.namedtuple("Usage", "total used free")
  monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(0, 0, 10 * 2**30))
  with pytest.raises(data_sources.DataError) as e:
    next(data_sources.iter_tfds_pairs("wmt14_translate/fr-en", "train", "en", "fr",
                                      str(tmp_path / "tfds")))
  message = str(e.value)
  assert "\n" not in message and "needs at least 21.0 GiB" in message
  assert "10.0 GiB free" in message and "T2T_JAX_DATA_DIR" in message and not downloads
  # The free disk is that of the nearest folder that exists (tmp_path: nothing made yet).
  assert f"free at {tmp_path}" in capsys.readouterr().err
  monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(0, 0, 100 * 2**30))
  Builder.as_dataset = lambda self, split, shuffle_files: iter(())
  monkeypatch.setitem(sys.modules["tensorflow_datasets"].__dict__, "as_numpy", lambda ds: ds)
  assert list(data_sources.iter_tfds_pairs("wmt14_translate/fr-en", "train", "en", "fr",
                                           str(tmp_path / "tfds"))) == []
  err = capsys.readouterr().err
  assert ("tfds:wmt14_translate/fr-en downloads 6.0 GiB and builds 15.0 GiB (tfds's catalog); "
          "100.0 GiB free at") in err and downloads == [True]
