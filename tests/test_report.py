"""The text report and the reading model (sentences, tables) on hand-made traces."""

from __future__ import annotations

import dataclasses
import re

import torch
from traces import analysis, handmade_trace, report, site

import autograd_magic
from autograd_magic.model.records import (
    BackwardCall,
    Finding,
    NodeRecord,
    TimelineSample,
    VersionBump,
)
from autograd_magic.model.units import format_bytes
from autograd_magic.report.buffers import buffer_table, buffer_totals, storage_table
from autograd_magic.report.model import MAX_TABLE_ROWS, TEXT_TABLE_ROWS
from autograd_magic.report.sentences import backward_sentences, summary_items
from autograd_magic.report.versions import versions_table
from autograd_magic.trace import Trace
from autograd_magic.views.text import render_text


def sentences(trace: Trace, block: str = "block"):
    """The report's sentences of `trace` as it is now."""
    return list(report(trace, block).sentences)


def test_format_bytes_uses_binary_units():
    assert format_bytes(0) == "0 B"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(12 * 2**20) == "12.0 MiB"
    assert format_bytes(3 * 2**40) == "3072.0 GiB"


def test_summary_gives_now_and_peak():
    items = dict(summary_items(analysis(handmade_trace())))
    assert items["Live autograd nodes"] == "3 now / 4 peak"
    assert items["Retained saved tensors"] == "4.0 KiB now / 4.0 KiB peak"
    assert items["Backward calls"] == "1"
    assert items["Shared-storage groups"] == "1"
    assert items["Version bumps (in-place writes)"] == "2"


def test_sentences_put_the_error_first_then_findings_with_lines():
    found = sentences(handmade_trace(error=True))
    assert [s.kind for s in found] == ["error", "finding", "blindspot", "note"]
    assert found[0].text.startswith("Line 7 raised RuntimeError: boom. Everything")
    assert found[0].line == 7
    assert found[1].text == "`loss` keeps the graph built at line 4 alive. (see also lines 2, 3)"
    assert "3 autograd nodes were still alive, holding 4.0 KiB" in found[-1].text


def test_sentences_report_record_caps_instead_of_cutting_silently():
    trace = handmade_trace()
    trace.dropped_nodes, trace.dropped_buffers = 5, 7
    text = " ".join(s.text for s in sentences(trace))
    assert "5 nodes, 7 saved tensors and 0 in-place writes or memory links are counted" in text


def test_backward_sentences_name_flags_and_what_was_released():
    (call,) = backward_sentences(analysis(handmade_trace()))
    assert call.text == (
        "Line 5: backward(retain_graph=True) released 1 saved tensor, freeing 24 B of retained "
        "memory; the graph was kept for another backward."
    )


def test_failed_backward_is_an_error_sentence():
    trace = handmade_trace()
    trace.backward_calls[0].error_type = "RuntimeError"
    trace.backward_calls[0].error = "second time"
    (call,) = backward_sentences(analysis(trace))
    assert call.kind == "error"
    assert call.text.endswith("failed with RuntimeError: second time")


def test_buffer_table_lists_held_first_with_lines_and_totals_by_state():
    trace = handmade_trace()
    table = buffer_table(analysis(trace))
    assert [row[0] for row in table.rows] == [
        "SumBackward0#4",
        "MulBackward0#2",
        "ExpBackward0#3",
    ]
    assert table.rows[2][-1] == "released (line 5)"
    assert table.rows[1][6] == "your tensor"  # why its bytes are not counted as retained
    totals = {(r[0], r[1]): r[2:] for r in buffer_totals(analysis(trace)).rows}
    assert totals[("held", "activation")] == ("1", "4.0 KiB")
    assert totals[("released", "activation")] == ("1", "24 B")
    assert buffer_table(analysis(trace), {3}).rows[0][0] == "ExpBackward0#3"


def test_buffer_table_says_when_rows_were_left_out():
    trace = handmade_trace()
    extra = trace.buffers[2]
    trace.buffers = [dataclasses.replace(extra, nbytes=n + 1) for n in range(MAX_TABLE_ROWS + 3)]
    table = buffer_table(analysis(trace))
    assert len(table.rows) == MAX_TABLE_ROWS
    assert table.note == (
        f"Showing the first {MAX_TABLE_ROWS} of {MAX_TABLE_ROWS + 3} rows "
        f"({MAX_TABLE_ROWS + 3} saved tensors)."
    )


def test_buffer_table_groups_tensors_alike_but_for_their_node():
    # GIVEN the same saved tensor on 1,000 different nodes (a loop) and one different tensor
    trace = handmade_trace()
    exp = trace.buffers[1]
    trace.buffers = [dataclasses.replace(exp, id=100 + i) for i in range(1000)] + [trace.buffers[0]]
    # THEN they read as one row with the count and per-tensor bytes; the odd one keeps its id
    rows = buffer_table(analysis(trace)).rows
    assert len(rows) == 2
    assert rows[0][0] == "MulBackward0#2"
    assert rows[1][0] == "ExpBackward0 (x1,000)"
    assert rows[1][5] == "24 B each"
    assert rows[1][-1] == "released (line 5)"


def test_backward_calls_group_by_line_with_what_each_released():
    # GIVEN 363 identical backward calls at line 13 and two at line 20 releasing different amounts
    trace = handmade_trace()
    same = BackwardCall("backward", 7, site(13), False, False, 8, 5, 2560)
    trace.backward_calls = [dataclasses.replace(same, seq=i) for i in range(363)] + [
        BackwardCall("backward", 900, site(20), False, False, 901, 2, 100),
        BackwardCall("backward", 902, site(20), False, False, 903, 4, 300),
    ]
    texts = [s.text for s in backward_sentences(analysis(trace))]
    # THEN one sentence per line, saying how many calls and what each released
    assert texts == [
        "Line 13: 363 backward() calls, each released 5 saved tensors, freeing 2.5 KiB of "
        "retained memory.",
        "Line 20: 2 backward() calls, each released 2 to 4 saved tensors, freeing 100 B to "
        "300 B (400 B in all).",
    ]


def test_version_bumps_group_by_tensor_and_op():
    # GIVEN an optimizer writing w in place 1,000 times at line 19, and one write to b
    trace = handmade_trace()
    trace.version_bumps = [
        VersionBump("w", "add_", i, i + 1, 10 + i, site(19)) for i in range(1000)
    ] + [VersionBump("b", "mul_", 0, 1, 5, site(19))]
    rows = versions_table(analysis(trace)).rows
    # THEN one row per tensor and op, with the version range and the count of writes
    assert rows == (
        ("b", "mul_", "line 19", "0 -> 1", "", "", ""),
        ("w", "add_", "line 19", "0 -> 1000 (1,000 writes)", "", "", ""),
    )


def test_a_write_inside_a_library_call_is_flagged_in_the_versions_table():
    # GIVEN nn.Embedding(max_norm=1)'s F.embedding renormalizing `emb.weight` at line 7
    trace = handmade_trace()
    trace.version_bumps = [VersionBump("emb.weight", "embedding", 1, 2, 5, site(7), hidden=True)]
    (row,) = versions_table(analysis(trace)).rows
    # THEN its row names the call and says how the write was seen
    assert row[:4] == ("emb.weight", "embedding", "line 7", "1 -> 2")
    assert row[-1] == "written inside `embedding`: seen as its version moving across the call"


def test_version_bumps_of_repeated_layers_and_optimizer_state_share_a_row():
    # GIVEN one Adam step over 4 layers of 2 parameters, and a 2-layer Sequential's weights
    trace = handmade_trace()
    bumps = []
    for i in range(4):
        for name in ("weight", "bias"):
            param = f"model.layers.{i}.{name}"
            bumps.append(VersionBump(param, "addcdiv_", 0, 1, 10, site(19)))
            bumps.append(VersionBump(f"opt.state[{param}]['exp_avg']", "lerp_", 0, 1, 11, site(19)))
            bumps.append(VersionBump(f"tensor#{len(bumps)}", "add_", 0, 1, 12, site(19)))
    bumps += [VersionBump(f"seq.{i}.weight", "add_", 3, 4, 13, site(20)) for i in (0, 2)]
    trace.version_bumps = bumps
    rows = {row[:4] for row in versions_table(analysis(trace)).rows}
    # THEN each parameter of the repeated layers is one row, with how many tensors it covers
    assert ("model.layers.*.weight", "addcdiv_", "line 19", "0 -> 1 each (4 tensors)") in rows
    # AND each optimizer state entry is one row, and so are the step's unnamed temporaries
    assert ("opt.state[*]['exp_avg']", "lerp_", "line 19", "0 -> 1 each (8 tensors)") in rows
    assert ("tensor#*", "add_", "line 19", "0 -> 1 each (8 tensors)") in rows
    # AND two tensors alike keep their own names
    assert ("seq.0.weight", "add_", "line 20", "3 -> 4") in rows
    assert ("seq.2.weight", "add_", "line 20", "3 -> 4") in rows
    assert len(rows) == 6  # weight, bias, exp_avg, temporaries, two seq weights


def test_text_report_caps_each_table_and_says_so():
    trace = handmade_trace()
    trace.version_bumps = [
        VersionBump(f"t{i}", "add_", 0, 1, 10 + i, site(19)) for i in range(TEXT_TABLE_ROWS + 5)
    ]
    text = render_text(report(trace))
    assert f"(Showing {TEXT_TABLE_ROWS} of {TEXT_TABLE_ROWS + 5} rows.)" in text
    assert f"t{TEXT_TABLE_ROWS + 4} " not in text


def test_storage_and_version_tables():
    trace = handmade_trace()
    rows = storage_table(analysis(trace)).rows
    assert ("group 1", "h", "original", "shares memory") in rows
    assert ("group 1", "h_view", "detach", "shares memory") in rows
    assert ("group 1", "h_copy", "copy of h_view", "own memory (copy)") in rows
    versions = versions_table(analysis(trace)).rows
    assert versions[0][:5] == ("h_view", "add_", "line 6", "0 -> 1", "h")
    assert versions[0][6] == ""
    assert versions[1][6].startswith("BYPASS through h: version unchanged")


def test_render_text_has_every_section():
    text = render_text(report(handmade_trace(error=True)))
    assert text.startswith("autograd_magic trace (error)")
    for part in (
        "Live autograd nodes: 3 now / 4 peak",
        "Line 7 raised RuntimeError: boom.",
        "Backward calls:\n  - Line 5: backward(retain_graph=True)",
        "Totals by state:",
        "SumBackward0#4",
        "Storage groups:",
        "Version bumps:",
        "BYPASS through h",
    ):
        assert part in text, part


def test_render_text_of_an_empty_running_trace():
    text = render_text(report(Trace()))
    assert text.startswith("autograd_magic trace (running)")
    assert "Saved tensors: none" in text


def test_a_clean_cell_says_no_findings_and_nothing_about_an_empty_end_state():
    # GIVEN a training step that frees its graph WHEN reported
    w = torch.ones(3, requires_grad=True)
    with autograd_magic.track() as trace:
        (w * 2).exp().sum().backward()
    # THEN the findings section reads "No findings." and says nothing about 0 live nodes
    texts = [s.text for s in sentences(trace)]
    assert texts == ["No findings."]
    # AND a cell that ends holding a graph still says how much, and what holds it (with no
    # finding above, the reader would otherwise ask why it is alive)
    with autograd_magic.track() as trace:
        kept = (w * 2).exp().sum()  # exp's result: only the graph holds it
    assert sentences(trace)[-1].text == (
        "When the block ended, 4 autograd nodes were still alive, holding 12 B of saved tensors "
        "(peak 12 B), kept by `kept`."
    )
    del kept


def test_a_sentence_names_each_line_once():
    # GIVEN findings whose sentences already name their own and related lines (issue 22, 6)
    trace = handmade_trace()
    trace.stored_findings = [
        Finding("backward-through-freed", "`loss.backward()` at line 7 needs line 3.", 7, (3, 4)),
        Finding("kept-alive", "`h` keeps lines 2, 3 and 5 alive.", 5, (2, 3)),
        Finding("unused-graph", "A graph nobody used.", 9, (8,)),
    ]
    # WHEN the report is worded
    texts = [s.text for s in sentences(trace) if s.kind == "finding"]
    # THEN a line the sentence names is neither prefixed nor repeated in "see also"
    assert texts == [
        "`loss.backward()` at line 7 needs line 3. (see also line 4)",
        "`h` keeps lines 2, 3 and 5 alive.",
        "Line 9: A graph nobody used. (see also line 8)",
    ]
    # AND no sentence of the text report names the same line twice
    for text in texts:
        named = re.findall(r"\b[Ll]ines? (\d+)", text)
        assert len(named) == len(set(named)), text


def test_pytorchs_error_text_appears_once_in_the_report():
    # GIVEN a cell stopped by a backward that failed with PyTorch's error (issue 22, 6)
    trace = handmade_trace(error=True)
    trace.error = "RuntimeError: Trying to backward through the graph a second time."
    trace.backward_calls.append(
        BackwardCall(
            "backward",
            9,
            site(7),
            False,
            False,
            None,
            error="Trying to backward through the graph a second time.",
            error_type="RuntimeError",
        )
    )
    # WHEN the text report is rendered THEN the error's text appears once, in the findings
    text = render_text(report(trace), tables=False)
    assert text.count("Trying to backward through the graph a second time") == 1, text
    assert "Line 7 raised RuntimeError: Trying to backward" in text
    # AND the failed call says it failed, pointing at the error instead of repeating it
    calls = [s.text for s in backward_sentences(analysis(trace))]
    assert calls[-1] == "Line 7: backward() failed with the RuntimeError above."


def test_a_caught_backward_error_keeps_its_text_in_the_calls():
    # GIVEN a failed backward the code caught (the cell did not stop)
    trace = handmade_trace()
    trace.backward_calls.append(
        BackwardCall("backward", 9, site(7), False, False, None, error="boom", error_type="E")
    )
    # THEN its text is given where the call is listed: nowhere else has it
    assert backward_sentences(analysis(trace))[-1].text == "Line 7: backward() failed with E: boom"


def _running_loop(grow: int) -> Trace:
    """Hand-made records of a running 20-step loop: step k builds a 3-node graph rooted at
    node 3k (line 4) and backpropagates it at seq 10k + 5; `grow` of its nodes (the root
    first) stay alive, the others die when the next step builds its graph."""
    trace = Trace()
    for k in range(1, 21):
        root = 3 * k
        for i in range(3):
            freed = None if i < grow else 10 * k + 10
            node = NodeRecord(root + i, "MeanBackward0", 10 * k + i, site(4), freed_seq=freed)
            trace.nodes.append(node)
        trace.backward_calls.append(
            BackwardCall(
                "backward", 10 * k + 1, site(5), False, False, 10 * k + 5, root_ids=(root,)
            )
        )
        trace.timeline.append(TimelineSample(10 * k + 5, 3 + grow * k, 0, "backward", 5))
    return trace


def test_a_running_loop_whose_live_nodes_grow_every_step_gets_a_provisional_finding():
    # GIVEN hand-made records of a loop still running whose steps each leave 3 nodes alive
    # WHEN it is worded (issue 22, class 7)
    (found,) = [s for s in sentences(_running_loop(grow=3)) if s.kind == "finding"]
    # THEN the growth per step, the line building what stays, and that it is provisional
    assert found.text.startswith("So far, live autograd nodes grow by 3 per step (63 alive")
    assert "the graph built at line 4 stays alive after its backward" in found.text
    assert found.line == 4


def test_a_running_loop_with_steady_live_nodes_or_a_finished_one_has_no_provisional_finding():
    assert [s for s in sentences(_running_loop(grow=0)) if s.kind == "finding"] == []
    finished = _running_loop(grow=3)
    finished.finished = True  # the real findings replace the provisional one
    assert not any("So far" in s.text for s in sentences(finished))


def _many_rows_trace() -> Trace:
    with autograd_magic.track() as trace:
        x = torch.ones(3, requires_grad=True)
        kept = [(x * i).exp() for i in range(30)]  # 30 saved buffers, rows of the Buffers table
    del kept
    return trace


def test_a_cut_table_names_the_live_panel_only_beside_one():
    # GIVEN a finished trace whose tables have more rows than a saved output shows
    from autograd_magic.views.html import page, static_html

    trace = _many_rows_trace()
    # WHEN rendered as a script's report (no live panel) and as a notebook's saved copy
    script, saved_copy = static_html(report(trace)), page(report(trace, "cell", live_panel=True))
    # THEN only the notebook's copy points to the live panel (issue 36, item 4)
    assert "rows in this saved output." in script and "live panel" not in script
    assert "rows in this saved output; the live panel lists up to" in saved_copy


def test_a_quoted_line_leaves_out_its_comment():
    # GIVEN backward(retain_graph=True) called from a commented line
    with autograd_magic.track() as trace:
        x = torch.ones(3, requires_grad=True)
        losses = [(x * i).exp().sum() for i in (1, 2)]
        for loss in losses:
            loss.backward(retain_graph=True)  # keep   it for later
    (retained,) = [f for f in trace.findings if f.kind == "retained-graph"]
    # THEN the line is quoted without the comment (was "(`... # keep it for later`)"; issue
    # 36, item 7; test_real_loops holds ", called N times)" inside the same parentheses: both
    # calls retained a graph no later backward walked, issue 35)
    assert "(`loss.backward(retain_graph=True)`, called 2 times)" in retained.message
    assert "for later" not in retained.message
    del losses, loss


def test_a_fused_ops_saved_tensor_says_what_the_op_computes():
    # GIVEN an LSTM step, whose saved tensors belong to one fused node
    lstm = torch.nn.LSTM(4, 8)
    with autograd_magic.track() as trace:
        out, _ = lstm(torch.ones(3, 1, 4))
        loss = out.sum()
    names = {row[2] for row in buffer_table(analysis(trace)).rows}
    # THEN the Buffers tab names it by what it is, not only by the kernel's name (issue 36, 7)
    assert any(n.startswith("saved by the LSTM/GRU layer (") for n in names), names
    del loss


def test_a_fused_ops_words_are_not_repeated_by_its_kernels_name():
    # GIVEN a layer norm and an embedding, whose nodes are fused kernels named as the words say
    norm, embed = torch.nn.LayerNorm(4), torch.nn.Embedding(10, 4)
    with autograd_magic.track() as trace:
        loss = norm(embed(torch.tensor([1, 2]))).sum()
    names = {row[2] for row in buffer_table(analysis(trace)).rows}
    # THEN the Buffers tab says 'saved by layer norm', not '... (nativelayernorm)' (read on the
    # panel's screenshots of a transformer step, issue 36)
    assert "saved by layer norm" in names and "saved by the embedding" in names, names
    assert not any("(nativelayernorm)" in n or "(embedding)" in n for n in names), names
    del loss
