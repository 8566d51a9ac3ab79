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
    after = [n for n in hits if n >= computed]
    line = (after or hits or [computed])[0]
    return None if line == computed else Site(file, line)


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
