"""Findings on the corpus of loops nobody here wrote (tests/findings_corpus.py, issue 22):
no finding on a correct loop; on a broken one, the expected kind, line, holder and advice."""

from __future__ import annotations

import json

import pytest
from findings_corpus import CASES, Case, lines_of

from autograd_magic.analysis.findings import find_facts
from autograd_magic.analysis.findings.serial import (
    fact_to_dict,
    facts_from_json_list,
    facts_to_json_list,
)
from autograd_magic.report.wording import finding as finding_of


def expected_rows(case: Case) -> list[tuple[str, int, str | None]]:
    line_of = lines_of(case)
    return [(e.kind, line_of(e.marker), e.holder) for e in case.expected]


@pytest.mark.parametrize("name", sorted(CASES))
def test_corpus_case(name, request):
    case = CASES[name]
    if case.known_gap:
        request.applymarker(pytest.mark.xfail(reason=case.known_gap, strict=True))
    # WHEN the loop runs under track()
    trace = case.loop()
    found = trace.findings
    # THEN it gets exactly the findings an expert expects, in cause order, with fitting advice
    assert [(f.kind, f.line, f.holder) for f in found] == expected_rows(case), "\n".join(
        f.message for f in found
    )
    for finding, expect in zip(found, case.expected, strict=True):
        for words in expect.fix:
            assert words in finding.message, finding.message
        for words in expect.never:
            assert words not in finding.message, finding.message


@pytest.mark.parametrize(
    "name",
    [
        "ppo-rollout-with-graph",
        "r1-without-create-graph",
        "maml-fast-weights-carried",
        "masked-in-init",
        "hidden-retain-graph",
        "word-lm-retain-graph",
    ],
)
def test_the_facts_of_fitting_fixes_round_trip_through_json(name):
    # GIVEN the facts of a case whose fix depends on a field issue 35 added
    facts = find_facts(CASES[name].loop())
    # WHEN they go through JSON text and back
    loaded = facts_from_json_list(json.loads(json.dumps(facts_to_json_list(facts))))
    # THEN every field and every sentence is the same
    assert [fact_to_dict(f) for f in loaded] == [fact_to_dict(f) for f in facts]
    assert [finding_of(f).message for f in loaded] == [finding_of(f).message for f in facts]
