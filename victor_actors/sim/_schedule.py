"""The deterministic mode of a :class:`Simulation`: one seeded schedule of every agent's steps.

With ``deterministic=True`` the agents do not run in threads and tasks of
their own. One driver thread advances them: at each point a random drawn
from the seed picks who goes next among the agents that are awake and the
scopes with a tool call waiting, the pick runs (an agent's next step with
its blocking twin, or that scope's oldest tool call), and then
``manager.quiesce()`` lets the actors and the event thread finish everything
it caused before the next pick. Every scope's mailbox therefore receives the
same requests in the same order for one seed, and so does every subscriber
and tool: a failing seed replays, pick for pick.

Time is a :class:`VirtualClock` (installed by the simulation for its whole
run): it moves only here, by a random amount up to ``step_seconds`` after each
pick (drawn from the seed) and when every agent sleeps (``agent.sleep(s)``
makes an agent wait ``s`` virtual seconds while the others go on; when none
is awake, the clock jumps to the first to wake). So a run's timeout, a
request's deadline and an agent's backoff are decided in virtual time.

The schedule is a list of :data:`Pick` values, ``(who, seconds)``:
:attr:`Schedule.picks` after a run, and what ``picks=`` replays instead of
the random. A replayed list may be shorter than the run needs (the shrinker
cuts it): when it ends, every agent finishes the turn it is in (tools first,
then agents in their order, no time passing) and takes no more. A pick
naming an agent that has finished or a scope with no tool waiting is
skipped; one naming an agent asleep wakes it (the clock jumps). See
``_shrink.py`` and ADR 0034.

A step that would block until a tool answers (``agent.wait_tool_result``, or
any step whose call is ``ScopeHandle.wait_tool_result``) is not run while its
scope has calls held: the agent waits, out of the picks, until the schedule
has run them, and its step runs then. A wait hidden inside another call
cannot be seen, and waits until its own timeout.
"""

from __future__ import annotations

import base64
import contextvars
import hashlib
import json
import random
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from victor_actors import GlobalStateManager, ScopeHandle, StateChanged, VictorActorsError
from victor_actors._snapshot import ContextSnapshot
from victor_actors.lowlevel import Step, StepGen, VirtualClock, current_clock

__all__ = ["Pick", "ReplayTokenError", "Schedule", "clock_sleep", "decode_token", "encode_token"]


class ReplayTokenError(VictorActorsError, ValueError):
    """A replay token that this version cannot read (nothing was run)."""


Pick = tuple[str, float]  # who (an agent's name, or "tool@<scope>"), and the virtual seconds it took
TOOL = "tool@"


def clock_sleep(seconds: float) -> None:
    """``time.sleep`` in the clock deadlines read: a virtual clock moves on instead of blocking.

    ``agent.sleep`` yields it; the deterministic scheduler never calls it (it
    puts the agent to sleep in its own time), a thread or a fault may.
    """
    clock = current_clock()
    if clock is None:
        time.sleep(seconds)
    else:
        clock.sleep(seconds)


def _outcome(value: Any, error: BaseException | None) -> str:
    if error is not None:
        return f"raised {type(error).__name__}"
    if isinstance(value, StateChanged):
        parts = [f"{r.ref}@v{r.new_version}" for r in (value, *value.related) if r.committed]
        return "committed " + (" ".join(parts) or "nothing")
    if isinstance(value, ContextSnapshot):
        return "read " + " ".join(f"{ref}@v{v}" for ref, v in value.versions().items())
    return type(value).__name__


def _tool_wait(step: Step) -> Any:
    """The scope a step blocks on until its tool answers (``ScopeHandle.wait_tool_result``), or None."""
    if getattr(step.sync, "__func__", None) is ScopeHandle.wait_tool_result:
        return getattr(step.sync, "__self__", None)
    return None


class _Live:
    __slots__ = ("ctx", "error", "gen", "step", "value", "waits_for", "wake")

    def __init__(self, gen: StepGen[Any]) -> None:
        self.gen = gen
        self.ctx = contextvars.copy_context()  # its own, as a thread of its own would have
        self.value: Any = None
        self.error: BaseException | None = None
        self.wake = 0.0
        self.step: Step | None = None  # a step taken from the generator, not run yet (a tool wait)
        self.waits_for: str | None = None  # the scope whose held tool calls that step waits for


class Schedule:
    """Runs ``(name, generator)`` pairs one pick at a time, in an order drawn from ``seed`` or given."""

    def __init__(
        self,
        seed: int,
        *,
        step_seconds: float = 0.002,
        picks: Sequence[Pick] | None = None,
        clock: VirtualClock | None = None,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(f"{seed}:schedule")
        self.time_rng = random.Random(f"{seed}:clock")
        self.step_seconds = step_seconds
        self.forced = None if picks is None else list(picks)
        self.clock = clock or VirtualClock()
        self.history: list[tuple[str, str, str]] = []  # (agent, call, outcome)
        self.picks: list[Pick] = []  # what was picked (forced ones included), not the finishing steps

    @property
    def digest(self) -> str:
        """A fingerprint of the history: equal for two runs with the same steps and the same outcomes."""
        text = "\n".join(" | ".join(item) for item in self.history)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def virtual_seconds(self) -> float:
        return self.clock.elapsed

    def token(self) -> str:
        """The picks as a replay token: ``Simulation(..., replay=token)`` runs them again."""
        return encode_token(self.seed, self.picks)

    def run(
        self,
        manager: GlobalStateManager,
        agents: list[tuple[str, StepGen[Any]]],
        stop: Callable[[], None],
    ) -> None:
        """Drive every agent to its end; ``stop()``: take no new turn (a replay's picks ran out)."""
        live = {name: _Live(gen) for name, gen in agents}
        clock, forced, tools = self.clock, self.forced, manager.tools
        next_forced = 0
        finishing = False
        while True:
            held = [f"{TOOL}{ref}" for ref, _ in tools.held()]
            for agent in live.values():  # a wait for a tool result is served once its scope's calls ran
                if agent.waits_for is not None and f"{TOOL}{agent.waits_for}" not in held:
                    agent.waits_for = None
            if not live and not held:
                return
            delay = 0.0
            if forced is not None and not finishing and next_forced >= len(forced):
                finishing = True
                stop()
            if finishing:  # the replayed picks ran out: tools first, then each agent to its turn's end
                who = held[0] if held else next(iter(live))
            elif forced is not None:
                who, delay = forced[next_forced]
                next_forced += 1
                if who not in live and who not in held:
                    continue
            else:
                now = clock.monotonic()
                ready = [n for n, a in live.items() if a.wake <= now and a.waits_for is None] + held
                if not ready:  # everyone asleep: time jumps to the first to wake
                    clock.advance_to(min(a.wake for a in live.values()))
                    continue
                who = ready[self.rng.randrange(len(ready))]
                delay = self.time_rng.uniform(0.0, self.step_seconds)
            if not finishing:
                self.picks.append((who, delay))
            if who.startswith(TOOL) and who in held:
                ref = next(r for r, _ in tools.held() if f"{TOOL}{r}" == who)
                call = tools.run_held(ref)
                self.history.append((who, call.tool_name, "ran"))
            else:
                self._step(manager, who, live)
            clock.advance(delay)

    def _step(self, manager: GlobalStateManager, who: str, live: dict[str, _Live]) -> None:
        agent = live[who]
        self.clock.advance_to(agent.wake)  # picked while asleep (a replay, or finishing): it wakes now
        if agent.step is not None:
            step, agent.step = agent.step, None
        else:
            try:
                if agent.error is None:
                    step = agent.ctx.run(agent.gen.send, agent.value)
                else:
                    step = agent.ctx.run(agent.gen.throw, agent.error)
            except StopIteration:
                del live[who]
                return
            agent.value, agent.error = None, None
        handle = _tool_wait(step)
        if handle is not None and any(ref == handle.ref for ref, _ in manager.tools.held()):
            # it would block on a call that is a later pick: it waits (not ready) until that call ran
            agent.step, agent.waits_for = step, handle.ref
            self.history.append((who, "wait_tool_result", "waits for its scope's tool calls"))
            return
        if step.sync is clock_sleep:  # the agent sleeps in the schedule's time, the others go on
            (seconds,) = step.args
            agent.wake = self.clock.monotonic() + max(float(seconds), 0.0)
            self.history.append((who, "sleep", f"slept {float(seconds)!r}"))
            return
        call: Callable[..., Any] = step.sync
        try:
            agent.value = agent.ctx.run(call, *step.args, **step.kwargs)
        except Exception as exc:  # handed back to the agent's generator, as drive() does
            agent.error = exc
        self.history.append(
            (who, getattr(call, "__qualname__", repr(call)), _outcome(agent.value, agent.error))
        )
        manager.quiesce(30.0)


def encode_token(seed: int, picks: Sequence[Pick]) -> str:
    """``seed`` and ``picks`` as one printable string (``decode_token`` reads it back)."""
    text = json.dumps({"seed": seed, "picks": [[who, delay] for who, delay in picks]}, separators=(",", ":"))
    return "v1." + base64.urlsafe_b64encode(zlib.compress(text.encode(), 9)).decode().rstrip("=")


def decode_token(token: str) -> tuple[int, list[Pick]]:
    """The seed and picks of a replay token.

    Raises:
        ReplayTokenError: not a token this version wrote (nothing was run).
    """
    try:
        if not token.startswith("v1."):
            raise ValueError("it does not start with 'v1.'")
        body = token[3:]
        data = json.loads(zlib.decompress(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))))
        seed = data["seed"]
        picks = [(str(who), float(delay)) for who, delay in data["picks"]]
        if not isinstance(seed, int) or any(d < 0 for _, d in picks):
            raise ValueError("its seed or delays are out of range")
    except Exception as exc:
        raise ReplayTokenError(f"not a replay token ({exc}); nothing was run") from None
    return seed, picks
