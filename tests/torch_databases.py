"""Run PyTorch's own test databases (modules, ops, optimizers) on one side, tracked or not.

Not a pytest file: `tests/test_torch_databases.py` runs it as a subprocess per side, since
PyTorch's warn-once state lives in the process. Usage:

    python tests/torch_databases.py --db module --side tracked --out tracked.json

Each case is seeded from a stable hash of its id and runs, on the tracked side, inside its own
`with autograd_magic.track():` block. What a user could see of it (outputs, gradients, the
exception and every warning with the place it is attributed to) is written as a JSON digest:
tensors become sha256 of their bytes plus dtype, shape, strides and autograd facts. Two sides
agree when their digests are equal; `compare` lists where they do not.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import os
import random
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

Case = tuple[str, Callable[[dict[str, Any]], None] | str]
"""A case id and its body, which fills a results dict as it goes (so a raise keeps the stages
already done), or the reason the case is skipped. Inputs are built before the body; the body
runs inside the block."""

_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def stable_seed(case_id: str) -> int:
    """The seed of a case: the same in every process (unlike `hash`)."""
    return int.from_bytes(hashlib.sha256(case_id.encode()).digest()[:4], "little")


def seed_all(case_id: str) -> None:
    """Seed torch, random and NumPy from the case id."""
    seed = stable_seed(case_id)
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def normalize(text: str) -> str:
    """Memory addresses differ between processes; everything else of a message must not."""
    return _ADDRESS.sub("0x?", text)


# ----- digests ---------------------------------------------------------------------------------


def _sha(t: torch.Tensor) -> str:
    flat = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()[:20]


def _contents(t: torch.Tensor) -> Any:
    if t.is_nested:
        return ["nested", [digest(u) for u in t.unbind()]]
    if t.is_quantized:
        return ["quantized", str(t.qscheme()), _sha(t.int_repr())]
    if t.layout == torch.sparse_coo:
        return ["coo", t.is_coalesced(), _sha(t._indices()), _sha(t._values())]
    if t.layout != torch.strided:
        return ["dense of", _sha(t.to_dense())]
    if t.device.type == "meta":
        return ["meta"]
    return [list(t.stride()), t.storage_offset(), _sha(t)]


def tensor_digest(t: torch.Tensor) -> dict[str, Any]:
    """What a user can read of a tensor: its class, dtype, shape, layout, autograd facts and
    its exact bits (strides included); what cannot be read is named with the reason."""
    out: dict[str, Any] = {"class": type(t).__name__}
    try:
        out["dtype"], out["shape"], out["layout"] = str(t.dtype), list(t.shape), str(t.layout)
        out["requires_grad"] = t.requires_grad
        out["grad_fn"] = type(t.grad_fn).__name__ if t.grad_fn is not None else None
        out["bits"] = _contents(t)
    except Exception as exc:
        out["unreadable"] = f"{type(exc).__name__}: {normalize(str(exc))}"
    return out


def digest(value: Any, depth: int = 0) -> Any:
    """A JSON-able, comparable stand-in for a value: tensors by `tensor_digest`, containers
    element by element, anything else by its repr (addresses removed)."""
    if depth > 20:
        return "<too deep>"
    if isinstance(value, torch.Tensor):
        return tensor_digest(value)
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            return ["ndarray of objects", normalize(repr(value))]
        data = np.ascontiguousarray(value).tobytes()
        return [
            "ndarray",
            str(value.dtype),
            list(value.shape),
            hashlib.sha256(data).hexdigest()[:20],
        ]
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [digest(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {str(k): digest(v, depth + 1) for k, v in value.items()}
    if isinstance(value, str):
        return normalize(value)
    try:
        return normalize(repr(value))
    except Exception as exc:
        return f"<repr raised {type(exc).__name__}>"


def exception_digest(exc: BaseException) -> list[str]:
    """Its class by qualified name and its message."""
    kind = type(exc)
    return [f"{kind.__module__}.{kind.__qualname__}", normalize(str(exc))]


def warning_digest(w: warnings.WarningMessage) -> list[Any]:
    """Category, message and the file and line the warning is attributed to."""
    return [w.category.__name__, normalize(str(w.message)), w.filename, w.lineno]


# ----- running ---------------------------------------------------------------------------------


def run_case(case_id: str, body: Callable[[dict[str, Any]], None], tracked: bool) -> dict:
    """Run one case, seeded from its id, inside its own block when `tracked`; its digest."""
    seed_all(case_id)
    results: dict[str, Any] = {}
    raised = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if tracked:
                import autograd_magic

                with autograd_magic.track():
                    body(results)
            else:
                body(results)
        except Exception as exc:
            raised = exception_digest(exc)
    # Most telling first: a difference in what was raised explains those in the results.
    case = {"raised": raised, "warnings": [warning_digest(w) for w in caught]}
    case["results"] = digest(results)
    del results
    return case


def run(
    db: str, tracked: bool, only: str | None = None, limit: int | None = None, threads: int = 1
) -> dict[str, Any]:
    """Every case of one database, in a fixed order: `{"cases": {id: digest}, "skipped":
    {id: reason}}`; a case id seen twice is an error."""
    from instrumentation import installed
    from torch_database_cases import CASES

    torch.set_num_threads(threads)
    # Fills torch.empty & co. with NaN, so uninitialized memory is not a difference.
    torch.use_deterministic_algorithms(True, warn_only=True)
    warnings.simplefilter("ignore")  # outside cases: input building talks too much
    before = installed()
    pattern = re.compile(only) if only else None
    cases: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for case_id, body in CASES[db](limit):
        if pattern is not None and not pattern.search(case_id):
            continue
        if case_id in cases or case_id in skipped:
            raise RuntimeError(f"duplicate case id {case_id!r}")
        if isinstance(body, str):
            skipped[case_id] = body
            continue
        cases[case_id] = run_case(case_id, body, tracked)
        left = installed()
        if left != before:
            cases[case_id]["left installed"] = True
            import autograd_magic

            autograd_magic.uninstall()
    return {"cases": cases, "skipped": skipped}


# ----- comparing -------------------------------------------------------------------------------


def differences(a: Any, b: Any, path: str = "") -> Iterator[str]:
    """Where two digests differ: one line per differing leaf, `path: a != b`."""
    if type(a) is not type(b):
        yield f"{path or '.'}: {_short(a)} != {_short(b)}"
    elif isinstance(a, dict):
        for key in list(a) + [k for k in b if k not in a]:
            yield from differences(
                a.get(key, "<missing>"), b.get(key, "<missing>"), f"{path}.{key}"
            )
    elif isinstance(a, list):
        if len(a) != len(b):
            yield f"{path or '.'}: {len(a)} items != {len(b)} items: {_short(a)} != {_short(b)}"
        else:
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                yield from differences(x, y, f"{path}[{i}]")
    elif a != b:
        yield f"{path or '.'}: {_short(a)} != {_short(b)}"


def _short(value: Any, width: int = 300) -> str:
    text = json.dumps(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def compare(left: dict[str, Any], right: dict[str, Any]) -> dict[str, list[str]]:
    """Case id -> how it differs, for every case whose digests are not equal (or that only one
    side ran)."""
    out: dict[str, list[str]] = {}
    for case_id in list(left) + [c for c in right if c not in left]:
        if case_id not in left or case_id not in right:
            out[case_id] = ["ran on one side only"]
        elif left[case_id] != right[case_id]:
            out[case_id] = list(differences(left[case_id], right[case_id]))
    return out


def report(diffs: dict[str, list[str]], total: int, excluded: int, detail: int = 40) -> str:
    """A readable listing: how many cases differ, how many per group (db/name/mode), then how
    the first `detail` of them differ (three lines each at most)."""
    groups: dict[str, int] = {}
    for case_id in diffs:
        group = "/".join(case_id.split("/")[:3])
        groups[group] = groups.get(group, 0) + 1
    lines = [f"{len(diffs)} of {total} cases differ ({excluded} excluded as nondeterministic)"]
    lines += [f"  {n:5d}  {group}" for group, n in groups.items()]
    for case_id in list(diffs)[:detail]:
        lines.append(case_id)
        lines += [f"    {d}" for d in diffs[case_id][:3]]
        if len(diffs[case_id]) > 3:
            lines.append(f"    ... {len(diffs[case_id]) - 3} more")
    if len(diffs) > detail:
        lines.append(f"... {len(diffs) - detail} more cases")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=["module", "op", "optim"], required=True)
    parser.add_argument("--side", choices=["tracked", "untracked"], required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", help="regex: run only the case ids it matches")
    parser.add_argument("--limit", type=int, help="sample and error inputs per op at most")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args(argv)
    # The package beside these tests, not an installed copy; then the tests' helpers.
    sys.path[:0] = [str(Path(__file__).parents[1]), str(Path(__file__).parent)]
    import autograd_magic

    start = time.perf_counter()
    ran = run(args.db, args.side == "tracked", args.only, args.limit, args.threads)
    meta = {"db": args.db, "side": args.side, "torch": torch.__version__}
    meta["autograd_magic"] = autograd_magic.__file__
    meta["seconds"] = round(time.perf_counter() - start, 1)
    args.out.write_text(json.dumps({"meta": meta, **ran}))


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") != "0":
        # Some sample inputs iterate over sets of strings: fix their order in every process.
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    faulthandler.enable()
    main()
