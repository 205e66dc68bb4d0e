"""Files of a workdir that may live on a local disk or in a bucket (`gs://BUCKET/PATH`).

A Cloud TPU VM keeps nothing, and its hosts share no filesystem: its runs live in buckets.
An object store is not a disk, and the differences decide what may be written how:
- no append: `open(path, "a")` on GCS overwrites, so `append_lines` rewrites the object whole;
- no atomic rename: a rename is a copy and a delete. `write_atomic` writes an object in one
  request instead (an object appears whole or not at all), and checkpoints rely on orbax's
  commit marker, never on a rename;
- no directories: a folder exists while an object lies under it.
Local paths take the plain `os` calls, unchanged; remote ones go through etils.epath (gcsfs,
or TensorFlow's gfile where TensorFlow is installed and EPATH_USE_TF is not false).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from typing import Any, Iterator, Sequence

from t2t_jax.errors import UserError

# The schemes orbax can write checkpoints to (it builds tensorstore specs for gs:// only).
SUPPORTED = ("gs://",)


def is_remote(path: str) -> bool:
  return "://" in str(path)


def check_supported(path: str, what: str) -> None:
  """A remote path of a scheme that cannot hold a run is a one-line error naming what can."""
  if is_remote(path) and not str(path).startswith(SUPPORTED):
    scheme = str(path).split("://", 1)[0]
    raise UserError(f"{what}={path}: {scheme}:// is not supported (orbax writes checkpoints to "
                    f"gs:// only); use a gs:// bucket, or a local or mounted folder")


def _epath(path: str) -> Any:
  _check_client(path)
  from etils import epath
  return epath.Path(path)


def _check_client(path: str) -> None:
  """gs:// goes through gcsfs (the `gcs` extra), unless TensorFlow's own client is asked for
  (EPATH_USE_TF=true): without it, a one-line error instead of an import traceback."""
  import importlib.util
  if (str(path).startswith("gs://") and os.environ.get("EPATH_USE_TF", "").lower() != "true"
      and importlib.util.find_spec("gcsfs") is None):
    raise UserError(f"{path}: gs:// paths need gcsfs: pip install -e \".[gcs]\"")


def normalize(path: str) -> str:
  """An absolute local path (user and relative parts resolved), or the remote one as given,
  without a trailing slash."""
  if is_remote(path):
    return str(path).rstrip("/")
  return os.path.abspath(os.path.expanduser(path))


def join(path: str, *parts: str) -> str:
  return "/".join([str(path).rstrip("/"), *parts]) if is_remote(path) else os.path.join(
      path, *parts)


def dirname(path: str) -> str:
  return str(path).rstrip("/").rsplit("/", 1)[0] if is_remote(path) else os.path.dirname(path)


def basename(path: str) -> str:
  return str(path).rstrip("/").rsplit("/", 1)[-1] if is_remote(path) else os.path.basename(path)


def exists(path: str) -> bool:
  return _epath(path).exists() if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
  return _epath(path).is_dir() if is_remote(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
  if is_remote(path):
    p = _epath(path)
    return p.exists() and not p.is_dir()
  return os.path.isfile(path)


def mtime_ns(path: str) -> int:
  """Nanoseconds since the epoch of the last write."""
  return int(_epath(path).stat().mtime * 1e9) if is_remote(path) else os.stat(path).st_mtime_ns


def free_bytes(path: str) -> int | None:
  """Free space on the disk holding `path`; None in a bucket, which has no such limit."""
  return None if is_remote(path) else shutil.disk_usage(path).free


def mtime(path: str) -> float:
  """Seconds since the epoch of the last write."""
  return float(_epath(path).stat().mtime) if is_remote(path) else os.path.getmtime(path)


def stamp(path: str) -> str:
  """"size|mtime": what changes when a file is rewritten."""
  if is_remote(path):
    st = _epath(path).stat()
    return f"{st.length}|{st.mtime}"
  st = os.stat(path)
  return f"{st.st_size}|{st.st_mtime_ns}"


def makedirs(path: str) -> None:
  if is_remote(path):
    _epath(path).mkdir(parents=True, exist_ok=True)
  else:
    os.makedirs(path, exist_ok=True)


def listdir(path: str) -> list[str]:
  if is_remote(path):
    return [p.name for p in _epath(path).iterdir()] if _epath(path).exists() else []
  return os.listdir(path)


def is_whole(folder: str, marker: str) -> bool:
  """A folder written by a writer that renames it into place when whole (locally), or that
  writes it in place and `marker` last (in a bucket, which has no rename): whether it is
  whole, not a write that was killed half-way."""
  if is_remote(folder):
    return exists(join(folder, marker))
  return os.path.isdir(folder)


def open_file(path: str, mode: str = "r") -> Any:
  """`open`, refusing to append to an object (a bucket would overwrite it: `append_lines`)."""
  if is_remote(path):
    if "a" in mode:
      raise ValueError(f"cannot append to {path}: an object store overwrites; use "
                       f"storage.append_lines")
    return _epath(path).open(mode)
  return open(path, mode)


def read_text(path: str) -> str:
  with open_file(path) as f:
    return f.read()


def read_bytes(path: str) -> bytes:
  with open_file(path, "rb") as f:
    return f.read()


def write_atomic(path: str, data: str | bytes) -> None:
  """`path` holds `data` whole or keeps what it held: locally a file of this process's own
  name (two writers of one path must not write into each other's file) renamed into place;
  in a bucket one object write, which is atomic."""
  if is_remote(path):
    with open_file(path, "wb" if isinstance(data, bytes) else "w") as f:
      f.write(data)
    return
  with writing(path, binary=isinstance(data, bytes)) as f:
    f.write(data)


def append_lines(path: str, lines: list[str]) -> None:
  """Appends whole lines: locally with "a"; in a bucket by rewriting the object with them
  added (one write, so a reader sees the old lines or all of them)."""
  if not lines:
    return
  if is_remote(path):
    old = read_text(path) if exists(path) else ""
    write_atomic(path, old + "".join(lines))
    return
  with open(path, "a") as f:
    f.writelines(lines)


class AppendLog:
  """A file that grows by whole lines. Locally each `append` is appended at once. An object
  in a bucket can only be rewritten whole, so there the lines are held until `flush`, which
  writes the object once with them (a rewrite per line would upload the growing file every
  time); a kill loses what was not flushed. `text`: what the file holds now."""

  def __init__(self, path: str, text: str = ""):
    self.path, self._remote = path, is_remote(path)
    self._text, self._pending = text, []
    self.bytes_written = 0

  def append(self, lines: list[str]) -> None:
    if not self._remote:
      append_lines(self.path, lines)
      self.bytes_written += sum(len(l.encode()) for l in lines)
    else:
      self._pending.extend(lines)

  def flush(self) -> None:
    if self._remote and self._pending:
      self._text += "".join(self._pending)
      self._pending = []
      write_atomic(self.path, self._text)
      self.bytes_written += len(self._text.encode())


def remove(path: str) -> None:
  if is_remote(path):
    _epath(path).unlink()
  else:
    os.remove(path)


def rmtree(path: str) -> None:
  """Removes a folder and what is under it; nothing if it is not there."""
  if is_remote(path):
    p = _epath(path)
    if p.exists():
      p.rmtree()
  else:
    shutil.rmtree(path, ignore_errors=True)


def copy(source: str, target: str) -> None:
  if is_remote(source) or is_remote(target):
    _epath(source).copy(_epath(target), overwrite=True)
  else:
    shutil.copyfile(source, target)


def move(source: str, target: str) -> None:
  """A rename locally (atomic); in a bucket a copy of every object, then the deletion of the
  originals: not atomic, so callers mark completeness some other way."""
  if not is_remote(source):
    os.replace(source, target)
    return
  src = _epath(source)
  if src.is_dir():
    for item in _files(src):
      rel = str(item)[len(str(src)):].lstrip("/")
      dst = _epath(join(target, rel))
      dst.parent.mkdir(parents=True, exist_ok=True)
      item.copy(dst, overwrite=True)
    src.rmtree()
  else:
    src.copy(_epath(target), overwrite=True)
    src.unlink()


def _files(folder: Any) -> Iterator[Any]:
  """Every object under a remote folder (epath's recursive glob refuses gs://)."""
  for item in folder.iterdir():
    if item.is_dir():
      yield from _files(item)
    else:
      yield item


def walk_bytes(path: str) -> int:
  """Bytes of every file under a folder."""
  if is_remote(path):
    return sum(p.stat().length for p in _files(_epath(path)))
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def local_copy(path: str, cache_dir: str) -> str:
  """A local file with `path`'s contents (the path itself when local): for readers that take
  only a local filename (SentencePiece)."""
  if not is_remote(path):
    return path
  os.makedirs(cache_dir, exist_ok=True)
  import hashlib
  target = os.path.join(cache_dir, hashlib.sha256(path.encode()).hexdigest()[:16] + "_" +
                        basename(path))
  data = read_bytes(path)
  with open(target + ".tmp", "wb") as f:
    f.write(data)
  os.replace(target + ".tmp", target)
  return target



def require_local(paths: Sequence[str], message: str, error: type = UserError) -> None:
  """`error(message)` when any of `paths` is in a bucket: for readers of local files only."""
  if any(is_remote(p) for p in paths):
    raise error(message)


def local_mirror(path: str, cache_root: str) -> str:
  """The local folder that stands for `path`: the folder itself, or, for one in a bucket,
  this machine's mirror of it under `cache_root` (one per remote path)."""
  if not is_remote(path):
    return path
  import hashlib
  return os.path.join(cache_root, "mirrors", hashlib.sha256(path.encode()).hexdigest()[:12])


def mirrored(root: str, relative: str) -> str | None:
  """`root/relative` when `root` is a bucket folder that local mirrors copy from, else None
  (a local folder is its own copy)."""
  return join(root, relative) if is_remote(root) else None


def local_log(folder: str, name: str) -> str:
  """Where a log meant for FOLDER/`name` is streamed as it grows: the file itself, or, for
  a folder in a bucket (which cannot be appended to), a local file to be added there when
  the run ends (`append_lines`)."""
  if not is_remote(folder):
    return os.path.join(folder, name)
  import hashlib
  import tempfile
  local = os.path.join(tempfile.gettempdir(), "t2t_jax_logs")
  os.makedirs(local, exist_ok=True)
  return os.path.join(local, hashlib.sha256(folder.encode()).hexdigest()[:16] + ".log")


def temporary_name(path: str) -> str:
  """A sibling of `path` no other process (on this host or another sharing the disk) uses
  (`data_sources.remove_dead_temporaries` reads its host and process back)."""
  import socket
  import uuid
  return f"{path}.tmp-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def writing(path: str, binary: bool = False) -> Iterator[Any]:
  """A file object whose contents appear at `path` whole when the block ends, or not at
  all if it raises: locally a sibling renamed into place; in a bucket a buffer written as
  one object."""
  if is_remote(path):
    buffer = io.BytesIO() if binary else io.StringIO()
    yield buffer
    write_atomic(path, buffer.getvalue())
    return
  tmp = temporary_name(path)
  try:
    with open(tmp, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
      yield f
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def copy_atomic(source: str, target: str) -> None:
  """`target` becomes a copy of `source` whole, or keeps what it held."""
  if is_remote(source) or is_remote(target):
    copy(source, target)  # one object write
    return
  tmp = temporary_name(target)
  try:
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def discard_tree(path: str, aside: str, name: str) -> None:
  """Removes a folder so that a kill half-way leaves it whole or gone, never half of it:
  locally it is first moved to `aside`/`name` (a folder on the same disk, removed after).
  A bucket has no atomic move: its objects are deleted in place."""
  if is_remote(path):
    rmtree(path)
    return
  os.makedirs(aside, exist_ok=True)
  target, n = os.path.join(aside, name), 0
  while os.path.exists(target):
    n += 1
    target = os.path.join(aside, f"{name}.{n}")
  os.replace(path, target)
  shutil.rmtree(aside, ignore_errors=True)


def settle_replacement(out: str) -> None:
  """Finishes a local `replacing_folder` that a kill stopped between its two renames (OUT
  moved to OUT.old, the new folder not yet moved in): the new folder (OUT.tmp, whole by then)
  goes in place, or where a unique name hid it, the old one back."""
  old = out + ".old"
  if is_remote(out) or os.path.lexists(out) or not os.path.isdir(old):
    return
  os.replace(out + ".tmp" if os.path.isdir(out + ".tmp") else old, out)
  shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def replacing_folder(out: str, build_locally: bool = False, last: Sequence[str] = (),
                     unique: bool = False) -> Iterator[str]:
  """A folder to write a new `out` into; when the block ends it is `out`, the old one gone.
  Locally it is a sibling renamed into place (a kill leaves the old or the new). A bucket
  has no rename: the folder is `out` itself, emptied first, and the caller marks it whole
  by what it writes last; or, with `build_locally`, a local folder whose files are uploaded
  when the block ends, the names in `last` after the others. The local sibling is OUT.tmp
  (a killed write's is removed by the next), or with `unique` a name no other process uses
  (beside a user's own folders, none of which is ever removed)."""
  if is_remote(out) and not build_locally:
    rmtree(out)
    yield out
    return
  import tempfile
  if is_remote(out):
    tmp = os.path.join(tempfile.mkdtemp(), basename(out))
  else:
    settle_replacement(out)
    tmp = temporary_name(out) if unique else out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    yield tmp
    if is_remote(out):
      rmtree(out)
      files = sorted((os.path.relpath(os.path.join(d, f), tmp) for d, _, fs in os.walk(tmp)
                      for f in fs), key=lambda rel: (rel in last, last.index(rel)
                                                     if rel in last else 0, rel))
      for rel in files:
        copy(os.path.join(tmp, rel), join(out, *rel.split(os.sep)))
    else:
      # Two renames, not a removal and a rename: a kill between them leaves OUT.old and the
      # whole new folder, which `settle_replacement` puts in place, never no folder at all.
      old = out + ".old"
      shutil.rmtree(old, ignore_errors=True)
      if os.path.lexists(out):
        os.replace(out, old)
      os.replace(tmp, out)
      shutil.rmtree(old, ignore_errors=True)
  finally:
    shutil.rmtree(tmp if not is_remote(out) else os.path.dirname(tmp), ignore_errors=True)


@contextlib.contextmanager
def local_folder(folder: str) -> Iterator[str]:
  """A local folder to write files for `folder` into: the folder itself, or, for one in a
  bucket, a temporary one whose files are uploaded into it when the block ends."""
  if not is_remote(folder):
    yield folder
    return
  import tempfile
  local = tempfile.mkdtemp()
  try:
    yield local
    for name in sorted(os.listdir(local)):
      copy(os.path.join(local, name), join(folder, name))
  finally:
    shutil.rmtree(local, ignore_errors=True)


# Checks of the paths a command names, made before any work: a wrong one is one line.

def check_input_file(path: str, what: str) -> str:
  """`path` is a file this process can read; else a UserError naming `what` (the flag)."""
  return _check_readable(path, what, folder=False)


def check_input_dir(path: str, what: str) -> str:
  """`path` is a directory this process can list; else a UserError naming `what`."""
  return _check_readable(path, what, folder=True)


def _check_readable(path: str, what: str, folder: bool) -> str:
  kind = "folder" if folder else "object"
  if is_remote(path):
    check_supported(path, what)
    if not (isdir(path) if folder else isfile(path)):
      raise UserError(f"{what}: no such {kind}: {path}")
    return path
  if not os.path.exists(path):
    raise UserError(f"{what}: no such {'directory' if folder else 'file'}: {path}")
  if folder and not os.path.isdir(path):
    raise UserError(f"{what}: {path} is a file, not a directory")
  if not folder and os.path.isdir(path):
    raise UserError(f"{what}: {path} is a directory; give a file")
  try:
    if folder:
      os.listdir(path)
    else:
      with open(path, "rb") as f:
        f.read(1)
  except OSError as e:
    raise UserError(f"{what}: cannot read {path} ({e.strerror or e})") from None
  return path


def check_output_file(path: str, what: str) -> str:
  """`path` can be written as a file: not a directory, and its folder exists (any folder of
  a bucket exists)."""
  if is_remote(path):
    check_supported(path, what)
    return path
  if os.path.isdir(path):
    raise UserError(f"{what}: {path} is a directory; give a file name")
  folder = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(folder):
    raise UserError(f"{what}: no such folder: {folder}")
  if not os.access(folder, os.W_OK):
    raise UserError(f"{what}: cannot write in {folder} (permission denied)")
  return path
