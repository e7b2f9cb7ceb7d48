"""The state-passed document's components 5 and 6: ``create_snapshot`` and ``TransitionApplier``.

The document's orchestrator integration is four lines::

    snapshot = create_snapshot(self)
    result = await coordinator.process(snapshot, user_message)
    applier = TransitionApplier(self)
    await applier.apply_batch(result.transitions)

Here ``self`` may be a scope handle (local or from another process), a
manager with a session id, or a host: an orchestrator that keeps its
conversation in a manager (``state_manager`` and ``session_id``
attributes, see :class:`victor_actors.protocols.StateHost`). The applier
sends each batch to the conversation's actor, so it is atomic like any
batch, across the conversation and the scopes above it that its
transitions name (``scope="team"``, or the seed's ``"session"``: the
conversation's workflow or team). ``create_snapshot`` also copies a plain
orchestrator object (the seed's attributes), for code that is not on a
manager yet. See ``docs/state-passed.md`` and ``docs/adr/0025``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from victor_actors._errors import ScopeAccessError, TransitionValidationError
from victor_actors._handle import BatchLike
from victor_actors._model import CoordinatorResult, StateTransition
from victor_actors._seed_fields import Orchestration, orchestration
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import StateChanged
from victor_actors.protocols import ConversationState

__all__ = ["NoConversationError", "TransitionApplier", "create_snapshot"]


class NoConversationError(ScopeAccessError, TypeError):
    """What ``create_snapshot`` and ``TransitionApplier`` were given names no conversation.

    A ``ScopeAccessError`` (the runtime's error for a scope it cannot reach) and a ``TypeError``
    (the argument is of the wrong kind); nothing was read or applied.
    """


def _is_handle(source: Any) -> bool:
    return callable(getattr(source, "snapshot", None)) and callable(getattr(source, "aapply", None))


def _is_manager(source: Any) -> bool:
    return callable(getattr(source, "get_conversation_state", None))


def _is_host(source: Any) -> bool:
    return _is_manager(getattr(source, "state_manager", None)) and hasattr(source, "session_id")


def _conversation(manager: Any, session_id: Any, where: Any = None) -> ConversationState:
    if session_id.__class__ is not str or not session_id:
        raise NoConversationError(f"a session id is a non-empty str, not {session_id!r}")
    workflow_id = getattr(where, "workflow_id", None)
    team_id = getattr(where, "team_id", None)
    handle: ConversationState = manager.get_conversation_state(session_id, workflow_id, team_id)
    return handle


def _target(source: Any, session_id: str | None, what: str) -> Callable[[], ConversationState]:
    """How to reach the conversation ``source`` (and ``session_id``) name, each time it is needed."""
    if session_id is not None and not _is_manager(source):
        raise NoConversationError(
            f"{what}(source, session_id) takes a manager with a session id, not {source!r}"
        )
    if _is_manager(source):
        if session_id is None:
            raise NoConversationError(f"{what}(manager, session_id) needs the session id of the conversation")
        _conversation(source, session_id)  # checks the id now; nothing else is kept
        return lambda: _conversation(source, session_id)
    if _is_host(source):
        return lambda: _conversation(source.state_manager, source.session_id, source)
    if _is_handle(source):
        handle: ConversationState = source
        return lambda: handle
    raise NoConversationError(
        f"{what} takes a scope handle, a manager and a session id, or a host with state_manager and "
        f"session_id attributes, not {type(source).__name__}"
    )


def _host_fields(source: Any) -> Orchestration:
    """A host's (or a plain orchestrator's) own fields, checked and copied."""
    provider = getattr(source, "provider_name", None) or getattr(source, "provider", None)
    return orchestration(
        settings=getattr(source, "settings", None),
        model=getattr(source, "model", None),
        provider=provider if isinstance(provider, str) else None,  # not a provider object
        max_tokens=getattr(source, "max_tokens", None),
        temperature=getattr(source, "temperature", None),
        observed_files=getattr(source, "observed_files", ()),
    )


def create_snapshot(source: Any, session_id: str | None = None) -> ContextSnapshot:
    """A :class:`ContextSnapshot` of ``source``, the seed's ``create_snapshot(orchestrator)``.

    ``source`` is one of:

    * a scope handle (``ScopeHandle``, ``RemoteScopeHandle``): its snapshot, O(1);
    * a manager (``GlobalStateManager``, ``RemoteStateManager``) and ``session_id``:
      that conversation's snapshot (created on first use, as ``get_conversation_state``);
    * a host (an object with ``state_manager`` and ``session_id``, perhaps
      ``workflow_id`` and ``team_id``): its conversation's snapshot, with the
      host's ``settings``, ``model``, ``provider`` (or ``provider_name``),
      ``max_tokens``, ``temperature`` and ``observed_files``;
    * any other object with the seed's attributes (``session_id``, and any of
      ``messages``, ``conversation_stage``, ``conversation_state``,
      ``session_state``, ``capabilities`` or ``_capabilities``, and the host's
      fields above): a snapshot built from copies of them, version 0;
    * a ``ContextSnapshot``: itself.

    Raises:
        NoConversationError: ``source`` is none of these (a ``ScopeAccessError`` and a ``TypeError``).
        TransitionValidationError: (a plain object) an attribute is of the
            wrong kind (the error names the field); nothing was made.
    """
    if isinstance(source, ContextSnapshot) and session_id is None:
        return source
    if session_id is not None or _is_manager(source) or _is_handle(source):
        return _target(source, session_id, "create_snapshot")().snapshot()
    if _is_host(source):
        snapshot = _target(source, None, "create_snapshot")().snapshot()
        return snapshot._with_host(_host_fields(source))
    if not hasattr(source, "session_id"):
        raise NoConversationError(
            "create_snapshot takes a scope handle, a manager and a session id, a host (state_manager and "
            f"session_id), or an orchestrator with the seed's attributes; a {type(source).__name__} has "
            "no session_id"
        )
    return _copied(source)


def _copied(source: Any) -> ContextSnapshot:
    """A snapshot built from copies of a plain orchestrator's attributes."""
    stage = getattr(source, "conversation_stage", "initial")
    if not isinstance(stage, str) and isinstance(getattr(stage, "value", None), str):
        stage = stage.value  # an enum of stages
    capabilities = getattr(source, "capabilities", None)
    if not isinstance(capabilities, Mapping):
        capabilities = getattr(source, "_capabilities", None)
    host = _host_fields(source)
    return ContextSnapshot(
        messages=tuple(getattr(source, "messages", ())),
        session_id=source.session_id,
        conversation_stage=stage,
        settings=host.settings,
        model=host.model,
        provider=host.provider,
        max_tokens=host.max_tokens,
        temperature=host.temperature,
        conversation_state=getattr(source, "conversation_state", None),
        session_state=getattr(source, "session_state", None),
        observed_files=host.observed_files,
        capabilities=capabilities,
    )


class TransitionApplier:
    """Applies transitions to a conversation, the seed's ``TransitionApplier(orchestrator)``.

    ``target`` is a scope handle (local or remote), a manager and a
    ``session_id``, or a host (``state_manager`` and ``session_id``, read at
    each call, so a host that moves to another session is followed). Each
    call is one batch sent to the conversation's actor: all or nothing,
    across the conversation and the scopes above it its transitions name
    (``scope="conversation"``, ``"session"`` (its workflow or team),
    ``"workflow"``, ``"team"``, ``"global"``). An EXECUTE_TOOL commits as a
    pending request and the tool runs after the commit (the manager's
    ``register_tool``); its result comes back as a TOOL_RESULT.

    ``apply`` and ``apply_batch`` are ``async``, as in the document;
    ``apply_sync`` and ``apply_batch_sync`` are their blocking twins. Each
    returns the commit record (``StateChanged``).

    Raises (from every method): the errors of ``ScopeHandle.apply``; in
    every case nothing of the batch was applied. Made with a target that
    names no conversation: :class:`NoConversationError`.
    """

    def __init__(self, target: Any, session_id: str | None = None) -> None:
        self._conversation = _target(target, session_id, "TransitionApplier")

    def __repr__(self) -> str:
        return f"<TransitionApplier {self._conversation().ref}>"

    async def apply(
        self, transition: StateTransition, *, expected_version: Any = None, timeout: float | None = None
    ) -> StateChanged:
        """Apply one transition (a BATCH transition: all of it), atomically."""
        return await self._conversation().aapply(
            _one(transition), expected_version=expected_version, timeout=timeout
        )

    async def apply_batch(
        self, batch: BatchLike, *, expected_version: Any = None, timeout: float | None = None
    ) -> StateChanged:
        """Apply a batch (a ``TransitionBatch``, a ``CoordinatorResult``'s, or transitions) all or nothing."""
        return await self._conversation().aapply(
            _batch(batch), expected_version=expected_version, timeout=timeout
        )

    def apply_sync(
        self, transition: StateTransition, *, expected_version: Any = None, timeout: float | None = None
    ) -> StateChanged:
        """The blocking twin of :meth:`apply`."""
        return self._conversation().apply(
            _one(transition), expected_version=expected_version, timeout=timeout
        )

    def apply_batch_sync(
        self, batch: BatchLike, *, expected_version: Any = None, timeout: float | None = None
    ) -> StateChanged:
        """The blocking twin of :meth:`apply_batch`."""
        return self._conversation().apply(_batch(batch), expected_version=expected_version, timeout=timeout)


def _one(transition: Any) -> StateTransition:
    if not isinstance(transition, StateTransition):
        raise TransitionValidationError(
            f"apply takes one StateTransition, not {type(transition).__name__} (apply_batch takes a batch); "
            "nothing was applied",
            field="transition",
        )
    return transition


def _batch(batch: BatchLike) -> BatchLike:
    if isinstance(batch, CoordinatorResult):
        return batch.transitions
    return batch
