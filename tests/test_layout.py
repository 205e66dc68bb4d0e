"""The package's floors: imports run down, from the tools to the command line to the library
to small utilities, never up. Read from the source, so a new import that points up (or a
new module without a floor) fails here, not in a reader's head."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "t2t_jax"

# Higher floors may import lower ones. Within `tools` and `configs` siblings may import each
# other (a benchmark reuses another's timing; Table 3's rows change the paper's base model).
FLOORS = {
    # small utilities
    "errors": 0, "special_tokens": 0, "bleu": 0, "mbr": 0, "cost": 0, "storage": 1, "jsonl": 2,
    "config": 1, "backend": 1, "parallel": 1, "data_sources": 2, "vocab": 1, "packing": 1,
    "parsing": 1, "retention": 2,
    # the model (its products in cpu_kernels), the optimiser; the named experiments
    "cpu_kernels": 2, "optim": 2, "hostmem": 2, "side_by_side": 2, "registry": 2, "configs": 2,
    "model": 3, "ensemble": 3, "tasks": 3, "workdirs": 3,
    "checkpoints": 4, "attention_plot": 4, "loss": 4, "input_pipeline": 4, "decode": 4,
    # training and decoding
    "bookkeeping": 5, "translator": 5, "export": 5, "parser": 6,
    "train": 6, "inference": 6, "__init__": 7,
    # the command line, then the tools above it all
    "main": 7,
    "tools": 8,
}


def _floor(module: str) -> int:
  """t2t_jax.train -> FLOORS["train"]; t2t_jax.tools.bench -> FLOORS["tools"]."""
  return FLOORS[(module.split(".")[1:] or ["__init__"])[0]]


def _imports(path: Path) -> set[str]:
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("t2t_jax"):
      if node.module in ("t2t_jax", "t2t_jax.tools", "t2t_jax.configs"):
        found |= {f"{node.module}.{a.name}" for a in node.names}
      else:
        found.add(node.module)
    elif isinstance(node, ast.Import):
      found |= {a.name for a in node.names if a.name.startswith("t2t_jax")}
  return found


def _modules():
  for path in sorted(PACKAGE.rglob("*.py")):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    yield ".".join(p for p in parts if p != "__init__"), path


def test_every_module_has_a_floor():
  missing = [m for m, _ in _modules() if (m.split(".")[1:] or ["__init__"])[0] not in FLOORS]
  assert not missing, f"give these modules a floor in FLOORS: {missing}"


def test_imports_run_down_the_floors_never_up():
  upward = []
  for module, path in _modules():
    package = module.split(".")[1] if module.count(".") >= 1 else None
    for dep in _imports(path):
      same_room = package in ("tools", "configs", "parsing") and \
          dep.startswith(f"t2t_jax.{package}.")
      if dep != "t2t_jax" and not same_room and _floor(dep) >= _floor(module):
        upward.append(f"{module} (floor {_floor(module)}) imports {dep} (floor {_floor(dep)})")
  assert not upward, "\n".join(upward)


def test_no_parsing_module_is_a_long_read():
  """The parsing package holds one concern a module (trees, target forms, constraints,
  scoring, ...), each readable in one sitting."""
  long = {p.name: n for p in (PACKAGE / "parsing").glob("*.py")
          if (n := len(p.read_text().splitlines())) > 400}
  assert not long, long


def test_the_library_never_imports_the_tools():
  for module, path in _modules():
    if not module.startswith("t2t_jax.tools"):
      assert not any(d.startswith("t2t_jax.tools") for d in _imports(path)), module


def test_the_model_file_opens_with_the_papers_model():
  """model.py reads like the paper: its first definitions are the paper's positions,
  attention and layers, not dtype plumbing; XLA:CPU's kernels live in cpu_kernels.py."""
  text = (PACKAGE / "model.py").read_text()
  defs = [n.name for n in ast.parse(text).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
  assert defs[:2] == ["sinusoidal_positions", "Positions"], defs[:5]
  assert defs.index("Transformer") < defs.index("Dropout") < defs.index("init_params")
  assert "custom_vjp" not in text and "cpu_tuned" not in text


def test_the_checkpoint_module_is_in_parts_of_one_job_each():
  """checkpoints.py: saving and committing (`Checkpointer`), resuming with fallback
  (`Resumer`), the policy apart (retention.py): no class over 200 lines, no function over 60."""
  tree = ast.parse((PACKAGE / "checkpoints.py").read_text())
  sizes = {(type(n).__name__, n.name): n.end_lineno - n.lineno + 1 for n in ast.walk(tree)
           if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
  too_big = {k: v for k, v in sizes.items()
             if v > (200 if k[0] == "ClassDef" else 60)}
  assert not too_big, too_big


def test_local_and_bucket_paths_differ_in_the_storage_seam_alone():
  """Whether a path is in a bucket is asked in storage.py, not in each caller: a caller says
  what it wants (a file that appears whole, a folder replaced, a local mirror), storage.py
  how."""
  allowed = {"t2t_jax.storage"}
  found = []
  for module, path in _modules():
    if module in allowed:
      continue
    for number, line in enumerate(path.read_text().splitlines(), 1):
      code = line.split("#", 1)[0]
      if "is_remote" in code or '"://"' in code or "'://'" in code:
        found.append(f"{module}:{number}: {line.strip()}")
  assert not found, "\n".join(found)
