r"""Table 4 in miniature: a trained parser's dev (and test) F1 under the paper's decoding and
translation's, with and without the tree constraint, beside other runs (a tuned knob), and
EVALB's own figures where its binary is given.

  python -m t2t_jax.tools.parse_table4 --workdir=runs/parse_wsj_sample \
      [--other=dropout_0.1=runs/parse_dropout01] [--other_eval=NAME=WORKDIR] \
      [--evalb=EVALB/evalb --prm=EVALB/COLLINS.prm] [--average_last=N] \
      [--out=results/parse_wsj_sample/table4.jsonl]

Each line of the output is a record: the run, the split, the decoding (beam, alpha, extra
length, constrained), EVALB's figures by `t2t_jax.parsing.evalb`, the well-formed share of the
raw outputs, the outputs the fixed rule repaired, sentences/s; and, with `--evalb`, the
binary's F1 on the same trees and gold file.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

from absl import app, flags

flags.DEFINE_string("workdir", None, "The parser's workdir (the recipe's run).")
flags.DEFINE_multi_string("other", [], "NAME=WORKDIR: another run, decoded the paper's way on "
                          "dev (a knob's other setting).")
flags.DEFINE_multi_string("other_eval", [], "NAME=WORKDIR: another run's own final evaluation "
                          "of dev (its eval/dev.json and trees, decoded by the code that trained "
                          "it), not decoded again.")
flags.DEFINE_string("evalb", "", "An EVALB binary, to score the same trees with it too.")
flags.DEFINE_string("prm", "", "EVALB's parameter file (COLLINS.prm).")
flags.DEFINE_string("out", "", "JSONL file of records.")
flags.DEFINE_bool("test", True, "Also decode test, the paper's way (constrained).")
flags.DEFINE_integer("average_last", 0, "Checkpoints averaged for the decodes (0: as each run "
                     "recorded): a window chosen on dev after training from the checkpoints "
                     "the run kept.")
FLAGS = flags.FLAGS

# (name, beam, alpha, extra length): section 6.3's decoding, and translation's (section 6.1).
DECODINGS = [("paper", 21, 0.3, 300), ("translation", 4, 0.6, 50)]


def evalb_binary_f1(binary: str, prm: str, gold: list[str], test: list[str]) -> float:
  """EVALB's "Bracketing FMeasure" (all sentences) on these trees."""
  with tempfile.TemporaryDirectory() as tmp:
    paths = [os.path.join(tmp, n) for n in ("gold", "test")]
    for path, lines in zip(paths, (gold, test)):
      with open(path, "w") as f:
        f.write("".join(l + "\n" for l in lines))
    out = subprocess.run([binary, "-e", "100000", "-p", prm, *paths], capture_output=True,
                         text=True, check=True).stdout
  return float(re.search(r"-- All --.*?Bracketing FMeasure\s*=\s*([\d.]+)", out, re.S).group(1))


def decode_split(workdir: str, split: str, beam: int, alpha: float, extra: int,
                 constrained: bool, average_last: int = 0
                 ) -> tuple[dict[str, Any], list[str], list[str]]:
  """The run's averaged parser on `split` with these settings (its last `average_last`
  checkpoints averaged; 0: as the run recorded): its figures, its trees and the gold trees."""
  from t2t_jax import checkpoints, input_pipeline, model, retention, tasks, translator, workdirs
  from t2t_jax.config import override
  cfg = workdirs.recorded_config(workdir)
  cfg = override(cfg, {"decode.beam_size": beam, "decode.alpha": alpha,
                       "decode.max_extra_length": extra, "decode.constrained": constrained,
                       "decode.mbr": False})
  ds = input_pipeline.load(cfg, num_devices=1)
  if average_last:  # averaged here: the run's own average is of its `average.last`
    params, steps = checkpoints.average_params(workdir, average_last,
                                               model.abstract_params(cfg.model),
                                               retention.Spacing.of(cfg))
    decoder = translator.beam_decoder(cfg, params, ds.vocab)
    label = f"average of checkpoints {steps[0]}..{steps[-1]} ({len(steps)})"
  else:
    decoder, label = translator.load_decoder(cfg, [workdir], ds.vocab)
  sources, refs = ds.raw(split)
  start = time.time()
  hyps = decoder.translate(sources)
  seconds = time.time() - start
  found = tasks.for_config(cfg).score(sources, hyps, refs, "")
  trees, gold = found.pop("_trees"), found.pop("_gold")
  found.update(split=split, checkpoint=label.replace(workdir, "WORKDIR"), beam_size=beam,
               alpha=alpha, max_extra_length=extra, constrained=constrained,
               num_sentences=len(hyps), decode_seconds=round(seconds, 1),
               sentences_per_sec=round(len(hyps) / max(seconds, 1e-9), 2))
  return found, trees, gold


def stored_eval(workdir: str, split: str) -> tuple[dict[str, Any], list[str], list[str]]:
  """A run's own evaluation of `split` (WORKDIR/eval/<split>.json, .trees, .gold), as
  `decode_split` returns a decoding's; the paper's decoding, as the run's final evaluation
  decodes."""
  folder = os.path.join(workdir, "eval")
  found = json.load(open(os.path.join(folder, f"{split}.json")))
  found["decoded_by"] = {k: found.get(k) for k in ("commit", "date", "machine", "command")}
  for key in ("data", "task", "dtype", "machine", "date", "jax", "commit", "command",
              "min_length"):
    found.pop(key, None)
  found["checkpoint"] = found["checkpoint"].replace(workdir, "WORKDIR")
  read = lambda kind: open(os.path.join(folder, f"{split}.{kind}")).read().splitlines()
  return found, read("trees"), read("gold")


def training_record(run: str, workdir: str) -> dict[str, Any]:
  """What a run trained: its last logged step, training minutes, median tokens/s, dropout,
  parameters, and its Table 2 cost (WORKDIR/cost.json)."""
  import statistics
  from t2t_jax import model, workdirs
  from t2t_jax.tools import plot
  cfg = workdirs.recorded_config(workdir)
  logged = [r for r in plot.read_metrics(workdir) if "tokens_per_sec" in r]
  cost_path = os.path.join(workdir, "cost.json")
  return {"run": run, "kind": "training", "steps": logged[-1]["step"],
          "train_minutes": round(logged[-1]["elapsed_sec"] / 60, 1),
          "median_tokens_per_sec": statistics.median(r["tokens_per_sec"] for r in logged[1:]
                                                     or logged),
          "dropout": cfg.model.dropout, "attention_dropout": cfg.model.attention_dropout,
          "params": model.count_params(model.abstract_params(cfg.model)),
          "cost": json.load(open(cost_path)) if os.path.exists(cost_path) else None}


def main(argv: list[str]) -> None:
  del argv
  from t2t_jax.tools import write_record
  evaluated = [tuple(o.split("=", 1)) for o in FLAGS.other_eval]
  if not FLAGS.workdir and not evaluated:
    sys.exit("error: --workdir is required (or --other_eval alone, to add stored evaluations)")
  runs = ([("recipe", FLAGS.workdir)] if FLAGS.workdir else []) + [
      tuple(o.split("=", 1)) for o in FLAGS.other]
  jobs = []
  if FLAGS.workdir:
    for name, beam, alpha, extra in DECODINGS:
      for constrained in (True, False):
        jobs.append(("recipe", FLAGS.workdir, "dev", name, beam, alpha, extra, constrained))
  for run, workdir in runs[1 if FLAGS.workdir else 0:]:
    jobs.append((run, workdir, "dev", *DECODINGS[0], True))
  if FLAGS.test and FLAGS.workdir:
    jobs.append(("recipe", FLAGS.workdir, "test", *DECODINGS[0], True))
  out = open(FLAGS.out, "a") if FLAGS.out else None
  command = "python -m t2t_jax.tools.parse_table4 " + " ".join(sys.argv[1:])
  def keep(record: dict[str, Any]) -> None:  # written as each comes: nothing lost on a stop
    with tempfile.NamedTemporaryFile("r+") as f:
      write_record({**record, "command": command}, f.name)
      line = json.dumps(json.load(open(f.name)))
    if out:
      out.write(line + "\n")
      out.flush()
  for run, workdir in runs + evaluated:
    keep(training_record(run, workdir))
  for run, workdir in evaluated:
    found, trees, gold = stored_eval(workdir, "dev")
    record = {"run": run, "kind": "decoding", "decoding": "paper", **found}
    if FLAGS.evalb:
      record["evalb_binary_f1"] = evalb_binary_f1(FLAGS.evalb, FLAGS.prm, gold, trees)
    keep(record)
  for run, workdir, split, decoding, beam, alpha, extra, constrained in jobs:
    found, trees, gold = decode_split(workdir, split, beam, alpha, extra, constrained,
                                      FLAGS.average_last)
    record = {"run": run, "kind": "decoding", "decoding": decoding, **found}
    if FLAGS.evalb:
      record["evalb_binary_f1"] = evalb_binary_f1(FLAGS.evalb, FLAGS.prm, gold, trees)
    print(f"{run} {split} {decoding} constrained={constrained}: F1 {found['f1']:.2f} "
          f"(well-formed {found['well_formed_pct']}%, repaired {found['repaired']}, "
          f"{found['sentences_per_sec']} sentences/s)"
          + (f"; EVALB binary {record['evalb_binary_f1']:.2f}" if FLAGS.evalb else ""),
          flush=True)
    keep(record)
  if out:
    out.close()


if __name__ == "__main__":
  app.run(main)
