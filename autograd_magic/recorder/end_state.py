"""What the writer records when a block ends: the user's names, holders of live graphs, module
paths as the user would type them, the exception that ended it (`TraceWriter.end`)."""

from __future__ import annotations

from autograd_magic.model.records import Holder, Site
from autograd_magic.model.trace import Trace


class EndState:
    """The end-of-block writes of one `TraceWriter` (which makes it and alone holds it)."""

    def __init__(
        self, trace: Trace, module_calls: dict[str, int], module_types: dict[str, str]
    ) -> None:
        self.trace = trace
        # The writer's tables, filled as modules are called (`TraceWriter.module_entered`).
        self.module_calls = module_calls
        self.module_types = module_types

    def names(
        self, labels: dict[int, str], alive: set[int], version_groups: dict[int, list[int]]
    ) -> None:
        """The user's names at the end of the block, which objects were still alive, and each
        bump's aliases (`affected`, from the groups sharing a version counter)."""
        trace = self.trace
        trace.labels = labels
        trace.alive_at_end = alive
        for bump in trace.version_bumps:
            bump.label = labels.get(bump.object_id, bump.label)
            if bump.bypassed_id:
                bump.bypassed = labels.get(bump.bypassed_id, "")
            bump.sharers = tuple(trace.label(uid) for uid in bump.sharer_ids)
            members = version_groups.get(bump.object_id, ())
            bump.affected = tuple(sorted(trace.label(m) for m in members if m != bump.object_id))

    def alive_now(self, alive: set[int]) -> None:
        """Which tracked objects are alive now, while the block runs (its end sets them too)."""
        self.trace.alive_at_end = alive

    def buffer_names(self, names: dict[int, str]) -> None:
        """The user's names of saved tensors still held at the end (buffer id -> path)."""
        if not names:
            return
        for buffer in self.trace.buffers:
            name = names.get(buffer.id)
            if name is not None and not buffer.label:
                buffer.label = name

    def holders(self, holders: list[Holder]) -> None:
        """User-visible paths that keep a live graph root alive at the end of the block (or, while
        it runs, at the last live refresh: replaced at each)."""
        self.trace.holders = list(holders)

    def modules(self, root_names: dict[str, str]) -> None:
        """Replace each root placeholder (`<0>`) in module paths by the user's name for that
        module (`model`), or by its class when it has none (a loss module made inside a
        forward: each step's instance then shares one path), and store every module's calls
        and class."""
        final: dict[str, str] = {}
        types = self.module_types

        def rename(path: str) -> str:
            named = final.get(path)
            if named is None:
                root, dot, rest = path.partition(".")
                root_name = root_names.get(root) or types.get(root, "module")
                named = final[path] = root_name + dot + rest
            return named

        trace = self.trace
        for records in (trace.nodes, trace.buffers, trace.version_bumps):
            for record in records:
                if record.module is not None:
                    record.module = rename(record.module)
        calls: dict[str, int] = {}
        for path, count in self.module_calls.items():
            renamed = rename(path)
            calls[renamed] = calls.get(renamed, 0) + count
        trace.module_calls = calls
        trace.module_types = {rename(p): t for p, t in types.items()}

    def error(self, message: str, site: Site | None) -> None:
        """The exception that ended the block."""
        self.trace.error = message
        self.trace.error_site = site
