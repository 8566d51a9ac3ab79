"""Findings on the corpus of loops nobody here wrote (tests/findings_corpus.py, issue 22):
no finding on a correct loop; on a broken one, the expected kind, line, holder and advice."""

from __future__ import annotations

import pytest
from findings_corpus import CASES, Case, lines_of


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
