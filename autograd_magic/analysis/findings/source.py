"""What some analyses read in the traced code itself, where no autograd event says it: the line
that stores into a container, a name read on its own line, an optimizer's `step(` call.

Only decisions are made here; quoting source in a message is the wording's job.
"""

from __future__ import annotations

import linecache
import re
from collections import Counter

from autograd_magic.model.records import Site
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import cell_line


def source_of(site: Site) -> str:
    """The source text of a site's line, or '' when the file is not available."""
    return linecache.getline(site.file, site.line).strip()


def traced_file(trace: Trace) -> tuple[str, int, int] | None:
    """The traced code's file and the first and last of its lines that the trace saw."""
    sites = [n.born_site for n in trace.nodes] + [c.site for c in trace.backward_calls]
    sites += [b.site for b in trace.version_bumps]
    top = [s for s in sites if s.outer_line is None and s.line > 0]
    if not top:
        return None
    file = Counter(s.file for s in top).most_common(1)[0][0]
    lines = [s.line for s in top if s.file == file]
    return file, min(lines), max(lines)


def own_line(site: Site, file: str | None) -> int:
    """The line a finding points at for `site`: the line inside the user's function when that
    function is written in the traced code's own file `file` (a forward defined in the cell or
    the script), else the traced code's line (the call; the function is elsewhere)."""
    if site.outer_line not in (None, site.line) and site.file == file:
        return site.line
    return cell_line(site)


def traced_path(trace: Trace) -> str | None:
    """The traced code's file (the cell's or the script's), None when nothing was seen."""
    if trace.home_file is not None:
        return trace.home_file
    found = traced_file(trace)
    return None if found is None else found[0]


def store_site(trace: Trace, path: str, computed: int) -> Site | None:
    """The traced line that stores into the container `path` (`losses.append(loss)`) when it is
    not line `computed`; storing into a list is no autograd event, so the source is read."""
    if "[" in path or "." in path or (found := traced_file(trace)) is None:
        return None
    file, first, last = found
    store = re.compile(
        rf"(?<![\w.]){re.escape(path)}\s*(\.(append|extend|insert|add)\(|\[[^\]]*\]\s*=[^=]|\+=)"
    )
    hits = [
        n
        for n in range(first, last + 10)
        if store.search(linecache.getline(file, n).split("#", 1)[0])
    ]
    if not hits:
        # Filled by a function of the file that no autograd event shows running (a forward
        # hook appending each output): its one store line, when there is exactly one.
        every = [
            n
            for n, text in enumerate(linecache.getlines(file), 1)
            if store.search(text.split("#", 1)[0])
        ]
        hits = every if len(every) == 1 else []
    after = [n for n in hits if n >= computed]
    line = (after or hits or [computed])[0]
    return None if line == computed else Site(file, line)


def backward_receiver(site: Site) -> str | None:
    """`policy_loss` when the line at `site` calls `policy_loss.backward(`, else None."""
    found = re.search(r"(?<![\w.])([A-Za-z_][\w.]*)\.backward\(", source_of(site))
    return None if found is None else found[1]


def reads_itself(name: str, site: Site) -> bool:
    """Whether the line at `site` names `name` at least twice (`h = rnn(x, h)`)."""
    return len(re.findall(rf"(?<![\w.]){re.escape(name)}(?![\w])", source_of(site))) >= 2


def is_step_call(site: Site) -> bool:
    """Whether the line at `site` calls some `.step(`: an optimizer update."""
    return "step(" in source_of(site)


def stepped_object(site: Site) -> str | None:
    """`opt` in `opt.step()` on the line at `site`."""
    match = re.search(r"([\w.]+)\.step\(", source_of(site))
    return match.group(1) if match else None


def _code(site: Site) -> str:
    return source_of(site).split("#", 1)[0].strip()


def out_of_place(site: Site, op: str) -> str | None:
    """The out-of-place form of the in-place call on the line at `site`, when the line is just
    that call: `p.clamp_(0, 1)` -> `p = p.clamp(0, 1)`, `x += y` -> `x = x + y`; else None."""
    code = _code(site)
    call = re.fullmatch(r"([\w.]+)\.(\w+_)\((.*)\)", code)
    if call and call.group(2) == op:
        target, name, args = call.groups()
        return f"{target} = {target}.{name[:-1]}({args})"
    augmented = re.fullmatch(r"([\w.]+)\s*([+\-*/])=\s*(.+)", code)
    if augmented:
        target, sign, value = augmented.groups()
        return f"{target} = {target} {sign} {value}"
    return None


def without_data(site: Site) -> str | None:
    """The line at `site` without `.data`, for a write under `torch.no_grad()` that autograd's
    version check sees: `p.data.add_(-lr, p.grad.data)` -> `p.add_(p.grad, alpha=-lr)` (the
    deprecated `add_(alpha, other)` order put right); None when the line has no `.data`."""
    code = _code(site)
    plain = re.sub(r"\.data(?![\w(])", "", code)
    if plain == code:
        return None
    old_order = re.fullmatch(r"(.+)\.add_\(([^,()]+),\s*([\w.]+)\)", plain)
    if old_order and "grad" in old_order.group(3) and "grad" not in old_order.group(2):
        target, alpha, other = old_order.groups()
        return f"{target}.add_({other}, alpha={alpha.strip()})"
    return plain


def without_graph(site: Site, holder: str) -> str | None:
    """How the line at `site` keeps a number or a detached value in `holder` instead of a graph:
    `total += loss` -> `total += loss.item()`; `self.mean = expr` -> `self.mean = (expr).detach()`
    (a module's statistic is a tensor, never a number); None when the line is neither."""
    code = _code(site)
    added = re.fullmatch(r"([\w.]+)\s*\+=\s*(.+)", code)
    if added and "." not in holder:
        value = added.group(2)
        value = value if re.fullmatch(r"[\w.]+", value) else f"({value})"
        return f"{added.group(1)} += {value}.item()"
    assigned = re.fullmatch(r"([\w.]+)\s*=\s*(.+)", code)
    if assigned:
        return f"{assigned.group(1)} = ({assigned.group(2)}).detach()"
    return None


def attribute_store_site(trace: Trace, path: str, computed: int) -> Site | None:
    """Where `obj.attr` (a container on an object) is filled when a method does it
    (`self.history.append(value)` inside `logger.log`): that line, with the traced line that
    calls the object at or after line `computed` as its outer line."""
    if path.count(".") != 1 or "[" in path or (found := traced_file(trace)) is None:
        return None
    obj, attr = path.split(".")
    store = re.compile(
        rf"(?<![\w.])self\.{re.escape(attr)}\s*(\.(append|extend|insert|add)\(|\[[^\]]*\]\s*=[^=])"
    )
    file, _first, last = found
    lines = linecache.getlines(file)
    hits = [n for n, text in enumerate(lines, 1) if store.search(text.split("#", 1)[0])]
    call = re.compile(rf"(?<![\w.]){re.escape(obj)}\.(\w+)\(")
    calls = [
        (n, match.group(1))
        for n in range(computed, last + 10)
        if (match := call.search(linecache.getline(file, n)))
    ]
    if len(hits) != 1 or not calls:
        return None
    return Site(file, hits[0], calls[0][1], outer_line=calls[0][0])


def written_name(site: Site) -> str | None:
    """`out` when the line at `site` writes a plain name in place (`out += self.bias`,
    `out.relu_()`), else None."""
    code = _code(site)
    found = re.fullmatch(r"([A-Za-z_]\w*)\.\w+_\(.*\)", code) or re.fullmatch(
        r"([A-Za-z_]\w*)\s*[-+*/@]=.*", code
    )
    return found.group(1) if found else None


def enclosing_function(site: Site) -> str:
    """The function the line at `site` is in, with the classes around it (`GatedNet.forward`),
    read from the source; the site's function name alone when the source is not available."""
    lines = linecache.getlines(site.file)
    if not 0 < site.line <= len(lines) or site.function.startswith("<"):
        return site.function
    names: list[str] = []
    indent = _indent(lines[site.line - 1])
    for text in reversed(lines[: site.line - 1]):
        if not text.strip() or _indent(text) >= indent:
            continue
        header = re.match(r"\s*(?:async\s+)?(def|class)\s+(\w+)", text)
        if header is None:
            continue
        kind, name = header.groups()
        if kind == "def" and names:  # a function around it: its locals, not a class's methods
            break
        if kind == "def" and name != site.function:
            return site.function
        names.append(name)
        indent = _indent(text)
    return ".".join(reversed(names)) or site.function


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip())
