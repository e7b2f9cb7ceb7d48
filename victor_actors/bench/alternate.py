"""Before and after on this machine: run the same benchmark rows on old and new code, alternating.

    python -m victor_actors.bench.alternate --old REV [--new REV] [--rows NAMES] [--rounds K]
        [--quick] [--bench-code new|own] [--repo DIR] [--json FILE]

Two sides: ``--old`` (a git revision) and ``--new`` (a revision, or by default the working tree
of the checkout, uncommitted changes included). A revision is exported with ``git archive`` into a
temporary directory (nothing in the repository changes: no worktree, no checkout). Each round runs
every benchmark the chosen rows need once for old, then once for new (odd rounds new first, so
neither side always runs on a machine warmed by the other), each as its own process
(``python -m victor_actors.bench.<name> --json FILE``) with ``PYTHONPATH`` set to that side's tree
alone; before the rounds each side's interpreter is checked to import ``victor_actors`` from its
tree. Then one table: per row, the median over the rounds of the measured value on each side and
new / old, the range of new / old over the rounds (each round's pair ran back to back: a range
that straddles 1.0x is noise), and each side's median same-run ratio to the row's own baseline
(which cancels drift the two sides did not share).

``--rows``: comma-separated row ids of ``victor-actors bench``'s table (``apply_p50``) or benchmark
names (``sequential``: all its rows; a name that is both means the benchmark); default: issue 30's
request-path rows. ``--bench-code new`` (the default) runs this checkout's benchmark modules on both
sides, copied over the old tree's ``victor_actors/bench``, so only the runtime differs; ``own`` runs
each side's own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from victor_actors.bench._registry import BENCHMARKS
from victor_actors.bench._rows import ROWS
from victor_actors.bench._targets import evaluate

__all__ = ["DEFAULT_ROWS", "Side", "main", "pick_rows"]

DEFAULT_ROWS = (
    "apply_p50", "apply_lock", "pipeline_10", "seq_fsync", "seq_lmdb", "durable_raw", "groupcommit_sqlite",
    "simulate",
)  # fmt: skip
HERE = Path(__file__).resolve().parent  # this checkout's benchmark modules


@dataclass
class Side:
    """One side of the comparison: a label, the tree on ``PYTHONPATH``, and each run's row values."""

    label: str
    tree: Path
    described: str
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"alternate: git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def export(repo: Path, rev: str, into: Path) -> str:
    """``rev``'s files into ``into`` (``git archive``); its short commit."""
    commit = _git(repo, "rev-parse", "--short", f"{rev}^{{commit}}")
    archive = into.with_suffix(".tar")
    with open(archive, "wb") as fh:
        proc = subprocess.run(
            ["git", "-C", str(repo), "archive", "--format=tar", commit], stdout=fh, check=False
        )
    if proc.returncode != 0:
        raise SystemExit(f"alternate: git archive {rev} failed")
    into.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()
    return commit


def overlay_bench(tree: Path) -> None:
    """This checkout's benchmark modules over ``tree``'s, so both sides measure with the same code."""
    target = tree / "victor_actors" / "bench"
    target.mkdir(parents=True, exist_ok=True)
    for src in HERE.glob("*.py"):
        shutil.copy2(src, target / src.name)


def pick_rows(names: list[str]) -> list[str]:
    """Row ids from row ids and benchmark names (a benchmark: all its rows), in the table's order."""
    ids = {spec.id for spec in ROWS}
    wanted: set[str] = set()
    for name in names:
        if name in BENCHMARKS:  # a benchmark's name first: "simulate" is a benchmark and one of its rows
            wanted |= {spec.id for spec in ROWS if spec.bench == name}
        elif name in ids:
            wanted.add(name)
        else:
            raise ValueError(f"--rows: {name!r} is neither a row id nor a benchmark name; nothing was run")
    return [spec.id for spec in ROWS if spec.id in wanted]


def check_import(side: Side) -> None:
    """The side's interpreter imports ``victor_actors`` from its own tree, or the comparison is void."""
    code = "import victor_actors, sys; sys.stdout.write(victor_actors.__file__)"
    env = {**os.environ, "PYTHONPATH": str(side.tree)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    where = Path(proc.stdout.strip() or "/nonexistent").resolve()
    if proc.returncode != 0 or not where.is_relative_to(side.tree.resolve()):
        raise SystemExit(
            f"alternate: with PYTHONPATH={side.tree}, victor_actors imports from {where} "
            f"({proc.stderr.strip()[-200:]}); nothing was measured"
        )


def run_bench(side: Side, name: str, quick: bool, rows: list[str], work: Path, round_no: int) -> None:
    """One run of benchmark ``name`` on ``side``, in its own process; its rows' values appended."""
    bench = BENCHMARKS[name]
    out = work / f"{side.label}-{name}-{time.monotonic_ns()}.json"
    cmd = [sys.executable, "-m", bench.module, "--json", str(out)] + (["--quick"] if quick else [])
    env = {**os.environ, "PYTHONPATH": str(side.tree)}
    try:
        proc = subprocess.run(
            cmd, cwd=work, env=env, capture_output=True, text=True, timeout=bench.timeout, check=False
        )
    except subprocess.TimeoutExpired:
        side.failures.append(f"{name}: timed out after {bench.timeout:.0f} s")
        return
    if proc.returncode != 0 or not out.exists():
        tail = " | ".join(proc.stderr.strip().splitlines()[-2:]) or "no output on stderr"
        side.failures.append(f"{name}: exit status {proc.returncode}: {tail}")
        return
    result = json.loads(out.read_text())
    out.unlink()
    evaluated, _targets = evaluate({name: result}, {})
    for row in evaluated:
        if row["id"] in rows and row["bench"] == name:
            side.rows.setdefault(row["id"], []).append(row | {"round": round_no})


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.2f}" if abs(x) < 100 else f"{x:,.0f}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def paired(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[float]:
    """new / old of each round that measured the row on both sides (the two ran back to back)."""
    by_round = {r["round"]: r["ours"] for r in old if r["ours"]}
    return [r["ours"] / by_round[r["round"]] for r in new if r["ours"] is not None and r["round"] in by_round]


def table(old: Side, new: Side, rows: list[str]) -> tuple[str, list[dict[str, Any]]]:
    """The medians per row per side, new / old, and each side's median ratio to its baseline."""
    specs = {spec.id: spec for spec in ROWS}
    head = (
        f"{'row':<20}{'unit':<7}{'better':<7}{'old':>11}{'new':>11}{'new/old':>9}{'per round':>14}"
        f"{'old ratio':>11}{'new ratio':>11}  runs  what"
    )
    lines, out = [head, "-" * len(head)], []
    for rid in rows:
        spec = specs[rid]
        o, n = old.rows.get(rid, []), new.rows.get(rid, [])
        vo, vn = _median(o, "ours"), _median(n, "ours")
        change = vn / vo if vo and vn is not None else None
        ro, rn = _median(o, "ratio"), _median(n, "ratio")
        runs = f"{sum(r['ours'] is not None for r in o)}/{sum(r['ours'] is not None for r in n)}"
        pairs = paired(o, n)
        spread = f"{min(pairs):.2f}-{max(pairs):.2f}x" if pairs else "-"
        lines.append(
            f"{rid:<20}{spec.unit:<7}{spec.better:<7}{_num(vo):>11}{_num(vn):>11}{_ratio(change):>9}{spread:>14}"
            f"{_ratio(ro):>11}{_ratio(rn):>11}  {runs:<5} {spec.what}"
        )
        notes = {r["note"] for r in o + n if r["ours"] is None and r["note"]}
        lines += [f"{'':<20}(no value: {note})" for note in sorted(notes)]
        out.append({"id": rid, "bench": spec.bench, "unit": spec.unit, "better": spec.better,
                    "old": vo, "new": vn, "new_over_old": change, "per_round": pairs, "old_ratio": ro,
                    "new_ratio": rn,
                    "old_runs": o, "new_runs": n})  # fmt: skip
    return "\n".join(lines), out


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m victor_actors.bench.alternate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--old", required=True, metavar="REV", help="the old side: a git revision")
    p.add_argument("--new", metavar="REV", help="the new side: a git revision (default: the working tree)")
    p.add_argument("--rows", action="append", metavar="NAMES", help="row ids or benchmark names")
    p.add_argument("--rounds", type=int, default=3, help="rounds, each old and new once (default 3)")
    p.add_argument("--quick", action="store_true", help="each benchmark's --quick (a smoke run)")
    code = "whose benchmark modules: this checkout's on both sides (default), or each side's own"
    p.add_argument("--bench-code", choices=("new", "own"), default="new", help=code)
    p.add_argument("--repo", help="the git checkout (default: the one this package comes from, or the cwd)")
    p.add_argument("--json", metavar="FILE", help="write every run's rows and the medians as JSON")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    return args


def _repo(given: str | None) -> Path:
    if given:
        return Path(_git(Path(given), "rev-parse", "--show-toplevel"))
    from victor_actors.bench._machine import source_checkout

    return source_checkout() or Path(_git(Path.cwd(), "rev-parse", "--show-toplevel"))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        rows = pick_rows(
            [n for chunk in (args.rows or [",".join(DEFAULT_ROWS)]) for n in chunk.split(",") if n]
        )
    except ValueError as exc:
        print(f"alternate: error: {exc}", file=sys.stderr)
        return 2
    specs = {spec.id: spec for spec in ROWS}
    benches = list(dict.fromkeys(specs[r].bench for r in rows))
    repo = _repo(args.repo)
    with tempfile.TemporaryDirectory(prefix="victor-actors-alternate-") as tmp:
        work = Path(tmp)
        old_tree = work / "old"
        old_commit = export(repo, args.old, old_tree)
        old = Side("old", old_tree, f"{args.old} ({old_commit}), git archive")
        if args.new:
            new_tree = work / "new"
            new_commit = export(repo, args.new, new_tree)
            new = Side("new", new_tree, f"{args.new} ({new_commit}), git archive")
        else:
            dirty = " + uncommitted changes" if _git(repo, "status", "--porcelain") else ""
            head = _git(repo, "rev-parse", "--short", "HEAD")
            new = Side("new", repo, f"the working tree {repo} ({head}{dirty})")
        for side in (old, new):
            if args.bench_code == "new" and side.tree != repo:
                overlay_bench(side.tree)
            check_import(side)
        print(f"old: {old.described}\nnew: {new.described}")
        print(
            f"rows: {', '.join(rows)}\nbenchmarks: {', '.join(benches)}; {args.rounds} round(s), "
            f"{'quick' if args.quick else 'default'} mode; benchmark code: "
            f"{'this checkout on both sides' if args.bench_code == 'new' else 'each side its own'}",
            flush=True,
        )
        started = time.perf_counter()
        for r in range(args.rounds):
            order = (old, new) if r % 2 == 0 else (new, old)
            for name in benches:
                for side in order:
                    print(f"  round {r + 1}/{args.rounds}: {name} on {side.label} ...", flush=True)
                    run_bench(side, name, args.quick, rows, work, r)
        text, medians = table(old, new, rows)
    wall = time.perf_counter() - started
    print(f"\nmedians over {args.rounds} round(s) (new/old: of the measured values; ratio: to the row's own "
          f"same-run baseline)\n{text}")  # fmt: skip
    for side in (old, new):
        for failure in side.failures:
            print(f"FAILED on {side.label}: {failure}")
    print(f"\nwall time {wall:.1f} s")
    if args.json:
        doc = {"old": old.described, "new": new.described, "rounds": args.rounds, "quick": args.quick,
               "bench_code": args.bench_code, "rows": medians,
               "failures": {"old": old.failures, "new": new.failures}}  # fmt: skip
        Path(args.json).write_text(json.dumps(doc, indent=1), encoding="utf-8")
        print(f"wrote {args.json}")
    return 1 if old.failures or new.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
