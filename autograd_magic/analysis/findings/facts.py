"""Facts: one finding as data (what happened, where, how much, what caused it), never words.

One frozen dataclass per finding form: `Fact` holds what every finding has, and each form's
class adds its own typed fields, so a renamed field is an error where it is used, not a
`KeyError` the day that form occurs. A class's `kind` and `form` are class constants.
`autograd_magic.report.wording` turns a fact into the `Finding` sentence every view shows;
`autograd_magic.analysis.findings.serial` keeps facts as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autograd_magic.model.records import FindingKind, Site


@dataclass(frozen=True)
class SavedBy:
    """Who saved the tensors a write hit: node names, module paths (layers folded) and lines."""

    owners: tuple[str, ...]
    modules: tuple[str, ...]
    lines: tuple[int, ...]


@dataclass(frozen=True)
class Growth:
    """How a carried graph grew: nodes walked by the first and the last successful backward,
    and the backward calls counted (the failed one included)."""

    first_nodes: int
    last_nodes: int
    calls: int


@dataclass(frozen=True, eq=False, kw_only=True)
class Fact:
    """One diagnosis. `cause` is the root-cause fact this one follows from (None for a root
    cause or a lone fact). `reference` is the line that took the reference (a store, a write, a
    backward call) and `built` the line that built the graph. Only the classes below that set
    `form` are made; this one and the family bases only share fields."""

    kind: ClassVar[FindingKind]
    form: ClassVar[str]  # which of its kind's situations it is (the wording differs)

    line: int | None
    related_lines: tuple[int, ...] = ()
    holder: str | None = None
    nbytes: int = 0  # bytes at stake
    cause: GraphGrowth | None = None
    reference: Site | None = None
    built: Site | None = None
    iterations: int = 0  # iterations spanned (0 when not counted)
    node_ids: tuple[int, ...] = ()  # evidence: the node and buffer records behind the fact
    buffer_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not hasattr(type(self), "form"):
            raise TypeError(f"{type(self).__name__} is a family of facts, not a fact's form")


# ----- kept-alive --------------------------------------------------------------------------
@dataclass(frozen=True, eq=False, kw_only=True)
class KeptChain(Fact):
    """A plain variable that adds each iteration's result to itself (`total_loss += loss`);
    `fix` is the line rewritten to keep the value without its graph, when it can be."""

    kind: ClassVar[FindingKind] = "kept-alive"
    form: ClassVar[str] = "chain"
    fix: str | None
    retained_at: Site | None = None  # the retain_graph=True backward that kept their saved memory


@dataclass(frozen=True, eq=False, kw_only=True)
class KeptContainer(Fact):
    """Container elements or attributes holding `roots` graph roots; `used`: a backward walked
    them (else the graphs were never needed: outputs of a forward that only infers)."""

    kind: ClassVar[FindingKind] = "kept-alive"
    form: ClassVar[str] = "container"
    roots: int
    used: bool
    retained_at: Site | None = None  # the retain_graph=True backward that kept their saved memory


# ----- graph-growth, retained-graph --------------------------------------------------------
@dataclass(frozen=True, eq=False, kw_only=True)
class GraphGrowth(Fact):
    """A value carried across iterations links each graph to the previous one (the root
    cause). `earlier_nodes`: what the last such backward walked of earlier iterations;
    `is_tuple`: the holder is a tuple (an LSTM's `(h, c)`); `retain_graph_used` and
    `writes_hit_saved`: what detaching also fixes; `fast_weights`: the carried value is made
    from gradients taken with create_graph=True (MAML's fast weights), so detaching it would
    cut the meta-gradient and restarting it from the parameters is the fix."""

    kind: ClassVar[FindingKind] = "graph-growth"
    form: ClassVar[str] = "carried"
    earlier_nodes: int
    grew: Growth | None
    is_tuple: bool
    retain_graph_used: bool
    writes_hit_saved: bool
    fast_weights: bool = False


@dataclass(frozen=True, eq=False, kw_only=True)
class RetainedGraph(Fact):
    """`retain_graph=True` at one line kept saved tensors no later backward released; `times`
    counts the calls of that line (a failed one too). `holder` is the variable whose graph
    keeps most of them (a carried `hidden` rather than the `loss` rebound at every step) and
    `also_held_by` others that reach most of them too; `root_holder` holds the root that was
    backpropagated, when another variable is `holder`, and `root_only_bytes` is what dropping
    `root_holder` alone frees."""

    kind: ClassVar[FindingKind] = "retained-graph"
    form: ClassVar[str] = "retained"
    times: int
    also_held_by: tuple[str, ...] = ()
    root_holder: str | None = None
    root_only_bytes: int = 0
    kept_by: str | None = None  # the variable keeping those graphs alive (a finding of its own)


# ----- backward-through-freed --------------------------------------------------------------
@dataclass(frozen=True, eq=False, kw_only=True)
class FreedTwice(Fact):
    """A backward needed buffers an earlier backward had freed: the family's shared fields.
    `saved_lines`: where the freed tensors were saved (() when none was seen); `built_lines`:
    where the shared part was built; `releaser`: the backward that freed it, when known."""

    kind: ClassVar[FindingKind] = "backward-through-freed"
    saved_lines: tuple[int, ...]
    built_lines: tuple[int, ...]
    releaser: Site | None


@dataclass(frozen=True, eq=False, kw_only=True)
class FreedByTwoLosses(FreedTwice):
    """Two losses from one forward, backpropagated one after the other; `first` names the
    first loss when a variable holds it."""

    form: ClassVar[str] = "two-losses"
    first: str | None


@dataclass(frozen=True, eq=False, kw_only=True)
class FreedCarried(FreedTwice):
    """The shared part is a value carried across iterations (`carried`, made at
    `carried_line`); `fast_weights`: made from gradients taken with create_graph=True, as
    `GraphGrowth.fast_weights`."""

    form: ClassVar[str] = "carried"
    carried_line: int
    carried: str
    is_tuple: bool
    fast_weights: bool = False


@dataclass(frozen=True, eq=False, kw_only=True)
class FreedKeptContainer(FreedTwice):
    """Results kept in `container` reach the next loss. `refilled`: it gained elements after
    the backward that freed them (REINFORCE's list never emptied: empty it); else it is data
    collected once and read by several backwards (a PPO rollout reused over epochs: collect it
    without graphs)."""

    form: ClassVar[str] = "kept-container"
    container: str
    refilled: bool = True


@dataclass(frozen=True, eq=False, kw_only=True)
class FreedByGrad(FreedTwice):
    """`torch.autograd.grad` without create_graph=True (`releaser`) freed a graph the loss
    built from its result needs again (a gradient penalty: R1, WGAN-GP)."""

    form: ClassVar[str] = "by-grad"


@dataclass(frozen=True, eq=False, kw_only=True)
class FreedUnshared(FreedTwice):
    """No recorded node is shared with an earlier backward (a graph made outside the block)."""

    form: ClassVar[str] = "unshared"


@dataclass(frozen=True, eq=False, kw_only=True)
class FreedBuiltOnce(FreedTwice):
    """The shared part was built once and reused by every later backward; `widest` is the
    variable bound to most of it, when one is; `trains`: it is cached on an object and made
    from leaves whose gradient is accumulated (a module's parameters), so it must be rebuilt
    where it is used, not detached."""

    form: ClassVar[str] = "built-once"
    widest: str | None
    trains: bool = False


# ----- writes ------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False, kw_only=True)
class InplaceWrite(Fact):
    """In-place `op` on a tensor `saved` for backward; `fix` is the out-of-place line when
    one can be written; `failed` is the line of the later backward that failed because of it;
    `scope` is the function (`Net.forward`) whose local variable `holder` is, when the written
    tensor is a local of the user's function that no variable outside it names."""

    kind: ClassVar[FindingKind] = "inplace-on-saved"
    form: ClassVar[str] = "write"
    op: str
    saved: SavedBy
    fix: str | None
    failed: int | None
    scope: str | None = None


@dataclass(frozen=True, eq=False, kw_only=True)
class OptimizerStep(Fact):
    """One optimizer step updated the saved parameters `labels`."""

    kind: ClassVar[FindingKind] = "inplace-on-saved"
    form: ClassVar[str] = "optimizer-step"
    labels: tuple[str, ...]
    saved: SavedBy
    failed: int | None


@dataclass(frozen=True, eq=False, kw_only=True)
class LibraryWrite(Fact):
    """A library function (`call`: `embedding`) changed the tensor `holder` in place inside its
    body, after `saved` saved it; `module` (of class `module_type`) is the module whose forward
    made the call, when one did; `failed` as for `InplaceWrite`."""

    kind: ClassVar[FindingKind] = "inplace-on-saved"
    form: ClassVar[str] = "library"
    call: str
    module: str | None
    module_type: str | None
    saved: SavedBy
    failed: int | None


@dataclass(frozen=True, eq=False, kw_only=True)
class SharedWrite(Fact):
    """In-place `op` that also changed `sharers`: (label, how it came to share, None for the
    original); `unnamed`: sharers no user name reaches, as (how each was made, its line)."""

    kind: ClassVar[FindingKind] = "shared-write"
    form: ClassVar[str] = "write"
    op: str
    sharers: tuple[tuple[str, str | None], ...]
    unnamed: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, eq=False, kw_only=True)
class Bypass(Fact):
    """A write autograd's version check cannot see, to memory `saved` for backward:
    `written` names what was written."""

    kind: ClassVar[FindingKind] = "data-bypass"
    written: str
    saved: SavedBy


@dataclass(frozen=True, eq=False, kw_only=True)
class DataWrite(Bypass):
    """Written through `.data`."""

    form: ClassVar[str] = "data"


@dataclass(frozen=True, eq=False, kw_only=True)
class DataUpdate(Bypass):
    """A manual update step: one line wrote the parameters `labels` through `.data` after a
    backward had walked (and retained) the graph that saved them; `fix` is that line written
    without `.data`, when it can be."""

    form: ClassVar[str] = "update"
    labels: tuple[str, ...]
    fix: str | None


@dataclass(frozen=True, eq=False, kw_only=True)
class NumpyWrite(Bypass):
    """Written through a NumPy array sharing the memory."""

    form: ClassVar[str] = "numpy"


# ----- unused-graph ------------------------------------------------------------------------
@dataclass(frozen=True, eq=False, kw_only=True)
class Leftover(Fact):
    """A running sum still holding `results` results made after the last backward."""

    kind: ClassVar[FindingKind] = "unused-graph"
    form: ClassVar[str] = "leftover"
    results: int


@dataclass(frozen=True, eq=False, kw_only=True)
class UnusedGraphs(Fact):
    """`graphs` graphs one line built that no backward used. `held`: a variable still holds
    one; `holds`: each holder with its graphs' places in building order (0: the first)."""

    kind: ClassVar[FindingKind] = "unused-graph"
    graphs: int
    held: bool
    holds: tuple[tuple[str, tuple[int, ...]], ...]
    # The error that ended the step before any backward could use them (a consequence of the
    # crash, said after its cause); None when no crash explains them.
    crashed: Site | None = None


@dataclass(frozen=True, eq=False, kw_only=True)
class NoBackward(UnusedGraphs):
    """No backward ran in the block at all."""

    form: ClassVar[str] = "no-backward"


@dataclass(frozen=True, eq=False, kw_only=True)
class NeverReached(UnusedGraphs):
    """Backwards ran but never reached these graphs; `freed_at` is the line where most were
    freed, when any was."""

    form: ClassVar[str] = "never-reached"
    freed_at: int | None


# Every form, in the order of `FindingKind`: what JSON and the wording table cover.
FACT_TYPES: tuple[type[Fact], ...] = (
    KeptChain,
    KeptContainer,
    GraphGrowth,
    RetainedGraph,
    FreedByTwoLosses,
    FreedCarried,
    FreedKeptContainer,
    FreedByGrad,
    FreedUnshared,
    FreedBuiltOnce,
    InplaceWrite,
    OptimizerStep,
    LibraryWrite,
    SharedWrite,
    DataWrite,
    DataUpdate,
    NumpyWrite,
    Leftover,
    NoBackward,
    NeverReached,
)
