"""The one exception type for bad user input (flags, configs, data files, workdirs); the
checks of the paths a user gives are `t2t_jax.storage`'s, which knows local from bucket.

`main` prints a UserError as a single `error: ...` line and exits with code 2, without a
traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
  pass
