"""`bench overhead`'s plan and summary: the order its runs take, the figures of the modes that ran, and
the command's one-line errors. (The timed runs themselves are the benchmark, not a test.)"""

from __future__ import annotations

import pytest

from slurm_elastic.cli import build_parser
from slurm_elastic.showcase.bench.overhead import MODES, SIZES, WORKLOADS, Run, _summary, run_order


def test_repeats_run_the_modes_forward_then_backward() -> None:
    orders = [run_order(MODES, rep) for rep in range(4)]
    assert orders[0] == orders[2] == MODES and orders[1] == orders[3] == tuple(reversed(MODES))
    # Over two repeats each mode runs once before and once after each other mode.
    for a in MODES:
        for b in MODES:
            if a != b:
                assert sorted(o.index(a) < o.index(b) for o in orders[:2]) == [False, True]


def runs(modes: tuple[str, ...], step: dict[str, list[float]]) -> dict[str, list[Run]]:
    return {
        m: [Run(s, 100.0 + i, 1000, 0.5 if m == "elastic_fsdp" else 0.25) for i, s in enumerate(step[m])] for m in modes
    }


def test_a_sharded_only_run_reports_the_sharded_figures_alone() -> None:
    got = _summary(SIZES[0], runs(WORKLOADS["fsdp"], {"fsdp": [1.0, 3.0, 2.0], "elastic_fsdp": [2.2, 2.1, 9.0]}))
    assert got["ratio_fsdp"] == 1.1 and got["fsdp_step_s"] == 2.0 and got["elastic_fsdp_step_s"] == 2.2
    assert got["rss_ratio_fsdp"] == 1.0 and got["optimizer_state_fraction_fsdp"] == 0.5
    assert got["fsdp_step_s_runs"] == [1.0, 3.0, 2.0] and got["params"] == 1000
    assert not any(k.startswith(("ddp", "fast", "exact", "ratio_fast", "ratio_exact")) for k in got), got


def test_a_full_run_reports_both_comparisons() -> None:
    step = {"ddp": [1.0], "float32": [0.9], "float64": [1.2], "fsdp": [2.0], "elastic_fsdp": [2.1]}
    got = _summary(SIZES[1], runs(MODES, step))
    assert (got["ratio_fast"], got["ratio_exact"], got["ratio_fsdp"]) == (0.9, 1.2, 1.05)
    assert set(WORKLOADS["ddp"]) | set(WORKLOADS["fsdp"]) == set(MODES)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--sizes", "huge"], "--sizes 'huge': expected a comma-separated list of small, medium, large"),
        (["--repeats", "0"], "--repeats 0: expected an integer >= 1"),
        (["--mode", "zero"], "argument --mode: invalid choice: 'zero'"),
    ],
)
def test_bad_arguments_are_one_line_errors(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    # The command's own function, not cli.main: that would bind the process's logging to pytest's stderr.
    try:
        args = build_parser().parse_args(["bench", "overhead", *argv])
        code = args.func(args)
    except SystemExit as exc:  # argparse's own check of a choice
        code = int(exc.code or 0)
    assert code == 2
    assert says in capsys.readouterr().err
