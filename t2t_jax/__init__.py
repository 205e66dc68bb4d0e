"""t2t_jax: the Transformer of "Attention Is All You Need" in JAX/Flax.

`from t2t_jax import Translator` (t2t_jax/translator.py) and `from t2t_jax import Parser`
(t2t_jax/parser.py) are the Python API. They load on first use, so that importing the
package for `--help` or a config starts no JAX.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
  if name == "Translator":
    from t2t_jax.translator import Translator
    return Translator
  if name == "Parser":
    from t2t_jax.parser import Parser
    return Parser
  raise AttributeError(f"module 't2t_jax' has no attribute {name!r}")
