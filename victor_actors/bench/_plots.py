"""The figures of a benchmark report: one figure per question a reader asks, drawn from the run's JSON.

Each figure answers one question with the measured values themselves (commits per second, microseconds,
bytes), ours beside the peers measured in the same run, never a ratio on a log axis:

- ``bench-latency.png``: what does one request cost, at the median and at p99? (``core``)
- ``bench-concurrency.png``: how many commits per second, as requests in flight grow, durable and in
  memory, against SqliteSaver and a bare synced LMDB transaction? (``store``, ``groupcommit``,
  ``pipeline``)
- ``bench-disk.png``: how many bytes on disk as a conversation grows, against SqliteSaver's file?
  (``store``, ``checkpoints``)
- ``bench-langgraph.png``: our LangGraph checkpointer against LangGraph's own, measure by measure
  (``langgraph``)
- ``bench-agent.png``: agent steps per second, ours against a LangGraph StateGraph (``agent``)
- ``bench-startup.png``: how long N scope actors take to start, against N bare pykka actors
  (``startup``)

A figure is drawn only when the run holds its data (a benchmark that was not selected, or skipped, leaves
its figure out); each point or bar is one measured value, labelled with it. matplotlib is needed (the
``bench`` extra); it is imported only here, and only when a report is written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FIGURES", "Figure", "draw"]

Json = dict[str, Any]
Series = tuple[str, str, str, str, list[tuple[int, float]]]  # label, colour, marker, line style, points
OURS, OURS_LIGHT, PEER, PEER_2, FLOOR = "#1f5fa8", "#8fb3de", "#c0504d", "#e5a15a", "#7f7f7f"
PEER_3 = "#8064a2"


@dataclass(frozen=True)
class Figure:
    """One figure of the report: the question it answers, how to read it, and its file."""

    name: str
    question: str
    caption: str

    @property
    def file(self) -> str:
        return f"bench-{self.name}.png"


def _get(doc: Json, bench: str, *path: str) -> Any:
    """A value of one benchmark's JSON in the run, or None (benchmark not run, or the key absent)."""
    entry = doc.get("benchmarks", {}).get(bench)
    if not entry or entry.get("status") != "ok":
        return None
    value: Any = entry.get("result")
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _si(value: float, unit: str = "") -> str:
    """A short label: 1,234 / 12.3k / 4.5M, then the unit."""
    for above, scale, suffix in ((1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k")):
        if abs(value) >= above:
            return f"{value / scale:.3g}{suffix}{unit}"
    return f"{value:,.3g}{unit}" if abs(value) < 100 else f"{value:,.0f}{unit}"


def _bytes(value: float) -> str:
    """Bytes in decimal units (kB, MB, GB), so that an axis's ticks fall on round numbers."""
    for scale, suffix in ((1e9, " GB"), (1e6, " MB"), (1e3, " kB")):
        if value >= scale:
            x = value / scale
            return f"{x:.3g}{suffix}" if x < 100 else f"{x:,.0f}{suffix}"
    return f"{value:.0f} B"


# -- the figures' data: each returns None when the run does not hold enough of it ---------------------


def _latency_data(doc: Json) -> dict[str, list[tuple[str, float, float]]] | None:
    lat = _get(doc, "core", "latency")
    if not isinstance(lat, dict):
        return None

    def rows(keys: list[tuple[str, str]]) -> list[tuple[str, float, float]]:
        out = []
        for key, label in keys:
            s = lat.get(key) or {}
            p50, p99 = _num(s.get("median_us")), _num(s.get("p99_us"))
            if p50 is not None and p99 is not None:
                out.append((label, p50, p99))
        return out

    requests = rows(
        [
            ("lock", "a Lock + dict update (floor)"),
            ("echo", "pykka ask to an echo actor (the floor)"),
            ("apply1", "apply, 1 key"),
            ("aapply1", "aapply (asyncio), 1 key"),
            ("apply10", "apply, 10 keys"),
            ("cross2", "batch across 2 scopes"),
            ("cross4", "batch across 4 scopes"),
            ("transact2", "transact over 2 scopes"),
        ]
    )
    snapshots = rows([("snap10", "snapshot at 10 keys"), ("snap100k", "snapshot at 100,000 keys")])
    if len(requests) < 2:
        return None
    return {"requests": requests, "snapshots": snapshots}


def _concurrency_data(doc: Json) -> list[Series] | None:
    def rate(bench: str, *path: str) -> float | None:
        return _num(_get(doc, bench, *path))

    store = ("store", "throughput")
    sync1, sync100 = rate(*store, "sync1", "rate"), rate(*store, "sync100", "rate")
    candidates: list[tuple[str, str, str, str, list[tuple[int, float | None]]]] = [
        ("ours, durable (sync), 1 scope", OURS, "o", "-",
         [(1, sync1), (1_000, rate("groupcommit", "results", "one_sync"))]),
        ("ours, durable (sync), 100 scopes", OURS, "s", "--",
         [(100, sync100), (10_000, rate("groupcommit", "results", "many_sync"))]),
        ("ours, in memory, 1 scope", OURS_LIGHT, "o", "-",
         [(1, rate(*store, "mem1", "rate")), (1_000, rate("groupcommit", "results", "one_mem")),
          (10_000, rate("pipeline", "throughput", "aapply_10", "per_s"))]),
        ("ours, in memory, 100 scopes", OURS_LIGHT, "s", "--",
         [(10_000, rate("groupcommit", "results", "many_mem"))]),
        ("LangGraph SqliteSaver put (durable)", PEER, "D", "none",
         [(1, rate(*store, "sqlite_put", "rate"))]),
        ("a bare synced LMDB transaction", FLOOR, "^", "none",
         [(1, rate(*store, "raw_lmdb", "rate"))]),
    ]  # fmt: skip
    series = [s for s in (_kept(*c) for c in candidates) if s is not None]
    if sum(len(s[4]) for s in series) < 3:
        return None
    return series


def _kept(
    label: str, color: str, marker: str, line: str, points: list[tuple[int, float | None]]
) -> Series | None:
    """A series of the points that were measured (None: not one was)."""
    kept = [(x, y) for x, y in points if y is not None]
    return (label, color, marker, line, kept) if kept else None


def _disk_data(doc: Json) -> list[Series] | None:
    def at(values: Any) -> list[tuple[int, float | None]]:
        if not isinstance(values, dict):
            return []
        return sorted((int(k), _num(v)) for k, v in values.items() if str(k).isdigit())

    runs = _get(doc, "checkpoints", "runs")
    runs = runs if isinstance(runs, dict) else {}

    def of_runs(field: str) -> list[tuple[int, float | None]]:
        return at({k: r.get(field) for k, r in runs.items() if isinstance(r, dict)})

    candidates: list[tuple[str, str, str, str, list[tuple[int, float | None]]]] = [
        ("LangGraph SqliteSaver: its file", PEER, "D", "-",
         at(_get(doc, "store", "storage", "sqlite", "file_bytes_at"))),
        ("ours: data.mdb, the whole store", OURS, "o", "-", of_runs("data_mdb")),
        ("ours: the conversation's own records", OURS_LIGHT, "s", "--",
         at(_get(doc, "store", "storage", "ours", "scope_bytes_at"))),
        ("the final state itself (zstd)", FLOOR, "^", ":", of_runs("final_state_bytes")),
    ]  # fmt: skip
    series = [s for s in (_kept(*c) for c in candidates) if s is not None]
    return series if len(series) >= 2 else None


_SAVERS = (
    ("victor_actors", "ours", OURS),
    ("sqlite", "SqliteSaver", PEER),
    ("lmdb", "LMDBSaver", PEER_2),
    ("postgres", "Postgres\nSaver", PEER_3),
)


def _langgraph_data(doc: Json) -> list[tuple[str, str, list[tuple[str, str, float]]]] | None:
    results = _get(doc, "langgraph", "results")
    if not isinstance(results, dict):
        return None

    def mean(values: Any) -> float | None:
        nums = [_num(v) for v in values] if isinstance(values, list) else []
        kept = [v for v in nums if v is not None]
        return sum(kept) / len(kept) if kept else None

    def disk(entry: Any) -> float | None:
        return _num(entry.get("size")) if isinstance(entry, dict) else None

    measures: list[tuple[str, str, Callable[[Json], float | None]]] = [
        ("puts per second", "higher is better", lambda r: _num(r.get("put_per_s"))),
        ("get_tuple per second", "higher is better", lambda r: _num(r.get("get_tuple_per_s"))),
        ("a 200-step graph run, seconds", "lower is better", lambda r: mean(r.get("graph_s"))),
        ("50 graphs on 50 threads, seconds", "lower is better", lambda r: mean(r.get("concurrent_s"))),
        ("disk after the graph run", "lower is better", lambda r: disk(r.get("disk"))),
        ("disk after one 2,000-step thread", "lower is better", lambda r: disk(r.get("long_disk"))),
    ]
    panels = []
    for title, better, read in measures:
        bars = []
        for key, label, color in _SAVERS:
            entry = results.get(key)
            value = read(entry) if isinstance(entry, dict) else None
            if value is not None:
                bars.append((label, color, value))
        if title.startswith("50 graphs"):
            floor = mean((results.get("memory") or {}).get("concurrent_s"))
            if floor is not None:
                bars.append(("InMemory\nSaver\n(no disk)", FLOOR, floor))
        if len(bars) >= 2:
            panels.append((title, better, bars))
    return panels or None


def _agent_data(doc: Json) -> list[tuple[str, str, float]] | None:
    rates = _get(doc, "agent", "rates")
    if not isinstance(rates, dict):
        return None
    names = (
        ("ours_sync", "ours, durable (sync)", OURS),
        ("ours_memory", "ours, in memory", OURS_LIGHT),
        ("langgraph_sqlite", "LangGraph StateGraph\n+ SqliteSaver", PEER),
    )
    bars = [(label, color, v) for key, label, color in names if (v := _num(rates.get(key))) is not None]
    return bars if len(bars) >= 2 else None


def _startup_data(doc: Json) -> list[tuple[int, float, float]] | None:
    sizes = _get(doc, "startup", "sizes")
    if not isinstance(sizes, dict):
        return None
    out = []
    for n, size in sizes.items():
        ours = _num(((size or {}).get("ours") or {}).get("start_s"))
        bare = _num(((size or {}).get("bare") or {}).get("start_s"))
        if str(n).isdigit() and ours is not None and bare is not None:
            out.append((int(n), ours, bare))
    return sorted(out) or None


# -- drawing -----------------------------------------------------------------------------------------


def _new(
    width: float, height: float, nrows: int = 1, ncols: int = 1, heights: list[int] | None = None
) -> tuple[Any, Any]:
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure(figsize=(width, height), layout="constrained")
    grid = None if heights is None else {"height_ratios": heights}
    axes = fig.subplots(nrows, ncols, squeeze=False, gridspec_kw=grid)
    return fig, axes


def _plain_axes(ax: Any) -> None:
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)
    ax.grid(True, axis="both", color="#e5e5e5", linewidth=0.6)
    ax.set_axisbelow(True)


def _draw_latency(data: dict[str, list[tuple[str, float, float]]], subtitle: str) -> Any:
    panels = [("requests", "one request, microseconds")]
    if data["snapshots"]:
        panels.append(("snapshots", "one snapshot, microseconds"))
    sizes = [len(data[key]) + 1 for key, _ in panels]
    fig, axes = _new(10, 1.0 + 0.42 * sum(sizes) + 0.5 * len(panels), len(panels), 1, heights=sizes)
    for ax, (key, xlabel) in zip(axes[:, 0], panels, strict=True):
        rows = list(reversed(data[key]))
        top = max(p99 for _, _, p99 in rows)
        for y, (label, p50, p99) in enumerate(rows):
            color = FLOOR if "floor" in label else OURS
            ax.plot([p50, p99], [y, y], color=color, linewidth=2, alpha=0.5)
            ax.plot([p50], [y], "o", color=color, markersize=7)
            ax.plot([p99], [y], "|", color=color, markersize=14, markeredgewidth=2)
            ax.annotate(f"p50 {p50:,.3g}", (p50, y), xytext=(0, 7), textcoords="offset points",
                        ha="center", fontsize=7.5)  # fmt: skip
            ax.annotate(f"p99 {p99:,.3g}", (p99, y), xytext=(4, -3), textcoords="offset points",
                        ha="left", fontsize=7.5, color="#555555")  # fmt: skip
        ax.set_yticks(range(len(rows)), [label for label, _, _ in rows], fontsize=8.5)
        ax.set_xlim(0, top * 1.2)
        ax.set_ylim(-0.7, len(rows) - 0.3)
        ax.set_xlabel(xlabel + " (dot: median, bar: p99)", fontsize=8.5)
        _plain_axes(ax)
    fig.suptitle(f"What does one request cost?\n{subtitle}", fontsize=10)
    return fig


def _draw_series(
    series: list[Series],
    title: str,
    xlabel: str,
    ylabel: str,
    *,
    log_y: bool,
    label: Callable[[float], str],
) -> Any:
    fig, axes = _new(9, 5.2)
    ax = axes[0, 0]
    xs: set[int] = set()
    for name, color, marker, line, points in series:
        x, y = zip(*points, strict=True)
        xs.update(x)
        ax.plot(x, y, marker=marker, linestyle=line, color=color, label=name, markersize=7, linewidth=1.8)
        left = line == "none"  # a lone peer's point: its label on the left, clear of ours
        for px, py in points:
            ax.annotate(label(py), (px, py), xytext=(-7 if left else 6, 4), textcoords="offset points",
                        fontsize=7.5, color=color, ha="right" if left else "left")  # fmt: skip
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log")
    ticks = sorted(xs)
    ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
    ax.xaxis.set_minor_locator(NullLocator())  # only the values measured at
    ax.set_xlim(min(ticks) / 2, max(ticks) * 3)
    if log_y:
        ax.set_yscale("log")
    else:
        ax.set_ylim(0, max(py for s in series for _, py in s[4]) * 1.15)
    ax.yaxis.set_major_formatter(lambda v, _pos: label(v))
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.legend(fontsize=8, loc="best", frameon=False)
    _plain_axes(ax)
    fig.suptitle(title, fontsize=10)
    return fig


def _draw_bars(ax: Any, bars: list[tuple[str, str, float]], fmt: Callable[[float], str]) -> None:
    labels = [label for label, _, _ in bars]
    values = [value for _, _, value in bars]
    ax.bar(range(len(bars)), values, color=[color for _, color, _ in bars], width=0.6)
    for i, v in enumerate(values):
        ax.annotate(fmt(v), (i, v), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
    ax.set_xticks(range(len(bars)), labels, fontsize=8)
    ax.set_ylim(0, max(values) * 1.18)
    ax.yaxis.set_major_formatter(lambda v, _pos: _si(v))
    _plain_axes(ax)
    ax.grid(False, axis="x")


def _draw_langgraph(panels: list[tuple[str, str, list[tuple[str, str, float]]]], subtitle: str) -> Any:
    cols = min(3, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig, axes = _new(4.0 * cols, 3.2 * rows + 0.6, rows, cols)
    for i, ax in enumerate(axes.flat):
        if i >= len(panels):
            ax.set_visible(False)
            continue
        title, better, bars = panels[i]
        fmt = _bytes if title.startswith("disk") else (lambda v: f"{v:.3g} s") if "seconds" in title else _si
        _draw_bars(ax, bars, fmt)
        if title.startswith("disk"):
            ax.yaxis.set_major_formatter(lambda v, _pos: _bytes(v))
        ax.set_title(f"{title}\n({better})", fontsize=9)
    fig.suptitle(f"Our LangGraph checkpointer against LangGraph's own, same run\n{subtitle}", fontsize=10)
    return fig


def _draw_agent(bars: list[tuple[str, str, float]], subtitle: str) -> Any:
    fig, axes = _new(7, 4.2)
    _draw_bars(axes[0, 0], bars, lambda v: f"{v:,.0f}/s")
    axes[0, 0].set_ylabel("agent steps per second (higher is better)", fontsize=9)
    fig.suptitle(
        f"One agent step (snapshot, decide, durable commit): ours against a LangGraph StateGraph\n{subtitle}",
        fontsize=10,
    )
    return fig


def _draw_startup(sizes: list[tuple[int, float, float]], subtitle: str) -> Any:
    fig, axes = _new(7, 4.2)
    ax = axes[0, 0]
    width = 0.38
    for i, (_n, ours, bare) in enumerate(sizes):
        for dx, value, color in ((-width / 2, ours, OURS), (width / 2, bare, FLOOR)):
            ax.bar(i + dx, value, width=width, color=color)
            ax.annotate(f"{value:.3g} s", (i + dx, value), xytext=(0, 3), textcoords="offset points",
                        ha="center", fontsize=8)  # fmt: skip
    ax.set_xticks(range(len(sizes)), [f"{n:,} actors" for n, _, _ in sizes], fontsize=8.5)
    ax.set_ylabel("seconds to start them all (lower is better)", fontsize=9)
    ax.set_ylim(0, max(max(o, b) for _, o, b in sizes) * 1.18)
    from matplotlib.patches import Patch

    handles = [
        Patch(color=OURS, label="ours: conversation scopes"),
        Patch(color=FLOOR, label="bare pykka actors"),
    ]
    ax.legend(handles=handles, fontsize=8, frameon=False, loc="upper left")
    _plain_axes(ax)
    ax.grid(False, axis="x")
    fig.suptitle(f"How long do N scope actors take to start?\n{subtitle}", fontsize=10)
    return fig


FIGURES: tuple[Figure, ...] = (
    Figure(
        "latency",
        "What does one request cost?",
        "Median (dot) and p99 (bar) of one call at a time, in microseconds, beside a bare pykka ask to "
        "an echo actor, the floor any reply from an actor pays; snapshots below, at 10 and 100,000 keys.",
    ),
    Figure(
        "concurrency",
        "How many commits per second, as requests in flight grow?",
        "Commits per second against the requests in flight (log scale), durable (sync: on disk before "
        "the call returns) and in memory, on one scope and spread over 100; LangGraph's SqliteSaver and "
        "a bare synced LMDB transaction, one at a time, for comparison.",
    ),
    Figure(
        "disk",
        "How many bytes on disk as a conversation grows?",
        "Bytes (log scale) after N one-message steps: SqliteSaver's file (it stores every checkpoint "
        "whole), our whole store file, the conversation's own records in it, and the final state "
        "itself.",
    ),
    Figure(
        "langgraph",
        "Our LangGraph checkpointer against LangGraph's own, measure by measure",
        "Each panel one measure of the `langgraph` benchmark, each bar a saver, interleaved in the same "
        "run; the panel says which way is better.",
    ),
    Figure(
        "agent",
        "How many agent steps per second, against a LangGraph StateGraph?",
        "One step: a snapshot, a coordinator's decision and a durable commit (ours), against a one-node "
        "StateGraph step with SqliteSaver; ours in memory beside them.",
    ),
    Figure(
        "startup",
        "How long do N scope actors take to start?",
        "Seconds to start N conversation scopes (one actor each) against N bare pykka actors, each size "
        "in a fresh process.",
    ),
)


def draw(doc: Json, out_dir: Path, subtitle: str) -> list[Figure]:
    """Write each figure the run holds data for into ``out_dir``; return those written, in order.

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib  # noqa: F401  (ImportError here, before any file is written)

    builders: dict[str, Callable[[], Any]] = {}
    if (lat := _latency_data(doc)) is not None:
        builders["latency"] = lambda: _draw_latency(lat, subtitle)
    if (conc := _concurrency_data(doc)) is not None:
        builders["concurrency"] = lambda: _draw_series(
            conc,
            f"How many commits per second, as requests in flight grow?\n{subtitle}",
            "requests in flight (log scale)",
            "commits per second (higher is better)",
            log_y=False,
            label=_si,
        )
    if (disk := _disk_data(doc)) is not None:
        builders["disk"] = lambda: _draw_series(
            disk,
            f"How many bytes on disk as a conversation grows?\n{subtitle}",
            "steps of one conversation, one message each (log scale)",
            "bytes (log scale; lower is better)",
            log_y=True,
            label=_bytes,
        )
    if (lg := _langgraph_data(doc)) is not None:
        builders["langgraph"] = lambda: _draw_langgraph(lg, subtitle)
    if (agent := _agent_data(doc)) is not None:
        builders["agent"] = lambda: _draw_agent(agent, subtitle)
    if (startup := _startup_data(doc)) is not None:
        builders["startup"] = lambda: _draw_startup(startup, subtitle)
    written = []
    for figure in FIGURES:
        build = builders.get(figure.name)
        if build is None:
            continue
        fig = build()
        fig.savefig(out_dir / figure.file, dpi=100)
        written.append(figure)
    return written
