"""The one exception type for bad user input (flags, configs, data files, workdirs), and the
checks of the paths a user gives, made before any work so that a wrong path is one line.

`main` prints a UserError as a single `error: ...` line and exits with code 2, without a
traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import os


class UserError(Exception):
  pass


def check_input_file(path: str, what: str) -> str:
  """`path` is a file this process can read; else a UserError naming `what` (the flag)."""
  if "://" in path:  # in a bucket: main checks it (t2t_jax.storage)
    return path
  if not os.path.exists(path):
    raise UserError(f"{what}: no such file: {path}")
  if os.path.isdir(path):
    raise UserError(f"{what}: {path} is a directory; give a file")
  try:
    with open(path, "rb") as f:
      f.read(1)
  except OSError as e:
    raise UserError(f"{what}: cannot read {path} ({e.strerror or e})") from None
  return path


def check_output_file(path: str, what: str) -> str:
  """`path` can be written as a file: not a directory, and its folder exists (any folder of
  a bucket exists)."""
  if "://" in path:  # in a bucket: main checks it (t2t_jax.storage)
    return path
  if os.path.isdir(path):
    raise UserError(f"{what}: {path} is a directory; give a file name")
  folder = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(folder):
    raise UserError(f"{what}: no such folder: {folder}")
  if not os.access(folder, os.W_OK):
    raise UserError(f"{what}: cannot write in {folder} (permission denied)")
  return path


def check_input_dir(path: str, what: str) -> str:
  """`path` is a directory this process can list; else a UserError naming `what`."""
  if "://" in path:  # in a bucket: main checks it (t2t_jax.storage)
    return path
  if not os.path.exists(path):
    raise UserError(f"{what}: no such directory: {path}")
  if not os.path.isdir(path):
    raise UserError(f"{what}: {path} is a file, not a directory")
  try:
    os.listdir(path)
  except OSError as e:
    raise UserError(f"{what}: cannot read {path} ({e.strerror or e})") from None
  return path
