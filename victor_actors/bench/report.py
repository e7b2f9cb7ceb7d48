"""Turn the JSON of ``victor-actors bench --json FILE`` into a report: markdown and figures.

    python -m victor_actors.bench.report FILE [--out DIR] [--force]

Writes DIR/benchmarks.md: the machine, the targets of the benchmarks that ran with the measured
value and MET or MISSED (with a one-line why for each miss, from the numbers), every row of the
run's table, and every value each benchmark wrote to its JSON. With matplotlib (the ``bench``
extra) it also draws one figure per question (``_plots``: the cost of one request, commits per
second as requests in flight grow, bytes on disk as a conversation grows, the LangGraph savers
side by side, ...), each with the values themselves; without it the markdown says the figures need
matplotlib.

DIR defaults to a new directory beside FILE (``bench.json`` -> ``bench-report/``), or, when that
would be inside the source checkout, the same name under the system's temporary directory: the
report never lands in a checkout unless ``--out`` says so. The committed ``docs/benchmarks.md``
is written only with ``--out docs``, and a quick run (noisy numbers) never replaces a report of a
full run there without ``--force``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from victor_actors.bench._machine import default_out
from victor_actors.bench._plots import FIGURES, Figure, draw
from victor_actors.bench._registry import BENCHMARKS, INSTALL_HINT
from victor_actors.bench._table import fmt_ratio as ratio
from victor_actors.bench._table import fmt_value as value

MD_NAME = "benchmarks.md"
OLD_PNG = "benchmarks.png"  # the single plot reports had before their figures
KEPT_MARKER = "<!-- notes below are hand-written; victor_actors.bench.report keeps them -->"
NO_PLOT = f"The figures need matplotlib ({INSTALL_HINT}); none were drawn for this report."
SKIP_KEYS = {"meta", "stdout", "stderr"}


# -- formatting ---------------------------------------------------------------------------------------


def cell(value: Any) -> str:
    """A markdown table cell: numbers formatted, pipes escaped."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def md_table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> list[str]:
    head = list(header)
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return out


# -- every value of a benchmark's JSON ---------------------------------------------------------------


def scalar(v: Any) -> bool:
    return v is None or isinstance(v, (int, float, str, bool))


def render(name: str, obj: Any, depth: int = 0) -> list[str]:
    """Markdown tables of every value in ``obj`` (a benchmark's JSON), nested dicts as sub-sections."""
    lines: list[str] = []
    title = f"{'#' * min(3 + depth, 6)} {name}" if name else ""
    if isinstance(obj, dict):
        flat = {k: v for k, v in obj.items() if scalar(v) and k not in SKIP_KEYS}
        nested = {k: v for k, v in obj.items() if not scalar(v) and k not in SKIP_KEYS}
        records = {
            k: v for k, v in nested.items() if isinstance(v, dict) and all(scalar(x) for x in v.values())
        }
        if title and (flat or nested):
            lines += [title, ""]
        if flat:
            lines += [*md_table(["key", "value"], flat.items()), ""]
        if len(records) >= 2 and len(records) == len(nested):  # a table: one row per key
            cols: list[str] = []
            for rec in records.values():
                cols += [c for c in rec if c not in cols]
            rows = [[k, *(rec.get(c) for c in cols)] for k, rec in records.items()]
            lines += [*md_table(["", *cols], rows), ""]
            return lines
        for k, v in nested.items():
            lines += render(f"{name} / {k}" if name else str(k), v, depth + 1)
        return lines
    if isinstance(obj, list):
        if all(scalar(x) for x in obj):
            return [title, "", ", ".join(cell(x) for x in obj), ""] if title else []
        for i, item in enumerate(obj):
            lines += render(f"{name} [{i}]", item, depth + 1)
        return lines
    return [title, "", cell(obj), ""] if title else []


# -- the report -------------------------------------------------------------------------------------------


def machine_lines(meta: dict[str, Any]) -> list[str]:
    mem = meta.get("memory_bytes")
    rows = [
        ("CPU", meta.get("cpu_model") or platform.processor() or "unknown"),
        ("cores", f"{meta.get('cpus_usable')} usable of {meta.get('cpus', os.cpu_count())}"),
        ("memory", f"{mem / 2**30:.1f} GiB" if mem else "unknown"),
        ("platform", meta.get("platform", platform.platform())),
        ("Python", meta.get("python", platform.python_version())),
        ("date", meta.get("date", "unknown")),
        ("load average (1, 5, 15 min) at start", meta.get("load_average_start")),
        ("load average at end", meta.get("load_average_end")),
        ("git commit", meta.get("git_commit")),
    ]
    rows += [(f"package {name}", v or "not installed") for name, v in (meta.get("packages") or {}).items()]
    return md_table(["", ""], [(k, ", ".join(map(str, v)) if isinstance(v, list) else v) for k, v in rows])


def ran(doc: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows and targets of the benchmarks this run selected (a JSON written before the runner
    kept only those may hold every benchmark's, the others marked "not selected")."""
    benches = doc["benchmarks"]
    return (
        [r for r in doc["rows"] if r["bench"] in benches],
        [t for t in doc["targets"] if t["bench"] in benches],
    )


def build(doc: dict[str, Any], figures: list[Figure] | str, source: str) -> str:
    """The markdown; ``figures``: those drawn (their files beside it), or why there are none."""
    meta, benches = doc["meta"], doc["benchmarks"]
    rows, targets = ran(doc)
    counts = {v: sum(1 for t in targets if t["verdict"] == v) for v in ("MET", "MISSED", "NOT RUN")}
    summary = ", ".join(f"{n} {v}" for v, n in counts.items() if n or v != "NOT RUN") or "none"
    defaults = [name for name, b in BENCHMARKS.items() if b.default]
    extra = [name for name, b in BENCHMARKS.items() if not b.default]
    out = [
        "# Benchmarks",
        "",
        f"Generated by `python -m victor_actors.bench.report {source}` from the JSON of "
        f"`victor-actors bench{' --quick' if doc['mode'] == 'quick' else ''} --json {source}` "
        f"({doc['mode']} mode, wall time {doc['wall_seconds']:.0f} s). Each benchmark ran in its own fresh "
        "process; every ratio compares ours with a baseline measured in the same process and run, in "
        "interleaved rounds with gc off while timed, so drift on a shared machine hits both sides. "
        "The targets are benchmarks, never timed tests: a miss is reported here, not failed.",
        "",
        f"**Targets: {summary}.**",
        "",
        "## Targets",
        "",
    ]
    target_rows = [(t["target"], ratio(t["measured"]), t["verdict"], t["why"]) for t in targets]
    out += md_table(["target", "measured", "verdict", "why (misses, from this run's numbers)"], target_rows)
    out += ["", "## Figures", ""]
    if isinstance(figures, str):
        out += [figures, ""]
    elif not figures:
        out += ["None: no benchmark of this run has a figure.", ""]
    for figure in figures if not isinstance(figures, str) else ():
        out += [f"### {figure.question}", "", f"![{figure.question}]({figure.file})", "", figure.caption, ""]
    out += ["## Measured values", "", "Ratio = ours / baseline; each row says which way is better.", ""]
    table_rows = []
    for r in rows:
        if r["ratio"] is None:
            table_rows.append((r["bench"], r["what"], "-", "-", "-", r["better"], r["note"]))
        else:
            ours, base = value(r["ours"], r["unit"]), value(r["baseline"], r["unit"])
            table_rows.append((r["bench"], r["what"], ours, base, ratio(r["ratio"]), r["better"], r["note"]))
    out += [*md_table(["bench", "what", "ours", "baseline", "ratio", "better", "note"], table_rows), ""]
    out += ["## Benchmarks run", ""]
    run_rows = [
        (
            name,
            f"`{b.get('module') or b.get('script')}`",
            b["status"],
            f"{b.get('seconds', 0.0):.1f} s",
            b["about"],
            b.get("reason", ""),
        )
        for name, b in benches.items()
    ]
    out += [*md_table(["name", "module", "status", "wall", "measures", "reason"], run_rows), ""]
    out += ["## Machine", "", *machine_lines(meta), ""]
    out += [
        "## How to read it",
        "",
        "- apply and aapply: one call at a time, building the batch included (the benchmark also times "
        "the apply call alone); the baseline is a bare pykka `ask` to an echo actor, and beside it a "
        "plain `threading.Lock` plus one dict update on the caller's thread. A latency measured with "
        "one caller runs with the whole process (the caller and every thread it starts) pinned to one "
        "CPU (`os.sched_setaffinity`); each such row's note says so, and a row measured on many "
        "threads says it is not pinned.",
        "- one durable scope, sequential (`sequential`): one `add_message` at a time, `sync` "
        "durability, pinned; against one `pwrite` plus `fdatasync` of as many bytes as one commit "
        "hands the store, on a preallocated file in the same directory (the physical floor), and "
        "against one bare synced LMDB transaction of one value that size.",
        "- `simulate`: `victor-actors simulate`'s own commits per second (acknowledged commits over "
        "the load's wall time) on a fixed workload (16 agents, a fixed number of turns each, seed 7), "
        "`sync` against `async` durability, with the default faults and without any.",
        "- pipelined apply: a burst of `aapply` calls all in flight on one scope (asyncio), against "
        "`tell`s to a bare pykka actor drained by one `ask`; flat means the rate at 100,000 keys is "
        "at least 0.9x the rate at 10 keys (the issue gives no number; this is our reading).",
        "- durable commits: `sync` durability (on disk before the call returns), one ~200-character "
        "message per commit, against SqliteSaver putting the whole conversation so far, as LangGraph "
        "does every step; 100 scopes share LMDB write transactions (group commit).",
        "- storage: the LMDB file (`data.mdb`) after a 1,000-step conversation and closing, against "
        "the final state encoded as the store encodes a checkpoint (msgpack + zstd); the rows beside "
        "it give the scope's own records and the plain msgpack state as other denominators.",
        "- start-up: N new conversation scopes (one actor thread each) on an in-memory manager, "
        "against N bare pykka actors, each size in a fresh process; lower is better.",
        "- virtual scopes (`virtual`, issue 14; not in the default set): 1,000,000 conversations "
        "created and committed once each by 64 asyncio tasks on a store-backed manager with "
        "`max_live_actors=2000`, in `async` and then `sync` durability, each in a fresh process; "
        "memory is anonymous memory (`RssAnon`, after `passivate_idle(0)` and gc; LMDB's mapped "
        "pages count in RSS, not here) per evicted conversation, against one kept live without a "
        "store; creation rates against an in-memory manager with the same cap and driver; 100,000 "
        "random touches (nearly all reactivations) against as many over 2,000 live conversations. "
        "Its absolute targets (300 B, 5,000/s, 2,000/s, 300 us, 3 ms, 100 ms) show the measured "
        "value over the bound, the row beside it its same-run baseline. The issue's 8,500 B per "
        "passivated conversation for the code before eviction is quoted, not measured.",
        "- one state, many processes (`remote`, issue 23): the benchmark starts an owner process in "
        "memory and one on an LMDB store with `sync` durability (what a deployment runs), each "
        '`GlobalStateManager.open(path, listen="unix://...")`, and four client processes connected '
        "to both. The load is 10,000 one-message commits from 1,000 `aapply` in flight over 100 fresh "
        "conversations; the baseline is the owner process running that load on its own handles; from "
        "4 clients each runs a quarter, released together on a barrier, and the rate is all commits "
        "over the wall time from the first send to the last reply. `apply` p50 is one call at a time "
        "from one client against the owner's own `apply`; the p50 target is ours / (the owner's + "
        "150 us). The owner's CPU per commit is its `/proc` user + system time over the timed window.",
        "",
        "## Running them",
        "",
        "```",
        f"{INSTALL_HINT}    # LangGraph, its SQLite and LMDB savers, matplotlib",
        "victor-actors bench [--quick] [--only core,store] [--json FILE]",
        "python -m victor_actors.bench.report FILE [--out DIR]      # this page and its figures",
        "python -m victor_actors.bench.core [--quick] [--json FILE]  # one benchmark on its own",
        "python -m victor_actors.bench.alternate --old REV [--rows NAMES] [--rounds K]  # before/after",
        "```",
        "",
        "The benchmarks are modules of the installed package (`victor_actors.bench.<name>`), each run "
        f"in its own fresh process: {_names(defaults)} by default, and {_names(extra)} when named in "
        "`--only`. Without the bench extra, `store`, `agent` and `groupcommit` still measure ours and "
        "leave the rows whose baseline is LangGraph without a ratio (each says why), and `langgraph` "
        "and `otel` are skipped. `--quick` is a smoke run, seconds to a minute per benchmark: its "
        "numbers are noisy. A report is written beside its JSON (`FILE-report/`), never into a "
        "checkout unless `--out` names the directory. `alternate` runs chosen rows on two revisions "
        "(the old one exported with `git archive`, the new one by default the working tree), old and "
        "new in turn, each in its own process, and prints the medians per side and new / old.",
        "",
        "## Every value each benchmark wrote",
        "",
    ]
    for name, b in benches.items():
        out += [f"### {name}", ""]
        if b["status"] != "ok":
            out += [f"{b['status']}: {b.get('reason', '')}", ""]
            continue
        out += render("", b["result"])
        if b.get("stdout"):
            out += ["<details><summary>the benchmark's own output</summary>", "", "```text"]
            out += [b["stdout"].rstrip(), "```", "", "</details>", ""]
    return "\n".join(out).rstrip() + "\n"


def _names(names: list[str]) -> str:
    quoted = [f"`{n}`" for n in names]
    return ", ".join(quoted[:-1]) + f" and {quoted[-1]}" if len(quoted) > 1 else "".join(quoted)


def _replaces_a_full_run(md: Path, doc: dict[str, Any]) -> bool:
    """Whether writing this quick run to ``md`` would replace the report of a full (default mode) run."""
    if doc.get("mode") != "quick" or not md.exists():
        return False
    head = md.read_text(encoding="utf-8")[:2000]
    return "(default mode," in head


def write(doc: dict[str, Any], out_dir: Path, source: str) -> tuple[Path, list[Figure] | str]:
    """Write the markdown and the figures into ``out_dir``; the markdown's path, and the figures drawn
    (or why there are none). Figures and a plot of an earlier report that this one does not draw
    are removed (they would not match it); hand-written notes below :data:`KEPT_MARKER` stay."""
    out_dir.mkdir(parents=True, exist_ok=True)
    subtitle = (
        f"{doc['meta'].get('cpu_model', '')}, {str(doc['meta'].get('date', ''))[:10]}, {doc['mode']} mode"
    )
    figures: list[Figure] | str
    try:
        figures = draw(doc, out_dir, subtitle)
    except ImportError:
        figures = NO_PLOT
    drawn = set() if isinstance(figures, str) else {f.file for f in figures}
    for name in [OLD_PNG, *(f.file for f in FIGURES)]:
        if name not in drawn and (out_dir / name).exists():
            (out_dir / name).unlink()
    md = out_dir / MD_NAME
    kept = ""
    if md.exists():  # hand-written notes below the marker survive a regeneration
        old = md.read_text(encoding="utf-8")
        at = old.find(KEPT_MARKER)
        if at >= 0:
            kept = "\n" + old[at:]
    md.write_text(build(doc, figures, source) + kept, encoding="utf-8")
    return md, figures


def main(argv: list[str] | None = None) -> int:
    """Write the report; 0 once written, 2 when FILE is not a bench run's JSON or the report is refused."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json_file", metavar="FILE", help="written by victor-actors bench --json FILE")
    ap.add_argument(
        "--out",
        metavar="DIR",
        help="where to write (default: FILE-report/ beside FILE, outside any source checkout)",
    )
    ap.add_argument(
        "--force", action="store_true", help="let a quick run replace the report of a full run in DIR"
    )
    args = ap.parse_args(argv)
    try:
        with open(args.json_file, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        print(f"victor-actors: error: {args.json_file}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(doc, dict) or not {"targets", "rows", "benchmarks", "meta", "mode"} <= doc.keys():
        print(
            f"victor-actors: error: {args.json_file}: not the JSON of victor-actors bench --json",
            file=sys.stderr,
        )
        return 2
    out_dir = Path(args.out) if args.out else default_out(args.json_file)
    if not args.force and _replaces_a_full_run(out_dir / MD_NAME, doc):
        print(
            f"victor-actors: error: {out_dir / MD_NAME} holds the report of a full run; a quick run's noisy "
            "numbers would replace it (nothing was written; --force writes it anyway)",
            file=sys.stderr,
        )
        return 2
    source = args.json_file if not args.out else f"{args.json_file} --out {args.out}"
    md, figures = write(doc, out_dir, source)
    if isinstance(figures, str):
        print(f"wrote {md}\n{figures}")
    else:
        print(f"wrote {md}" + "".join(f"\n  and {out_dir / f.file}" for f in figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
