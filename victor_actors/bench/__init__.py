"""``victor-actors bench``: the benchmarks, each in a fresh process, ratios side by side.

Every benchmark is a module of this package (``python -m victor_actors.bench.core``
and so on, each with ``--quick`` and ``--json FILE``), installed with it, so
``victor-actors bench`` works from ``pip install 'victor-actors[bench]'`` with
no checkout. The runner starts each one in its own subprocess (a shared
interpreter skews results: threads, the allocator and the GIL carry over),
collects its JSON, prints one table of the measured values of the benchmarks
it ran with their same-run baselines, and checks their targets against them.
Targets are for benchmarks, never timed tests: a missed target is reported,
not failed. ``python -m victor_actors.bench.report FILE`` turns the JSON into a
report, markdown and one figure per question, beside FILE (never into a
checkout unless ``--out`` says so; ``--out docs`` writes ``docs/benchmarks.md``).
See ``docs/benchmarks.md``.

The benchmarks (among them ``remote``: one owner process and its client
processes, started by ``_remote_procs``) and which of them run by default are
listed in ``_registry``
(``victor-actors bench --help`` prints both lists). LangGraph (the ``bench``
extra) is imported only by the benchmarks that compare with it, and only when
they start: without it ``store``, ``agent`` and ``groupcommit`` still measure
ours and skip their LangGraph peers, and ``langgraph`` is skipped.

The runner's parts: ``_registry`` (the benchmarks), ``_rows`` (the table's
rows), ``_targets`` (the targets and the evaluation), ``_machine``, ``_table``,
``_runner``; the report's: ``report`` and ``_plots`` (the figures); the
benchmarks share ``_common``, ``_peers`` (the LangGraph baselines),
``_probes`` (the two private reads two benchmarks need) and ``_pin`` (the
process on one CPU while one caller's latency is measured). ``alternate`` is
no benchmark: it runs chosen rows on old and new code in turn, for a before
and after on one machine.
"""

from __future__ import annotations

from victor_actors.bench._registry import BENCHMARKS, INSTALL_HINT, Bench, missing_dependency
from victor_actors.bench._rows import ROWS, RowSpec
from victor_actors.bench._runner import add_parser, run_command, run_one
from victor_actors.bench._table import fmt_ratio, fmt_value, table
from victor_actors.bench._targets import TARGETS, TargetSpec, evaluate

__all__ = [
    "BENCHMARKS",
    "INSTALL_HINT",
    "ROWS",
    "TARGETS",
    "Bench",
    "RowSpec",
    "TargetSpec",
    "add_parser",
    "evaluate",
    "fmt_ratio",
    "fmt_value",
    "missing_dependency",
    "run_command",
    "run_one",
    "table",
]
