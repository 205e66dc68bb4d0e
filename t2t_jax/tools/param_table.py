"""Parameter counts of every Table 3 row next to the paper's: `python -m t2t_jax.tools.param_table`.

Counts come from parameter shapes alone (no data, no training). The paper's
figures are rounded to millions and its exact vocabulary is not stated; with
a 37000 shared vocabulary a faithful model lands a few percent low.
"""

from __future__ import annotations

from t2t_jax import model, registry


def rows() -> list[dict]:
  out = []
  for name, row in registry.sweep("table3").items():
    ours = model.count_params(model.abstract_params(registry.get(name).model))
    out.append({"experiment": name, "change": row.change, "ours": ours, "ours_m": ours / 1e6,
                "paper_m": row.paper_params_m})
  return out


def markdown(table: list[dict]) -> str:
  lines = ["| experiment | change | ours | ours (M) | paper (M) | difference |",
           "|---|---|---:|---:|---:|---:|"]
  for r in table:
    paper = f"{r['paper_m']:g}" if r["paper_m"] is not None else "-"
    diff = f"{100 * (r['ours_m'] / r['paper_m'] - 1):+.1f}%" if r["paper_m"] else "-"
    lines.append(f"| {r['experiment']} | {r['change']} | {r['ours']:,d} | {r['ours_m']:.1f} "
                 f"| {paper} | {diff} |")
  return "\n".join(lines)


if __name__ == "__main__":
  print(markdown(rows()))
