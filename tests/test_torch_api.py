"""Private torch names are used in one module only: `autograd_magic/recorder/torch_api.py`.

A private torch name is, found in the package's source (AST, every module but torch_api):
- a dotted name through torch with a `_`-component (`torch._C.X`, `nn_module._global_...`, through
  any alias a module gives torch or one of its submodules), or an import of one
  (`from torch.utils._device import ...`, `from torch.overrides import _pop_mode`);
- an attribute `obj._name` (on anything but `self`/`cls`) or a string `"_name"` (for getattr)
  where `_name` is private and defined by torch on what the recorder reads: tensors, storages,
  autograd nodes and saved tensors, custom Function nodes, modules, `torch._C` and
  `torch._C._autograd`; and the generated saved attributes (`_saved_x`, `_raw_saved_x`);
- an attribute that is public but missing on some releases in the range (`VERSION_DEPENDENT`).
Dunder names are Python's, not torch's. Each such name goes through torch_api, with its fallback
for the releases that lack it (README, "Supported versions").
"""

from __future__ import annotations

import ast
from pathlib import Path

import torch

PACKAGE = Path(__file__).resolve().parent.parent / "autograd_magic"
HOME = PACKAGE / "recorder" / "torch_api.py"
SAVED_PREFIXES = ("_saved_", "_raw_saved_")
# Public attributes that only some releases in the supported range have.
VERSION_DEPENDENT = {"unpack_hook"}
# Uses not routed yet, in modules being reworked: each entry must still be found, so the list
# only shrinks.
PENDING: dict[str, set[str]] = {}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def torch_private_names() -> set[str]:
    """Private names torch defines on the objects the recorder reads, in this release."""
    x = torch.ones(2, requires_grad=True)
    owners: list[object] = [
        torch.Tensor,
        torch._C.TensorBase,
        torch.UntypedStorage,
        torch.nn.Module,
        torch._C,
        torch._C._autograd,
        torch._C._autograd.SavedTensor,
        torch.autograd.function.BackwardCFunction,
        torch.autograd.function.FunctionCtx,
        torch.nn.modules.module,
        *type(x.exp().grad_fn).__mro__,
    ]
    return {name for owner in owners for name in dir(owner) if _private(name)}


def _is_torch_module(name: str) -> bool:
    return name == "torch" or name.startswith("torch.")


def uses_in(path: Path, private: set[str]) -> list[str]:
    """Each private torch name `path` uses, as 'line: name'."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    roots: set[str] = set()  # local names bound to torch or something imported from it
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_torch_module(alias.name):
                    roots.add(alias.asname or alias.name.split(".")[0])
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and _is_torch_module(node.module or ""):
            module = node.module or ""
            for alias in node.names:
                roots.add(alias.asname or alias.name)
                if any(_private(part) for part in [*module.split("."), alias.name]):
                    found.append(f"{node.lineno}: from {module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            chain = [node.attr]
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in roots:
                found.append(f"{node.lineno}: {base.id}.{'.'.join(reversed(chain))}")
            elif not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")) and (
                node.attr in private or node.attr.startswith(SAVED_PREFIXES)
            ):
                found.append(f"{node.lineno}: ._{node.attr.lstrip('_')}")
        elif isinstance(node, ast.Attribute) and node.attr in VERSION_DEPENDENT:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{node.lineno}: ._{node.attr.lstrip('_')}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if text in private or text.startswith(SAVED_PREFIXES) or text.startswith("torch._"):
                found.append(f"{node.lineno}: {text!r}")
    return sorted(set(found), key=lambda entry: int(entry.split(":")[0]))


def test_private_torch_names_are_used_only_in_torch_api():
    """GIVEN the package's modules THEN none but torch_api names a private torch API."""
    private = torch_private_names()
    wrong, pending = {}, {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == HOME:
            continue
        name = str(path.relative_to(PACKAGE.parent))
        uses = uses_in(path, private)
        allowed = PENDING.get(name, set())
        pending[name] = {use.partition(": ")[2] for use in uses} & allowed
        uses = [use for use in uses if use.partition(": ")[2] not in allowed]
        if uses:
            wrong[name] = uses
    assert wrong == {}
    assert {name: names for name, names in pending.items() if names} == PENDING


def test_the_scan_finds_each_form_of_private_use(tmp_path):
    """GIVEN a module using private torch names in each form THEN the scan reports each."""
    source = tmp_path / "m.py"
    source.write_text(
        "import torch\n"
        "import torch.nn.modules.module as nn_module\n"
        "from torch.overrides import _pop_mode\n"
        "from torch.utils._device import DeviceContext\n"
        "a = torch._C.DisableTorchFunction\n"
        "b = nn_module._global_forward_hooks\n"
        "def f(t, node, saved):\n"
        "    return t._version, node._sequence_nr(), node._saved_self\n"
        "c = getattr(torch.Tensor, '_use_count', None)\n"
        "d = saved.unpack_hook\n"
        "class K:\n"
        "    def g(self):\n"
        "        return self._version, self._private_of_ours, torch.Tensor.__add__\n",
        encoding="utf-8",
    )
    found = uses_in(source, torch_private_names())
    lines = sorted({int(entry.split(":")[0]) for entry in found})
    assert lines == [3, 4, 5, 6, 8, 9, 10]
