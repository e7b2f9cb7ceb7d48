"""The terminal report of one ``victor-actors bench`` run, and the number formats it shares with the docs."""

from __future__ import annotations

from typing import Any

__all__ = ["fmt_ratio", "fmt_value", "print_rows", "print_targets", "table"]


def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "us":
        return f"{value:,.2f} us"
    if unit == "s":
        return f"{value:,.3f} s"
    if unit == "B":
        return f"{value:,.0f} B"
    return f"{value:,.0f} {unit}"


def fmt_ratio(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 0.1:
        return f"{value:.2g}x"
    return f"{value:.2f}x" if value < 100 else f"{value:,.0f}x"


def table(doc: dict[str, Any]) -> str:
    """The terminal report of one ``bench`` run: the benchmarks selected, and only their rows and targets.

    A benchmark that was skipped or failed shows its reason once, under its name, not a line per row.
    """
    lines: list[str] = []
    meta = doc["meta"]
    mem = meta.get("memory_bytes")
    memory = f"{mem / 2**30:.1f} GiB" if mem else "memory unknown"
    lines.append(
        f"machine: {meta['cpu_model']}, {meta['cpus_usable']} usable of {meta['cpus']} CPUs, {memory}, "
        f"{meta['python']}; load average at start {meta.get('load_average_start')}"
    )
    lines.append("")
    lines.append(f"{'BENCHMARK':<13}{'STATUS':<9}{'WALL':>9}  ABOUT")
    for name, b in doc["benchmarks"].items():
        wall = f"{b.get('seconds', 0.0):.1f} s"
        lines.append(f"{name:<13}{b['status']:<9}{wall:>9}  {b['about']}")
        if b["status"] != "ok":
            lines.append(f"{'':<22}  {b['reason']}")
    ran = {name for name, b in doc["benchmarks"].items() if b["status"] == "ok"}
    rows = [r for r in doc["rows"] if r["bench"] in ran]
    if rows:
        lines.append("")
        w = max(len(r["what"]) for r in rows) + 2
        lines.append(
            f"{'MEASURED (same run; ratio = ours / baseline)':<{w}}{'OURS':>17}{'BASELINE':>17}{'RATIO':>9}"
        )
        bench = None
        for r in rows:
            if r["bench"] != bench:
                bench = r["bench"]
                lines.append(f"[{bench}]")
            if r["ratio"] is None:
                lines.append(f"{r['what']:<{w}}{'-':>17}{'-':>17}{'-':>9}  {r['note']}")
                continue
            ours, base = fmt_value(r["ours"], r["unit"]), fmt_value(r["baseline"], r["unit"])
            lines.append(f"{r['what']:<{w}}{ours:>17}{base:>17}{fmt_ratio(r['ratio']):>9}  {r['note']}")
    targets = [t for t in doc["targets"] if t["bench"] in ran]
    if targets:
        lines.append("")
        tw = max(len(t["target"]) for t in targets) + 2
        lines.append(f"{'TARGET':<{tw}}{'MEASURED':>10}  VERDICT")
        for t in targets:
            lines.append(f"{t['target']:<{tw}}{fmt_ratio(t['measured']):>10}  {t['verdict']}")
            if t["why"] and t["verdict"] == "MISSED":
                lines.append(f"    why: {t['why']}")
            elif t["why"]:
                lines[-1] += f"  ({t['why']})"
    counts = {v: sum(1 for t in doc["targets"] if t["verdict"] == v) for v in ("MET", "MISSED", "NOT RUN")}
    summary = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    if summary:
        not_run = counts["NOT RUN"]
        note = " (of benchmarks that were skipped or failed, above)" if not_run else ""
        lines.append(f"targets: {summary}{note}")
    return "\n".join(lines)


def print_rows(bench: str, result: dict[str, Any], quoted: dict[str, Any] | None = None) -> None:
    """Print one benchmark's rows (ours, baseline, ratio, note), from its own run's result."""
    from victor_actors.bench._targets import evaluate

    rows, _ = evaluate({bench: result}, {})
    rows = [r for r in rows if r["bench"] == bench]
    w = max(len(r["what"]) for r in rows) + 2
    print(f"\n{'MEASURED (same run; ratio = ours / baseline)':<{w}}{'OURS':>17}{'BASELINE':>17}{'RATIO':>9}")
    for r in rows:
        ours, base = fmt_value(r["ours"], r["unit"]), fmt_value(r["baseline"], r["unit"])
        print(f"{r['what']:<{w}}{ours:>17}{base:>17}{fmt_ratio(r['ratio']):>9}  {r['note']}")
    if quoted is not None:
        print(f"{'  quoted, not measured: ' + quoted['what']:<{w}}{fmt_value(quoted['bytes'], 'B'):>17}")


def print_targets(bench: str, result: dict[str, Any]) -> None:
    """Print one benchmark's targets with their verdicts and, for a miss, why."""
    from victor_actors.bench._targets import evaluate

    _, targets = evaluate({bench: result}, {})
    targets = [t for t in targets if t["bench"] == bench]
    tw = max(len(t["target"]) for t in targets) + 2
    print(f"\n{'TARGET':<{tw}}{'MEASURED':>10}  VERDICT")
    for t in targets:
        print(f"{t['target']:<{tw}}{fmt_ratio(t['measured']):>10}  {t['verdict']}")
        if t["why"]:
            print(f"    why: {t['why']}")
