"""What the local cluster records when Slurm cannot end a step (its node is then drained "Kill task failed"):
the program slurmstepd runs after UnkillableStepTimeout, and the part of its report that names the step's
leftovers."""

from __future__ import annotations

# slurmstepd runs this when a step's processes outlive SIGKILL for UnkillableStepTimeout, before Slurm drains
# the node ("Kill task failed"): every process, the kernel stack of each thread in D or Z state, where
# the slurmstepd's own threads wait (the step may be stuck in slurmstepd rather than in its tasks), and who
# else holds slurmstepd's pipes (it waits for the tasks' output until every writer closed it).
UNKILLABLE_STEP_PROGRAM = """#!/bin/sh
out=@LOG_DIR@/"unkillable-${SLURM_JOB_ID:-job}.${SLURM_STEP_ID:-step}.$$.txt"
{
    echo "job ${SLURM_JOB_ID:-?} step ${SLURM_STEP_ID:-?}, slurmstepd $PPID, $(date '+%Y-%m-%dT%H:%M:%S')"
    ps -eo pid,ppid,pgid,nlwp,stat,wchan:32,etimes,args --forest
    for dir in /proc/[0-9]*/task/[0-9]*; do
        state=$(sed 's/.*) //' "$dir/stat" 2>/dev/null | cut -d' ' -f1)
        case "$state" in
            D|Z) pid=${dir#/proc/}; pid=${pid%%/*}
                 echo "== $pid thread ${dir##*/} $state: $(tr '\\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null)"
                 cat "$dir/stack" 2>/dev/null ;;
        esac
    done
    for dir in /proc/$PPID/task/[0-9]*; do  # slurmstepd itself: where each of its threads waits
        echo "== slurmstepd $PPID thread ${dir##*/} $(cat "$dir/wchan" 2>/dev/null)"
        cat "$dir/stack" 2>/dev/null
    done
    # slurmstepd waits for its tasks' output until every writer closed the pipe: anyone else who holds
    # one (an orphan outside the step's process tree) keeps the step from ending.
    pipes=" $(find /proc/$PPID/fd -lname 'pipe:*' -printf '%l ' 2>/dev/null)"
    find /proc/[0-9]*/fd -lname 'pipe:*' -printf '%h %l\\n' 2>/dev/null | while read -r dir pipe; do
        pid=${dir#/proc/}; pid=${pid%%/*}
        case "$pipes" in
            *" $pipe "*) [ "$pid" = "$PPID" ] ||
                echo "== $pipe of slurmstepd also held by $pid: $(tr '\\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null)" ;;
        esac
    done
} > "$out" 2>&1
"""


def summarize(report: str) -> list[str]:
    """The report's first line, the slurmstepd's subtree of the process list, and the threads' stacks."""
    lines = report.splitlines()
    if len(lines) < 2 or "COMMAND" not in lines[1]:
        return lines[:1]
    stepd = lines[0].split("slurmstepd ", 1)[-1].split(",", 1)[0]
    column = lines[1].index("COMMAND")  # ps aligns its columns: the tree's indentation starts here

    def depth(line: str) -> int:
        args = line[column:]
        return len(args) - len(args.lstrip(" \\_|"))

    stacks = next((i for i, line in enumerate(lines) if line.startswith("== ")), len(lines))
    subtree: list[str] = []
    for line in lines[2:stacks]:
        if subtree and depth(line) <= depth(subtree[0]):
            break
        if subtree or line.split(None, 1)[:1] == [stepd]:
            subtree.append(line)
    return [lines[0], *subtree, *lines[stacks:]]


def report_step(name: str) -> tuple[str, str]:
    """The job and step a report (`unkillable-<job>.<step>.<pid>.txt`) is about."""
    job, step = name.removeprefix("unkillable-").split(".")[:2]
    return job, step


def step_log(slurmd_log: str, job: str, step: str, last: int = 40) -> list[str]:
    """The last lines slurmstepd logged for `job.step` in a node's slurmd log, if it gave up on it there:
    at debug2 they say how far the step's teardown got (its output, the task exit and completion messages)."""
    tag = f"[{job}.{step}]"
    lines = [line for line in slurmd_log.splitlines() if tag in line]
    if not any("STEPD TERMINATED" in line for line in lines):
        return []
    return lines[-last:]
