"""The named experiments, in plain Python: each module opens with the command that runs it and
its expected result, and ends with an `EXPERIMENTS` table (name -> (config function,
description)) that `t2t_jax.registry` reads.

- `paper`: the paper's base and big models on WMT14 en-de and en-fr.
- `table3`: every row of Table 3, as changes to base_ende, and the sweep over them.
- `cpu_recipes`: the paper's recipe scaled to an hour on a 2-core CPU (Multi30k, Tatoeba).
- `demo`: the whole path in minutes on a synthetic pair, with no downloads.
"""
