"""`python -m autograd_magic run|report` and `track(save=...)`: a tracked script behaves like
`python script.py` (stdout, exit code, traceback), trace files are written and reported, and bad
input is one line, exit code 2, nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import autograd_magic
from autograd_magic import cli
from autograd_magic.model.export import FORMAT_VERSION
from autograd_magic.saving import load_trace_file, save_trace, trace_file_text
from autograd_magic.views.report_html import report_document

ROOT = Path(__file__).resolve().parents[1]

TRAIN = """\
import sys
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 8), torch.randn(32, 1)
losses = []
for step in range(int(sys.argv[1])):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss)
print(__name__, sys.argv[1:], [round(v, 6) for v in model[0].weight[0].tolist()])
"""

RAISES = """\
import torch
a = torch.ones(3, requires_grad=True)
print("before")
def step():
    raise ValueError(f"bad step {a.sum().item()}")
step()
"""


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")


def python(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env(), capture_output=True, text=True, timeout=300
    )


def tracked(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return python("-m", "autograd_magic", *args, cwd=cwd)


def test_run_is_the_script_plus_a_report_and_a_trace_file(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    plain = python("train.py", "4", cwd=tmp_path)
    run = tracked("run", "--html", "out/r.html", "train.py", "4", cwd=tmp_path)
    assert plain.returncode == run.returncode == 0, run.stderr
    assert run.stdout == plain.stdout and run.stdout.startswith("__main__ ['4']")
    assert "Findings:" in run.stderr and "`losses` holds 4 tensors" in run.stderr
    # AND stderr stays short: the tables are in the full report, which it says how to get
    assert "Saved tensors:" not in run.stderr and "Version bumps:" not in run.stderr
    assert "python -m autograd_magic report train.trace.json --text" in run.stderr
    trace, info = load_trace_file(tmp_path / "train.trace.json")
    assert info["rank"] == 0 and info["world_size"] == 1
    assert trace.finished and len(trace.backward_calls) == 4
    assert any("losses" in f.message for f in trace.findings)
    page = (tmp_path / "out" / "r.html").read_text()
    assert "`losses` holds 4 tensors" in page and page.count("data:image/png;base64,") == 2
    # AND a script's report speaks of no cell and no live panel (issue 36, item 4)
    assert "live panel" not in page and "cell" not in page.lower(), page
    from autograd_magic.views.figures import timeline_figure

    figure = timeline_figure(trace.report().timeline)
    words = [t.get_text() for ax in figure.axes for t in [*ax.texts, ax.xaxis.label]]
    assert not [w for w in words if "cell" in w], words


def test_a_raising_script_keeps_its_exit_code_and_traceback(tmp_path):
    (tmp_path / "bad.py").write_text(RAISES)
    plain = python("bad.py", cwd=tmp_path)
    run = tracked("run", "-o", "t/{rank}-{pid}.json", "bad.py", cwd=tmp_path)
    assert run.returncode == plain.returncode == 1
    assert run.stdout == plain.stdout == "before\n"
    expected = plain.stderr.strip().splitlines()
    assert expected[-1] == "ValueError: bad step 3.0"
    # The traceback as Python prints it, then the report.
    assert run.stderr.startswith("\n".join(expected) + "\n"), run.stderr
    (saved,) = (tmp_path / "t").iterdir()
    assert saved.name.startswith("0-")
    trace, _ = load_trace_file(saved)
    assert trace.error == "ValueError: bad step 3.0"


@pytest.mark.parametrize(
    ("code", "status", "message"),
    [("sys.exit(3)", 3, ""), ("sys.exit()", 0, ""), ("sys.exit('stopped')", 1, "stopped")],
)
def test_sys_exit_gives_the_same_status(tmp_path, code, status, message):
    (tmp_path / "s.py").write_text(f"import sys\nprint('hi')\n{code}\n")
    plain = python("s.py", cwd=tmp_path)
    run = tracked("run", "s.py", cwd=tmp_path)
    assert run.returncode == plain.returncode == status
    assert run.stdout == plain.stdout == "hi\n"
    assert run.stderr.startswith(plain.stderr) and message in run.stderr
    assert (tmp_path / "s.trace.json").exists()


def bad_inputs(folder: Path) -> dict[str, tuple[list[str], str]]:
    (folder / "notes.txt").write_text("hello")
    (folder / "empty.json").write_text("")
    (folder / "cut.json").write_text(autograd_magic.Trace().to_json()[:40])
    keyless = json.loads(autograd_magic.Trace().to_json())
    del keyless["buffers"]
    (folder / "keyless.json").write_text(json.dumps(keyless))
    (folder / "other.json").write_text(json.dumps({"format": "something.else"}))
    newer = json.loads(autograd_magic.Trace().to_json())
    newer["version"] = FORMAT_VERSION + 1
    (folder / "newer.json").write_text(json.dumps(newer))
    return {
        "missing script": (["run", "nope.py"], "nope.py: no such script"),
        "missing file": (["report", "gone.json"], "gone.json: no such file"),
        "text file": (["report", "notes.txt"], "notes.txt: not an autograd_magic trace"),
        "empty file": (["report", "empty.json"], "empty.json: empty file (0 bytes)"),
        "truncated file": (["report", "cut.json"], "cut.json: cut off at byte 40"),
        "missing key": (
            ["report", "keyless.json"],
            "keyless.json: not a readable autograd_magic trace (buffers: missing",
        ),
        "other json": (["report", "other.json"], "other.json: not an autograd_magic trace"),
        "newer": (["report", "newer.json"], "written by a newer autograd_magic"),
    }


def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for case, (argv, message) in bad_inputs(tmp_path).items():
        before = sorted(p.name for p in tmp_path.iterdir())
        assert cli.main(argv) == 2, case
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("autograd_magic: error: "), case
        assert message in err, (case, err)
        assert sorted(p.name for p in tmp_path.iterdir()) == before, case


def test_bad_input_from_the_command_line(tmp_path):
    done = tracked("report", "missing.json", cwd=tmp_path)
    assert (
        done.returncode == 2
        and done.stderr == "autograd_magic: error: missing.json: no such file\n"
    )
    assert list(tmp_path.iterdir()) == []


def leak(steps: int) -> None:
    x = torch.ones(4, requires_grad=True)
    kept = [(x * i).exp().sum() for i in range(steps)]
    del kept


def test_track_save_writes_the_trace_even_when_the_block_raises(tmp_path):
    target = tmp_path / "deep" / "t{rank}-{pid}.json"
    with pytest.raises(KeyError, match="mine"), autograd_magic.track(save=target):
        x = torch.ones(3, requires_grad=True)
        y = (x * 2).exp()
        raise KeyError("mine")
    saved = tmp_path / "deep" / f"t0-{os.getpid()}.json"
    trace, info = load_trace_file(saved)
    assert trace.error == "KeyError: 'mine'"
    assert {"MulBackward0", "ExpBackward0"} <= {n.name for n in trace.nodes}
    assert info["pid"] == os.getpid()
    del y


def test_a_failed_save_is_a_warning_never_the_users_exception(tmp_path):
    (tmp_path / "file").write_text("")
    bad = tmp_path / "file" / "t.json"
    with (
        pytest.warns(RuntimeWarning, match="could not save the trace"),
        pytest.raises(ZeroDivisionError),
        autograd_magic.track(save=bad),
    ):
        _ = 1 / 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with autograd_magic.track(save=tmp_path / "ok.json") as trace:
            leak(2)
    assert trace.finished and (tmp_path / "ok.json").exists()


def test_report_puts_ranks_side_by_side(tmp_path):
    traces = []
    for rank, steps in enumerate((2, 5)):
        with autograd_magic.track() as trace:
            x = torch.ones(4, requires_grad=True)
            kept = [(x * i).exp().sum() for i in range(steps)]
        traces.append(trace)
        run = {"rank": rank, "world_size": 2, "pid": 1, "argv": []}
        (tmp_path / f"job.{rank}.json").write_text(trace_file_text(trace, run))
        del kept
    done = tracked("report", "job.0.json", "job.1.json", "--html", "r.html", "--text", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "rank 0 (job.0.json)" in done.stdout and "rank 1 (job.1.json)" in done.stdout
    page = (tmp_path / "r.html").read_text()
    assert "Traces side by side" in page and "Findings per trace" in page
    assert "rank 0 (job.0.json)" in page and "rank 1 (job.1.json)" in page
    assert page.count("data:image/png;base64,") == 4 and "<script" not in page
    peaks = [t.peak_live_nodes for t in traces]
    assert "<td style" in page and all(f">{p:,}<" in page for p in peaks)


def test_save_trace_round_trips_through_from_json(tmp_path):
    with autograd_magic.track() as trace:
        leak(3)
    path = save_trace(trace, tmp_path / "a.json")
    again = autograd_magic.Trace.from_json(path.read_text())
    assert again.to_json() == trace.to_json()


DDP = """\
import sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(100 + rank)
losses = []
for step in range(5):
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss)
torch.save(model.module.state_dict(), f"{sys.argv[1]}/weights{rank}.pt")
dist.destroy_process_group()
"""


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Two ranks under torchrun. Launched once more when a rank died of SIGABRT: gloo aborts a
    rank now and then on a loaded 2-core machine ("terminate called without an active
    exception"), untracked runs included (seen right after the browser tests); a failure that
    comes back is reported."""
    launcher = ["-m", "torch.distributed.run", "--nproc_per_node=2"]
    done = python(*launcher, f"--master_port={free_port()}", *args, cwd=cwd)
    if done.returncode != 0 and _aborted(done.stderr):
        done = python(*launcher, f"--master_port={free_port()}", *args, cwd=cwd)
    return done


def _aborted(stderr: str) -> bool:
    return "terminate called" in stderr or "exitcode  : -6" in stderr or "SIGABRT" in stderr


@pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")
def test_torchrun_ddp_tracked_trains_the_same_and_writes_one_trace_per_rank(tmp_path):
    (tmp_path / "ddp.py").write_text(DDP)
    (tmp_path / "plain").mkdir()
    (tmp_path / "tracked").mkdir()
    plain = torchrun("ddp.py", "plain", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    run = ["-m", "autograd_magic", "run", "-o", "out/ddp{rank}.json", "ddp.py", "tracked"]
    tracked_run = torchrun(*run, cwd=tmp_path)
    assert tracked_run.returncode == 0, tracked_run.stderr[-3000:]
    for rank in (0, 1):
        a = torch.load(tmp_path / "plain" / f"weights{rank}.pt")
        b = torch.load(tmp_path / "tracked" / f"weights{rank}.pt")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ranks0 = torch.load(tmp_path / "tracked" / "weights0.pt")
    ranks1 = torch.load(tmp_path / "tracked" / "weights1.pt")
    assert all(torch.equal(ranks0[k], ranks1[k]) for k in ranks0)  # DDP kept them in step
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ddp0.json", "ddp1.json"]
    for rank in (0, 1):
        trace, info = load_trace_file(tmp_path / "out" / f"ddp{rank}.json")
        assert info["rank"] == rank and info["world_size"] == 2
        assert any("`losses` holds 5 tensors" in f.message for f in trace.findings)
    done = tracked("report", "out/ddp0.json", "out/ddp1.json", "--html", "job.html", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "job.html").read_text()
    assert "rank 0 (ddp0.json)" in page and "rank 1 (ddp1.json)" in page
    assert "Findings per trace" in page


def test_a_long_loop_report_stays_small_and_keeps_failed_backward_calls(tmp_path):
    with autograd_magic.track() as trace:
        w = torch.ones(4, requires_grad=True)
        for _ in range(60):
            (w * 2).sum().backward()
        loss = (w * 3).sum()
        loss.backward()
        with pytest.raises(RuntimeError):
            loss.backward()
    page = report_document([("loop", trace.report())])
    # The 60 calls of one line read as one sentence; the failed call keeps its own.
    assert page.count("60 backward() calls, each released no saved tensors") == 1
    assert "backward() failed with RuntimeError" in page
    assert len(page) < 200_000


def test_a_script_excepthook_formats_the_error_as_without_the_runner(tmp_path):
    hook = "import sys\nsys.excepthook = lambda t, e, tb: print('HOOK', t.__name__, e)\n"
    (tmp_path / "h.py").write_text(hook + "raise OSError('disk')\n")
    plain = python("h.py", cwd=tmp_path)
    run = tracked("run", "--quiet", "h.py", cwd=tmp_path)
    assert run.returncode == plain.returncode == 1
    assert run.stdout == plain.stdout == "HOOK OSError disk\n"


def test_an_unknown_option_of_a_command_prints_that_commands_usage(capsys):
    """`report t.json --bogus` names the report command's usage, not the top level's (issue 36,
    item 8)."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["report", "t.json", "--bogus"])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.startswith("usage: python -m autograd_magic report [-h]"), err
    assert err.rstrip().endswith("error: unrecognized arguments: --bogus"), err
