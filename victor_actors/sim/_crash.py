"""The kill-and-reopen check for a user's :class:`Simulation`: SIGKILL mid-load, reopen, check the ledger.

``kill_and_reopen("mypackage.sims:make", ...)`` imports the factory (a
``module:function`` or ``path/to/file.py:function`` returning a fresh
:class:`Simulation`), runs it in a child
process (``python -m victor_actors.sim._crash module:function STORE ACKS``)
whose ledger writes one JSON line per acknowledged commit with one
``os.write`` after the commit returned, SIGKILLs the child at a moment drawn
from the simulation's seed, reopens the store read-only and runs the
simulation's invariants on what it holds (``SimRun.killed`` is True and
``live`` None: only what was acknowledged is known). The built-in
``acknowledged_writes_durable`` is the one that matters here.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from victor_actors import GlobalStateManager
from victor_actors.sim._kill import ack_sink
from victor_actors.sim._ledger import InvariantResult
from victor_actors.sim._record import Ack, Ledger, SimRun, read_scopes
from victor_actors.sim._sim_report import SimReport
from victor_actors.sim._simulation import Simulation

__all__ = ["kill_and_reopen"]


def _load_factory(factory: str) -> Simulation:
    module, _, name = factory.rpartition(":")
    if not module or not name:
        raise ValueError(f"a factory is 'module:function' or 'path/to/file.py:function', not {factory!r}")
    if module.endswith(".py"):  # a script: loaded from its file, under a name that is not __main__
        spec = importlib.util.spec_from_file_location("victor_actors_sim_factory", module)
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot load {module}")
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
    else:
        loaded = importlib.import_module(module)
    sim = getattr(loaded, name)()
    if not isinstance(sim, Simulation):
        raise TypeError(f"{factory} returned {type(sim).__name__}, not a Simulation")
    return sim


def _read_ledger(path: str) -> Ledger:
    ledger = Ledger()
    with open(path, encoding="utf-8") as fh:
        for line in fh.read().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:  # a last line cut short: never acknowledged
                continue
            if rec.get("t") == "ack":
                ledger.acks.append(Ack(rec["agent"], rec["commit"], dict(rec["versions"]), rec.get("note")))
            elif rec.get("t") == "unexpected":
                ledger.unexpected_errors.append(f"{rec['agent']}: {rec['error']}")
    return ledger


def kill_and_reopen(
    factory: str, *, store: str | None = None, min_acks: int = 20, timeout: float = 60.0
) -> SimReport:
    """Run the factory's simulation in a child, SIGKILL it mid-load, reopen the store, run its invariants.

    The kill comes at a moment drawn from the simulation's seed, between 30 % and 70 % of its
    ``seconds`` after the child's first ``min_acks`` acknowledgements (give the simulation
    ``seconds``, not ``steps``, so that it is still running then).
    """
    sim = _load_factory(factory)
    if sim.seconds is None:
        raise ValueError("kill_and_reopen needs a Simulation with seconds (it must outlast the kill)")
    started = time.monotonic()
    path = store or tempfile.mkdtemp(prefix="victor-actors-sim-kill-")
    acks = os.path.join(path, "acks.jsonl")
    try:
        cmd = [sys.executable, "-m", "victor_actors.sim._crash", factory, path, acks]
        with open(os.path.join(path, "child.log"), "wb") as log:
            child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
            end = time.monotonic() + timeout
            while child.poll() is None and time.monotonic() < end:
                if os.path.exists(acks):
                    with open(acks, "rb") as fh:
                        if fh.read().count(b'"ack"') >= min_acks:
                            break
                time.sleep(0.02)  # polling a file another process writes: nothing to wait on
            after = random.Random(sim.seed).uniform(0.3, 0.7) * sim.seconds
            deadline = time.monotonic() + after
            while child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            killed = child.poll() is None
            if killed:
                child.send_signal(signal.SIGKILL)
            code = child.wait()
        ledger = _read_ledger(acks) if os.path.exists(acks) else Ledger()
        with GlobalStateManager.open(path, read_only=True) as again:
            reopened = (sim.observe or read_scopes)(again)
    finally:
        if store is None:
            shutil.rmtree(path, ignore_errors=True)
    run = SimRun(ledger, None, reopened, None, [], sim.faults, killed=True)
    report = sim.report(run, after, time.monotonic() - started)
    report.extra["kill"] = {"killed_after_seconds": round(after, 2), "child_exit": code, "killed": killed}
    if not killed:
        report.results.append(
            InvariantResult("the child was killed mid-load", False, 1, [f"it exited {code}"])
        )
    report.counts["acknowledged"] = len(ledger.acks)
    return report


def _child(argv: list[str]) -> int:
    factory, path, acks = argv
    sim = _load_factory(factory)
    sim.store = path
    sim.run(sink=ack_sink(acks))
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
