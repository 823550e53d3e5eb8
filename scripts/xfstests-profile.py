#!/usr/bin/env python3
"""Sums an xtrace of xfstests' ./check by phase (tests/vm/xfstests.sh, ZONEDD_VM_XFSTESTS_TRACE).

    scripts/xfstests-profile.py target/vm/runs/xfstests/trace-baseline [N]

Each trace line is `+... STAMP FILE:LINE FUNC COMMAND` (PS4 of the scenario). A line's time is the
gap to the next line: for an external command that is its run time, for a shell builtin a few
microseconds. Prints (1) the statements of ./check itself (its main level and run_section, the
per-test loop) with their inclusive time, the phases: start-up, each test, the post-test checks;
(2) the N commands that took longest in all, summed by command name; (3) how many lines (about
how many commands, forks included) each function ran.
"""
import collections
import re
import sys

LINE = re.compile(r"^(\++)(\d+\.\d+) (\S*):(\d+) (\S*) ?(.*)$")


def parse(path):
    rows = []
    with open(path, errors="replace") as f:
        for raw in f:
            m = LINE.match(raw.rstrip("\n"))
            if m:
                depth, stamp, src, line, func, cmd = m.groups()
                rows.append((len(depth), float(stamp), src, int(line), func, cmd))
    return rows


def main():
    path = sys.argv[1]
    top_n = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    rows = parse(path)
    if not rows:
        sys.exit(f"{path}: no trace lines")
    end = rows[-1][1]
    print(f"{path}: {len(rows)} lines, {end - rows[0][1]:.1f} s traced")

    # (1) ./check's own statements, inclusive: up to its next statement.
    own = [i for i, r in enumerate(rows) if r[2] == "check" and r[4] in ("source", "main", "run_section", "")]
    incl = collections.defaultdict(lambda: [0, 0.0, ""])
    for k, i in enumerate(own):
        t1 = rows[own[k + 1]][1] if k + 1 < len(own) else end
        key = rows[i][3]
        incl[key][0] += 1
        incl[key][1] += t1 - rows[i][1]
        incl[key][2] = incl[key][2] or rows[i][5][:90]
    print("\n./check statements, inclusive seconds (line: count, total, first command):")
    for line, (n, t, cmd) in sorted(incl.items(), key=lambda kv: -kv[1][1])[:top_n]:
        print(f"  check:{line:<5} {n:4d}x {t:8.1f} s  {cmd}")

    # Start-up: from the first line to the first test's start.
    first = next((r[1] for r in rows if r[4] == "run_section" and "_run_seq" in r[5]), None)
    if first is not None:
        print(f"\nstart-up (first line to the first _run_seq): {first - rows[0][1]:.1f} s")

    # (2) gaps by command name (external commands: their run time).
    by_cmd = collections.defaultdict(lambda: [0, 0.0])
    for i, r in enumerate(rows):
        t1 = rows[i + 1][1] if i + 1 < len(rows) else end
        word = r[5].split(" ", 1)[0] if r[5] else "?"
        by_cmd[word][0] += 1
        by_cmd[word][1] += t1 - r[1]
    print("\ncommands by total gap to the next line (count, seconds):")
    for word, (n, t) in sorted(by_cmd.items(), key=lambda kv: -kv[1][1])[:top_n]:
        print(f"  {word[:40]:<40} {n:6d}x {t:8.1f} s")

    # (3) lines and gap time per function (self time).
    by_func = collections.defaultdict(lambda: [0, 0.0])
    for i, r in enumerate(rows):
        t1 = rows[i + 1][1] if i + 1 < len(rows) else end
        by_func[f"{r[2]}:{r[4]}"][0] += 1
        by_func[f"{r[2]}:{r[4]}"][1] += t1 - r[1]
    print("\nfunctions by self time (lines, seconds):")
    for fn, (n, t) in sorted(by_func.items(), key=lambda kv: -kv[1][1])[:top_n]:
        print(f"  {fn[:40]:<40} {n:6d}x {t:8.1f} s")


if __name__ == "__main__":
    main()
