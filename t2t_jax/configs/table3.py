"""Table 3 of the paper: each row names only what changes from base_ende.

  python -m t2t_jax.tools.sweep --sweep=table3 --workdir=runs/table3

Expected: each row's newstest2013 perplexity and BLEU as in the paper (kept in ROWS below);
reproduced at reduced scale only so far (results/table3_mini, results/table3_converged).

Rows are evaluated on newstest2013 without checkpoint averaging (Table 3
caption), hence `average.last=1` for all of them, and the end of training decodes
only the dev split (the table has no test column).
"""

from t2t_jax.config import ExperimentConfig, SweepRow, override

from t2t_jax.configs import paper

ROWS: dict[str, SweepRow] = {
    "table3_base": SweepRow("base", {}, 4.92, 25.8, 65),
    "table3_a_h1": SweepRow("(A) h=1, d_k=d_v=512",
                            {"model.num_heads": 1, "model.d_k": 512, "model.d_v": 512},
                            5.29, 24.9, None),
    "table3_a_h4": SweepRow("(A) h=4, d_k=d_v=128",
                            {"model.num_heads": 4, "model.d_k": 128, "model.d_v": 128},
                            5.00, 25.5, None),
    "table3_a_h16": SweepRow("(A) h=16, d_k=d_v=32",
                             {"model.num_heads": 16, "model.d_k": 32, "model.d_v": 32},
                             4.91, 25.8, None),
    "table3_a_h32": SweepRow("(A) h=32, d_k=d_v=16",
                             {"model.num_heads": 32, "model.d_k": 16, "model.d_v": 16},
                             5.01, 25.4, None),
    "table3_b_dk16": SweepRow("(B) d_k=16", {"model.d_k": 16}, 5.16, 25.1, 58),
    "table3_b_dk32": SweepRow("(B) d_k=32", {"model.d_k": 32}, 5.01, 25.4, 60),
    "table3_c_n2": SweepRow("(C) N=2", {"model.num_layers": 2}, 6.11, 23.7, 36),
    "table3_c_n4": SweepRow("(C) N=4", {"model.num_layers": 4}, 5.19, 25.3, 50),
    "table3_c_n8": SweepRow("(C) N=8", {"model.num_layers": 8}, 4.88, 25.5, 80),
    "table3_c_d256": SweepRow("(C) d_model=256, d_k=d_v=32",
                              {"model.d_model": 256, "model.d_k": 32, "model.d_v": 32},
                              5.75, 24.5, 28),
    "table3_c_d1024": SweepRow("(C) d_model=1024, d_k=d_v=128",
                               {"model.d_model": 1024, "model.d_k": 128, "model.d_v": 128},
                               4.66, 26.0, 168),
    "table3_c_ff1024": SweepRow("(C) d_ff=1024", {"model.d_ff": 1024}, 5.12, 25.4, 53),
    "table3_c_ff4096": SweepRow("(C) d_ff=4096", {"model.d_ff": 4096}, 4.75, 26.2, 90),
    "table3_d_drop0": SweepRow("(D) P_drop=0.0", {"model.dropout": 0.0}, 5.77, 24.6, None),
    "table3_d_drop02": SweepRow("(D) P_drop=0.2", {"model.dropout": 0.2}, 4.95, 25.5, None),
    "table3_d_ls0": SweepRow("(D) eps_ls=0.0", {"model.label_smoothing": 0.0}, 4.67, 25.3, None),
    "table3_d_ls02": SweepRow("(D) eps_ls=0.2", {"model.label_smoothing": 0.2}, 5.47, 25.7, None),
    "table3_e_learned_pos": SweepRow("(E) learned positional embedding",
                                     {"model.positional": "learned"}, 4.92, 25.7, None),
    "table3_big": SweepRow("big: d_model 1024, d_ff 4096, h 16, P_drop 0.3, 300k steps",
                           {"model.d_model": 1024, "model.d_ff": 4096, "model.num_heads": 16,
                            "model.dropout": 0.3, "train.steps": 300_000}, 4.33, 26.4, 213),
}


def _row(changes: dict):
  def build() -> ExperimentConfig:
    return override(paper.base_ende(), {"average.last": 1, "train.final_eval_test": False,
                                        **changes})
  return build


EXPERIMENTS = {name: (_row(dict(row.sets)), f"Table 3 {row.change}")
               for name, row in ROWS.items()}
# Sweeps by name (`python -m t2t_jax.tools.sweep --sweep=NAME`): row name -> SweepRow.
SWEEPS = {"table3": ROWS}
