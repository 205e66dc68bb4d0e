"""The one exception type for bad user input (flags, configs, data files, workdirs).

`main` prints it as a single `error: ...` line and exits with code 2, without a
traceback; anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
  pass
