r"""The documents' tables of figures, rendered from the records in results/:

  python -m t2t_jax.tools.results            # rewrite every table from its records
  python -m t2t_jax.tools.results --check    # exit 1 if any table differs, or a record is short

A record is a JSON file, or one line of a JSONL file, under results/ that names what was
measured and where: `machine`, `date`, `jax` (its version), `commit` (the code's; a record
made before this tool names the commit before the one that last changed it) and `command`. A run's
`metrics.jsonl` is its training log, not a record. A table lies in a Markdown document
between `<!-- table:NAME -->` and `<!-- /table -->`; NAME is one of `TABLES` below, so a
figure typed by hand into a table is overwritten here and fails `--check` (a test runs it).
Figures that are not measurements (projections) say so and give their formula.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

from absl import app, flags

flags.DEFINE_bool("check", False, "Only compare: exit 1 naming each table that differs.")
FLAGS = flags.FLAGS

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"
DOCUMENTS = ("README.md", "USAGE.md", "BENCHMARKS.md", "WORKSPACE.md", "results/*/README.md")
PROVENANCE = ("machine", "date", "jax", "commit", "command")
MARKER = re.compile(r"(<!-- table:([\w-]+) -->\n)(.*?)(<!-- /table -->)", re.S)


# --- records ------------------------------------------------------------------------------

def record_files() -> list[Path]:
  return sorted(p for p in list(RESULTS.rglob("*.json")) + list(RESULTS.rglob("*.jsonl"))
                if not p.name.endswith("metrics.jsonl"))


def read(path: str) -> list[dict[str, Any]]:
  """The records of a file under results/ (a JSON file is one record)."""
  text = (RESULTS / path).read_text()
  if path.endswith(".jsonl"):
    return [json.loads(line) for line in text.splitlines() if line.strip()]
  return [json.loads(text)]


def one(path: str, **match: Any) -> dict[str, Any]:
  """The record of `path` whose fields equal `match` (exactly one)."""
  found = [r for r in read(path) if all(r.get(k) == v for k, v in match.items())]
  if len(found) != 1:
    raise ValueError(f"{path}: {len(found)} records match {match}")
  return found[0]


def missing_provenance() -> list[str]:
  """'PATH: FIELDS' for each record without its machine, date, jax, commit or command."""
  out = []
  for path in record_files():
    rel = str(path.relative_to(RESULTS))
    for i, record in enumerate(read(rel)):
      lacking = [k for k in PROVENANCE if not record.get(k)]
      if lacking:
        out.append(f"results/{rel}" + (f" line {i + 1}" if rel.endswith("l") else "")
                   + f": no {', '.join(lacking)}")
  return out


# --- formatting ---------------------------------------------------------------------------

def _k(value: float) -> str:
  return f"{value / 1000:,.0f}k"


def _table(header: list[str], rows: list[list[Any]]) -> str:
  lines = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---:" if h.endswith(" ") else "---" for h in header) + "|"]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(l.replace("|  |", "| |") for l in lines) + "\n"


def _where(record: dict[str, Any]) -> str:
  return f"{record['machine']}, {record['date']}"


def _link(path: str, from_readme: bool) -> str:
  folder = path.split("/")[0]
  return f"[{folder}](results/{folder}/README.md)" if from_readme else f"`{path}`"


def jax_version(record: dict[str, Any]) -> str:
  """The record's jax version (the speed check's records keep it in their `jax` section)."""
  jax = record["jax"]
  return jax if isinstance(jax, str) else jax["device"]["jax"]


def _caption(*records: dict[str, Any]) -> str:
  """A results README's line under its table: where and when, jax, the commit."""
  r = records[0]
  commits = sorted({x["commit"][:7] for x in records})
  dates = sorted({x["date"] for x in records})
  return (f"\n{r['machine']}; {', '.join(dates)}; jax {jax_version(r)}; "
          f"commit {', '.join(commits)}.\n")


# --- the tables ---------------------------------------------------------------------------

SPEED = "speed_check/h200_2026-11-27_speed_check.json"
REAL_RUN = "packing/h200_2026-11-28_real_run.json"
DEVICE = "device_check/h200_2026-11-26.json"


def _bleu_rows(from_readme: bool) -> list[list[Any]]:
  rows = []
  for what, experiment, path in [
      ("Multi30k en->de, test2016", "multi30k_ende", "multi30k_ende/test2016.json"),
      ("Multi30k en->fr, test2016", "multi30k_enfr", "multi30k_enfr/test2016.json"),
      ("Tatoeba en->de, test", "tatoeba_ende", "tatoeba_ende/ensemble_mbr_run/test.json")]:
    r = one(path)
    rows.append([what, f"`--experiment={experiment}` (1 hour, CPU)",
                 f"sacreBLEU {r['sacrebleu']:.2f}", _where(r), _link(path, from_readme)])
  r = one("bf16_vs_float32/runs.jsonl", dtype="float32", seed=0)
  rows.append(["the demo pair, test", "`--experiment=demo`",
               f"sacreBLEU {r['test_sacrebleu']:.2f} in {r['wall_seconds'] / 60:.1f} min",
               _where(r), _link("bf16_vs_float32/runs.jsonl", from_readme)])
  return rows


def _gpu_rows(from_readme: bool) -> list[list[Any]]:
  speed, real = one(SPEED), one(REAL_RUN)
  jax_speed, peers = speed["jax"], speed["peers"]
  base, big = jax_speed["train base {}"], jax_speed["train big {}"]
  synthetic = real["jax"]["train base {}"]["target_tokens_per_sec"]
  steady = real["real_run_packed"]["steady_target_tokens_per_sec"]
  return [
      ["base_ende training, a real packed run (300k WMT-shaped pairs, bf16)",
       "`bench --what=speed_check --real_run`",
       f"{_k(steady)} target tok/s ({steady / synthetic:.2f}x the synthetic step)",
       _where(real), _link(REAL_RUN, from_readme)],
      ["base / big training step, bf16, 25,600 tokens",
       "`bench --what=speed_check`",
       f"{_k(base['target_tokens_per_sec'])} / {_k(big['target_tokens_per_sec'])} tok/s: "
       f"{base['target_tokens_per_sec'] / peers['peer train base compile']['target_tokens_per_sec']:.2f}x"
       f" / {big['target_tokens_per_sec'] / peers['peer train big']['target_tokens_per_sec']:.2f}x"
       " the PyTorch peer (compiled / eager)", _where(speed), _link(SPEED, from_readme)],
      ["cached beam search, base, beam 4, 256 sentences", "`bench --what=speed_check`",
       f"{jax_speed['decode']['sentences_per_sec']:,.0f} sentences/s: "
       f"{jax_speed['decode']['sentences_per_sec'] / peers['peer decode base']['sentences_per_sec']:.1f}x"
       " transformers' `generate`", _where(speed), _link(SPEED, from_readme)],
  ]


def table_results() -> str:
  """README: what the code reaches, in BLEU and in speed."""
  return _table(["measure", "command", "figure", "machine, date", "record"],
                _bleu_rows(True) + _gpu_rows(True))


# The paper's newstest2014 BLEU (Table 2) and its training time on 8 P100s (section 5.2).
PAPER = {"base_ende": (27.3, "12 h"), "base_enfr": (38.1, "12 h"),
         "big_ende": (28.4, "3.5 days"), "big_enfr": (41.8, "3.5 days")}


def table_projection() -> str:
  """README: hours on one H200, projected (not measured) from measured rates."""
  from t2t_jax import registry
  real = one(REAL_RUN)
  ratio = (real["real_run_packed"]["steady_target_tokens_per_sec"]
           / real["jax"]["train base {}"]["target_tokens_per_sec"])
  rates = {"base": real["real_run_packed"]["steady_target_tokens_per_sec"],
           "big": one(SPEED)["jax"]["train big {}"]["target_tokens_per_sec"] * ratio}
  rows = []
  for name in ("base_ende", "big_ende"):
    size = name.split("_")[0]
    t = registry.get(name).train
    hours = t.steps * t.tokens_per_step / rates[size] / 3600
    how = (f"{t.steps:,} x {t.tokens_per_step:,} tokens / {_k(rates[size])} tok/s"
           + ("" if size == "base" else f" (the big step's rate x {ratio:.3f}, the real run's "
                                        "ratio to its synthetic step)"))
    rows.append([f"`{name}` / `{size}_enfr`",
                 f"{PAPER[name][0]} / {PAPER[size + '_enfr'][0]}", PAPER[name][1],
                 f"{hours:.1f} h (projected)", how])
  return _table(["experiment", "paper BLEU ", "the paper: 8 P100", "1 H200 ", "formula"], rows)


def table_benchmarks() -> str:
  """BENCHMARKS: every measurement the documents quote, each with its record."""
  dev = one(DEVICE)
  b16 = next(t for t in dev["train"] if t["dtype"] == "bfloat16" and t["batch"] == 256)
  rows = _gpu_rows(False) + [
      ["base training, bf16, 256 x 64 tokens", "`bench --what=device_check`",
       f"{_k(b16['target_tokens_per_sec'])} tok/s, {b16['matmul_peak_fraction']:.0%} of the "
       "bf16 matmul peak measured beside it", _where(dev), _link(DEVICE, False)]]
  host = one("trainer_overhead/bench_host.json")
  rows.append(["the trainer's loop against its bare step, 8 simulated devices",
               "`bench --what=host`", f"{host['loop_over_step']:.2f}x; host work "
               f"{host['host_ms_per_step']:.1f} ms per step", _where(host),
               _link("trainer_overhead/bench_host.json", False)])
  for batching in ("bucketed", "packed"):
    r = one("packing/input_1_device.jsonl", batching=batching)
    rows.append([f"base_ende's batches, 2M WMT-shaped pairs, {batching}",
                 "`bench --what=input`", f"{r['num_shapes']} shape(s), "
                 f"{r['target_padding_fraction']:.1%} target padding, "
                 f"{r['target_tokens_per_sec'] / 1e6:.1f}M target tok/s", _where(r),
                 _link("packing/input_1_device.jsonl", False)])
  prep = one("prepare_36m/meta.json")
  rows.append(["preparing 36M WMT-length pairs (WMT14 en-fr's size)", "`bench --what=input`",
               f"{prep['prepare_seconds'] / 60:.1f} min, {prep['prepare_peak_rss_mb'] / 1000:.2f}"
               " GB peak memory", _where(prep), _link("prepare_36m/meta.json", False)])
  disk = one("checkpoint_disk/big_ende.json")
  rows.append(["big_ende's kept checkpoints, every one whole / two whole",
               "`tools.checkpoint_disk`", f"{disk['before']['bytes'] / 1e9:.1f} / "
               f"{disk['after']['bytes'] / 1e9:.1f} GB", _where(disk),
               _link("checkpoint_disk/big_ende.json", False)])
  bucket = one("bucket_checkpoints/base_ende.json")
  rows.append(["a base checkpoint saved to a bucket (local server) / to disk; training "
               "tok/s, bucket / disk workdir", "`tools.bucket_save`",
               f"{bucket['bucket_over_local_whole']:.2f}x the time; "
               f"{bucket['trainer_bucket_over_local']:.2f}x", _where(bucket),
               _link("bucket_checkpoints/base_ende.json", False)])
  deploy = read("deploy_cpu/demo_2026-11-27_final.jsonl")
  ours = next(r for r in deploy if r["decoder"].startswith("t2t_jax float32"))
  hf = next(r for r in deploy if r["decoder"].startswith("transformers") and "float32"
            in r["decoder"])
  rows.append(["translating the demo's test split on CPU, float32, beam 4",
               "`bench --what=deploy`", f"{ours['sentences_per_sec']:.0f} sentences/s, "
               f"{ours['sentences_per_sec'] / hf['sentences_per_sec']:.2f}x transformers' "
               "`generate`", _where(ours), _link("deploy_cpu/demo_2026-11-27_final.jsonl", False)])
  return _table(["measure", "command", "figure", "machine, date", "record"], rows)


def table_bucket_checkpoints() -> str:
  r = one("bucket_checkpoints/base_ende.json")
  m = r["median_seconds"]
  tok = {k: sorted(v)[len(v) // 2] for k, v in r["trainer_tokens_per_sec"].items()}
  rows = [["a whole save, written and committed (median s)", f"{m['local_whole']:.2f}",
           f"{m['bucket_whole']:.2f}", f"{r['bucket_over_local_whole']:.2f}"],
          ["this process's CPU time for it (median s)", f"{m['local_cpu']:.2f}",
           f"{m['bucket_cpu']:.2f}", f"{r['bucket_over_local_cpu']:.2f}"],
          ["what the loop waits for with asynchronous saves (median s)",
           f"{m['local_blocking']:.2f}", f"{m['bucket_blocking']:.2f}",
           f"{m['bucket_blocking'] / m['local_blocking']:.2f}"],
          ["the trainer's tokens/s, a checkpoint every 10 steps (median of "
           f"{len(r['trainer_tokens_per_sec']['local'])} runs)", f"{tok['local']:,.0f}",
           f"{tok['bucket']:,.0f}", f"{r['trainer_bucket_over_local']:.2f}"]]
  return _table(["", "local disk ", "bucket ", "bucket / local "], rows) + _caption(r)


def table_checkpoint_disk() -> str:
  r = one("checkpoint_disk/big_ende.json")
  rows = [[label, s["whole"], s["steps_kept"], f"{s['bytes'] / 1e9:.1f}",
           f"{s['median_save_seconds']:.1f}"]
          for label, s in (("every kept checkpoint whole", r["before"]),
                           ("two whole, the rest parameters alone", r["after"]))]
  return _table(["layout", "whole ", "kept ", "GB ", "save (median s) "], rows) + \
      f"\nAfter / before: {r['after_over_before']:.3f}.\n" + _caption(r)


def table_bf16_vs_float32() -> str:
  runs = read("bf16_vs_float32/runs.jsonl")
  rows = [[r["dtype"], r["seed"], f"{r['final_dev_loss']:.4f}", f"{r['test_sacrebleu']:.2f}",
           r["wall_seconds"]] for r in runs]
  return _table(["dtype", "seed ", "dev loss ", "test sacreBLEU ", "seconds "], rows) + \
      _caption(*runs)


def _decoding(record: dict[str, Any]) -> str:
  return f"beam {record['beam_size']}" + (f" + MBR (T={record['mbr_temperature']:g})"
                                          if record.get("mbr") else "")


def _bleu_table(folder: str, split: str) -> str:
  """An ensemble recipe's figures: each member decoded alone, then the ensemble."""
  rows = []
  for member in ("member0", "member1", None):
    name = f"{member}/" if member else ""
    test, valid = one(f"{folder}/{name}{split}.json"), one(f"{folder}/{name}valid.json")
    label = f"member {member[-1]}" if member else "**the ensemble (the recipe)**"
    rows.append([label, _decoding(test), f"{valid['sacrebleu']:.2f}",
                 f"{test['sacrebleu']:.2f}", f"{test['tokenized_bleu']:.2f}"])
  return _table(["model", "decoding", "valid sacreBLEU ", f"{split} sacreBLEU ",
                 f"{split} tokenized "], rows) + _caption(one(f"{folder}/{split}.json"))


def table_tatoeba_ende() -> str:
  folder = "tatoeba_ende/ensemble_mbr_run"
  test, valid = one(f"{folder}/test.json"), one(f"{folder}/valid.json")
  rows = [["the ensemble, beam 8 + MBR (the recipe)", f"{valid['sacrebleu']:.2f}",
           f"{test['sacrebleu']:.2f}", f"{test['tokenized_bleu']:.2f}"]]
  old = one("tatoeba_ende/test.json")
  old_valid = one("tatoeba_ende/valid.json")
  rows.append([f"an earlier run, beam {old['beam_size']}, no MBR",
               f"{old_valid['sacrebleu']:.2f}", f"{old['sacrebleu']:.2f}",
               f"{old['tokenized_bleu']:.2f}"])
  return _table(["model", "valid sacreBLEU ", "test sacreBLEU ", "test tokenized "], rows) + \
      _caption(test)


def table_deploy_cpu() -> str:
  runs = read("deploy_cpu/demo_2026-11-27_final.jsonl")
  ours = next(r for r in runs if r["decoder"].startswith("t2t_jax float32"))
  rows = [[r["decoder"], f"{r['sentences_per_sec']:.0f}",
           f"{min(r['sentences_per_sec_rounds']):.0f}-{max(r['sentences_per_sec_rounds']):.0f}",
           f"{r['sacrebleu']:.2f}", f"{ours['sentences_per_sec'] / r['sentences_per_sec']:.2f}"]
          for r in runs]
  return _table(["decoder", "sentences/s (median of 5) ", "the five passes",
                 "sacreBLEU ", "ours (float32) / this "], rows) + _caption(*runs)


def table_device_check() -> str:
  r = one(DEVICE)
  peak = r["matmul_peak_flops_per_sec"]
  rows = [["matmul peak, 8192^3, bf16 / float32 (TF32)",
           f"{peak['bfloat16'] / 1e12:.0f} / {peak['float32'] / 1e12:.0f} TFLOP/s"]]
  for t in r["train"]:
    rows.append([f"{t['workload']}, {t['dtype']}, {t['batch']} x {t['length']} tokens",
                 f"{_k(t['target_tokens_per_sec'])} tok/s, {t['matmul_peak_fraction']:.1%} "
                 "of the peak"])
  b = r["beam_search"]
  rows.append([f"cached beam search, base, beam {b['beam_size']}, {b['sentences']} sentences",
               f"{b['sentences_per_sec']:,.0f} sentences/s"])
  res = r["resume"]
  rows.append([f"SIGTERM at step {res['stopped_at_step']}, resumed to {res['steps']}",
               "bit-identical losses and parameters" if res["resume_matches"] else "differs"])
  return _table(["measure", "figure"], rows) + _caption(r)


def table_speed_check() -> str:
  r = one(SPEED)
  jx, peers = r["jax"], r["peers"]
  rows = []
  for size, peer in (("base", "peer train base compile"), ("big", "peer train big")):
    ours, theirs = jx[f"train {size} {{}}"], peers[peer]
    rows.append([f"{size} training step, bf16, 800 x 32 tokens, target tok/s (peer: "
                 f"{'torch.compile' if 'compile' in peer else 'eager'})",
                 _k(ours["target_tokens_per_sec"]), _k(theirs["target_tokens_per_sec"]),
                 f"{ours['target_tokens_per_sec'] / theirs['target_tokens_per_sec']:.2f}"])
  ours, theirs = jx["decode"], peers["peer decode base"]
  rows.append(["cached beam search, base, beam 4, 256 sentences, sentences/s",
               f"{ours['sentences_per_sec']:,.0f}", f"{theirs['sentences_per_sec']:,.0f}",
               f"{ours['sentences_per_sec'] / theirs['sentences_per_sec']:.1f}"])
  rows.append(["the trainer's loop over its bare step", f"{r['summary']['loop_over_step']['value']:.2f}",
               "", ""])
  return _table(["measure", "ours ", "PyTorch peer ", "ratio "], rows) + _caption(r)


def table_packing() -> str:
  rows = []
  for devices in (1, 8):
    path = f"packing/input_{devices}_device{'s' if devices > 1 else ''}.jsonl"
    for batching in ("bucketed", "packed"):
      r = one(path, batching=batching)
      rows.append([batching, devices, r["num_shapes"], f"{r['target_padding_fraction']:.1%}",
                   f"{r['masked_attention_share_measured']:.2%}",
                   f"{r['target_tokens_per_sec'] / 1e6:.1f}M", r["steps_per_epoch"]])
  cpu = _table(["batching", "devices ", "step shapes ", "target padding ",
                "masked attention FLOPs ", "target tok/s ", "steps per epoch "], rows)
  real = one(REAL_RUN)
  run = real["real_run_packed"]
  synthetic = real["jax"]["train base {}"]["target_tokens_per_sec"]
  gpu = _table(["real packed run, base_ende, bf16", "figure"], [
      ["steady target tok/s", f"{_k(run['steady_target_tokens_per_sec'])} "
       f"({run['steady_target_tokens_per_sec'] / synthetic:.3f}x the synthetic 800 x 32 step, "
       f"{_k(synthetic)})"],
      ["seconds from launch to the steady state", f"{run['seconds_to_steady_state']:.0f}"],
      ["programs compiled before step 1 / after", f"{run['compiled_ahead']} / "
       f"{run['compiles_after_warmup']}"]])
  return cpu + _caption(one("packing/input_1_device.jsonl", batching="packed")) + "\n" + gpu + \
      _caption(real)


def table_prepare_36m() -> str:
  prep = one("prepare_36m/meta.json")
  pairs = one("prepare_36m/bench_input.jsonl", what="prepare")["train_pairs"]
  batches = one("prepare_36m/bench_input.jsonl", what="input")
  return _table(["measure", "figure"], [
      ["training pairs", f"{pairs:,}"],
      ["preparation, wall (the cache's meta.json)", f"{prep['prepare_seconds']:.0f} s "
       f"({prep['prepare_seconds'] / 60:.1f} min)"],
      ["preparation, peak resident memory", f"{prep['prepare_peak_rss_mb'] / 1000:.2f} GB"],
      [f"then base_ende's batches, {batches['devices']} devices",
       f"{batches['target_tokens_per_sec'] / 1e6:.1f}M target tok/s"]]) + _caption(prep)


def table_trainer_overhead() -> str:
  host = one("trainer_overhead/bench_host.json")
  runs = [r for r in read("trainer_overhead/restructure_host_2026-11-28.jsonl")
          if r["what"] == "host"]
  rows = [[f"8 simulated devices, {host['tokens_per_step']:,} tokens per step",
           f"{host['loop_ms_per_step']:.1f}", f"{host['bare_step_ms']:.1f}",
           f"{host['loop_over_step']:.3f}", f"{host['host_ms_per_step']:.1f}"]]
  rows += [[f"1 device, code {r['code']}, run {r['run']}", f"{r['loop_ms_per_step']:.1f}",
            f"{r['bare_step_ms']:.1f}", f"{r['loop_over_step']:.3f}",
            f"{r['host_ms_per_step']:.1f}"] for r in runs]
  return _table(["run", "loop ms/step ", "bare step ms ", "loop / step ", "host ms/step "],
                rows) + _caption(host) + _caption(*runs)


def table_progress_first_line() -> str:
  runs = [one(f"trainer_overhead/progress_demo_{i}.json") for i in (1, 2, 3)]
  rows = [[f"demo {i}", f"{r['first_tokens_per_sec']:,.0f}",
           f"{r['steady_tokens_per_sec']:,.0f}", f"{r['first_over_steady']:.2f}",
           f"{r['first_eta_sec']:.0f} s / {r['seconds_actually_left']:.0f} s",
           f"{r['eta_over_actual']:.2f}"] for i, r in enumerate(runs, 1)]
  return _table(["run", "first tok/s ", "steady ", "ratio ", "ETA / time left ", "ratio "],
                rows) + _caption(*runs)


def _table3(folder: str) -> str:
  with open(RESULTS / folder / "table3.csv") as f:
    rows = list(csv.DictReader(f))
  record = one(f"{folder}/record.json")
  tokenized = "dev_tokenized_bleu" in rows[0]  # older reports: sacreBLEU only
  bleu = "dev_tokenized_bleu" if tokenized else "dev_bleu"
  out = [[r["change"], r.get("seeds", "1"), r["dev_ppl"], r[bleu], r["paper_dev_ppl"],
          r["paper_dev_bleu"], r.get("dev_ppl_vs_base", "")] for r in rows]
  header = ["row", "seeds ", "dev PPL ", "dev BLEU (tokenized) " if tokenized else
            "dev sacreBLEU ", "paper PPL ", "paper BLEU (tokenized) ",
            "PPL against base's seed spread"]
  if not any(r[-1] for r in out):
    out, header = [r[:-1] for r in out], header[:-1]
  return _table(header, out) + _caption(record)


TABLE4 = "parse_wsj_sample/table4.jsonl"
# The label recipe before its source rows were cut to the longest source and its checkpoints
# kept every 100 steps, and its dropout 0.3 run: a knob's pair trained alike.
EARLIER = "parse_wsj_sample/earlier/table4.jsonl"
# The same hour with the paper's bracket targets (the words copied in place of XX), and its
# variants: the recipe before the labels.
BRACKETS = "parse_wsj_sample/brackets"


def table_table4() -> str:
  """README: the paper's Table 4 rows beside this code's parser on the 10% sample."""
  test = one("parse_wsj_sample/test.json")
  brackets = one(f"{BRACKETS}/test.json")
  xx = one(f"{BRACKETS}/xx_targets/test.json")
  trained = one(TABLE4, run="recipe", kind="training")
  rows = [["Transformer (4 layers), WSJ only: `parse_wsj`", "WSJ 02-21 (40K trees)", "91.3",
           "not run here (needs LDC's Treebank-3)"],
          ["Transformer (4 layers), semi-supervised: `parse_wsj_semisup`",
           "WSJ + 17M silver trees", "92.7", "not run here"],
          [f"`parse_wsj_sample`: 4+4 layers, width 256, a label per word (`word_labels`), "
           f"{trained['train_minutes']:g} min on 2 CPU cores",
           "NLTK's 10% sample, wsj_0001-0159 (3.4K trees)", "",
           f"F1 {test['f1']:.2f} on wsj_0180-0199 (not section 23)"],
          ["the same hour, brackets with the words in place of XX (`words`)", "the same", "",
           f"F1 {brackets['f1']:.2f}"],
          ["the same hour, the paper's brackets, XX (`xx`)", "the same", "",
           f"F1 {xx['f1']:.2f}"]]
  dates = ", ".join(sorted({test["date"], brackets["date"], xx["date"]}))
  return _table(["model", "training data", "paper, WSJ 23 F1 ", "here"], rows) + \
      f"\n{test['machine']}, {dates}; [parse_wsj_sample](results/parse_wsj_sample/README.md).\n"


def table_parse_sample() -> str:
  """results/parse_wsj_sample: dev and test F1 by decoding, run and constraint."""
  rows, earlier = [], read(EARLIER)
  decoded = [("", TABLE4, r) for r in read(TABLE4) if r["kind"] == "decoding"] + [
      ("earlier ", EARLIER, r) for r in earlier if r["kind"] == "decoding"
      and (r["split"], r["decoding"], r["constrained"]) == ("dev", "paper", True)]
  for prefix, path, r in decoded:
    trained = one(path, run=r["run"], kind="training")
    rows.append([prefix + r["run"], f"{trained['dropout']:g}", trained["steps"], r["split"],
                 f"{r['decoding']}: beam {r['beam_size']}, alpha {r['alpha']:g}, "
                 f"+{r['max_extra_length']}", "yes" if r["constrained"] else "no",
                 f"{r['f1']:.2f}", r.get("evalb_binary_f1", ""), f"{r['recall']:.2f}",
                 f"{r['precision']:.2f}", f"{r['complete_match']:.2f}",
                 f"{r['well_formed_pct']:g}", r["repaired"], f"{r['sentences_per_sec']:g}"])
  dev = one("parse_wsj_sample/dev.json")
  return _table(["run", "dropout ", "steps ", "split", "decoding", "constrained", "F1 ",
                 "EVALB's F1 ", "recall ", "precision ", "complete match ", "well-formed % ",
                 "repaired ", "sentences/s "], rows) + _caption(*read(TABLE4), *earlier) + (
      f"\nThe recipe's own final evaluation (`dev.json`, `test.json`): dev F1 {dev['f1']:.2f} "
      f"in {dev['decode_seconds']:g} s ({dev['sentences_per_sec']:g} sentences/s, beam "
      f"{dev['beam_size']}, +{dev['max_extra_length']}), test F1 "
      f"{one('parse_wsj_sample/test.json')['f1']:.2f}.\n")


def _ci_runs() -> list[tuple[str, dict[str, Any]]]:
  """results/ci_time's records, by file name (each a run of `bash .ci/run`)."""
  return [(p.stem, read(f"ci_time/{p.name}")[0])
          for p in sorted((RESULTS / "ci_time").glob("*.json"))]


def table_ci_time() -> str:
  """Each CI run's stages side by side, in minutes, then its tests' counts."""
  runs = _ci_runs()
  names = list(dict.fromkeys(s["name"] for _, r in runs for s in r["stages"]))
  minutes = [{s["name"]: f"{s['seconds'] / 60:.1f}" for s in r["stages"]} for _, r in runs]
  rows = [[name] + [m.get(name, "") for m in minutes] for name in names]
  rows.append(["**total**"] + [f"**{r['total_sec'] / 60:.1f}**" if r.get("total_sec") else ""
                                for _, r in runs])
  rows.append(["tests passed / failed"] + [
      f"{sum(p.get('passed', 0) for p in r['pytest'])} / "
      f"{sum(p.get('failed', 0) for p in r['pytest'])}" for _, r in runs])
  out = _table(["stage (minutes)"] + [f"{label} " for label, _ in runs], rows) + "\n"
  out += "\n".join(f"- `{label}`: {_where(r)}, jax {r['jax']}, commit {r['commit'][:7]}"
                   + (f"; {r['note']}" if r.get("note") else "") for label, r in runs) + "\n"
  return out


def table_ci_newest() -> str:
  """The newest CI run's stages in minutes, one line (WORKSPACE.md's CI section)."""
  label, r = _ci_runs()[-1]
  stages = "; ".join(f"{s['name']} {s['seconds'] / 60:.1f}" for s in r["stages"])
  return (f"Minutes (run `{label}`, {r['date']}): {stages}; **total "
          f"{r['total_sec'] / 60:.1f}**.\n")


def table_ci_slowest() -> str:
  """The newest run's 20 slowest test phases, each with its stage."""
  from t2t_jax.tools import ci_time
  label, r = _ci_runs()[-1]
  rows = [[f"{t['seconds']:.1f}", t["phase"], f"`{t['test'].removeprefix('tests/')}`",
           t.get("part") or t.get("stage") or ""] for t in ci_time.slowest(r)]
  return _table(["seconds ", "phase", "test", "stage"], rows) + f"\nRun `{label}`.\n"


TABLES: dict[str, Callable[[], str]] = {
    "ci_time": table_ci_time,
    "ci_slowest": table_ci_slowest,
    "ci_newest": table_ci_newest,
    "results": table_results,
    "projection": table_projection,
    "benchmarks": table_benchmarks,
    "bucket_checkpoints": table_bucket_checkpoints,
    "checkpoint_disk": table_checkpoint_disk,
    "bf16_vs_float32": table_bf16_vs_float32,
    "multi30k_ende": lambda: _bleu_table("multi30k_ende", "test2016"),
    "multi30k_enfr": lambda: _bleu_table("multi30k_enfr", "test2016"),
    "tatoeba_ende": table_tatoeba_ende,
    "deploy_cpu": table_deploy_cpu,
    "device_check": table_device_check,
    "speed_check": table_speed_check,
    "packing": table_packing,
    "prepare_36m": table_prepare_36m,
    "trainer_overhead": table_trainer_overhead,
    "progress_first_line": table_progress_first_line,
    "table3_converged": lambda: _table3("table3_converged"),
    "table3_mini": lambda: _table3("table3_mini"),
    "table4": table_table4,
    "parse_wsj_sample": table_parse_sample,
}


# --- documents ----------------------------------------------------------------------------

def documents() -> list[Path]:
  out = []
  for pattern in DOCUMENTS:
    out += sorted(REPO.glob(pattern))
  return out


def render(text: str, where: str = "") -> tuple[str, list[str]]:
  """`text` with every marked table rendered again, and the names of those that changed."""
  changed = []

  def one_table(m: re.Match) -> str:
    name = m.group(2)
    if name not in TABLES:
      raise ValueError(f"{where}: no table named {name!r} (tools/results.py's TABLES)")
    new = TABLES[name]()
    if new != m.group(3):
      changed.append(f"{where}: table {name}")
    return m.group(1) + new + m.group(4)

  return MARKER.sub(one_table, text), changed


def check() -> list[str]:
  """What differs: tables whose text is not their records', records without provenance."""
  problems = missing_provenance()
  for path in documents():
    problems += render(path.read_text(), str(path.relative_to(REPO)))[1]
  return problems


def main(argv: list[str]) -> None:
  del argv
  if FLAGS.check:
    problems = check()
    for p in problems:
      print(f"differs from its records: {p}" if ": table " in p else p)
    sys.exit(1 if problems else 0)
  for path in documents():
    text, changed = render(path.read_text(), str(path.relative_to(REPO)))
    if changed:
      path.write_text(text)
      print("rendered " + ", ".join(changed))
  for p in missing_provenance():
    print(p)


if __name__ == "__main__":
  app.run(main)
