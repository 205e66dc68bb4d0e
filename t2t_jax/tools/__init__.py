"""Tools that stand above the library: benchmarks, the device and speed checks, plots (of training curves), the
parameter table, the WMT-shaped corpus generator and the Table 3 sweep. Each is a
`python -m t2t_jax.tools.NAME` command; the library (`t2t_jax/`) never imports them."""
