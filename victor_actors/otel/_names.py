"""The names of victor_actors' spans, span attributes and metrics, in one place."""

from __future__ import annotations

__all__ = [
    "ATTRIBUTES",
    "METRICS",
    "SPANS",
]

# -- spans ------------------------------------------------------------------------------------

SPAN_APPLY = "victor_actors.apply"  # the caller's side of handle.apply
SPAN_AAPPLY = "victor_actors.aapply"  # the caller's side of handle.aapply
SPAN_COMMIT = "victor_actors.commit"  # the actor's work for one request: reduce, persist, publish
SPAN_PREPARE = "victor_actors.prepare"  # one participant of a cross-scope batch, on its actor
SPAN_DELIVER = "victor_actors.deliver"  # one subscriber called with one event
SPAN_TOOL = "victor_actors.tool"  # one tool executor run
SPAN_RUN = "victor_actors.run"  # one run (``manager.run``/``arun``)
SPAN_RESTART = "victor_actors.restart"  # one scope restarted by its supervisor
EVENT_ROLLBACK = "rollback"  # on a run's span: its writes were rolled back

SPANS = (
    SPAN_APPLY,
    SPAN_AAPPLY,
    SPAN_COMMIT,
    SPAN_PREPARE,
    SPAN_DELIVER,
    SPAN_TOOL,
    SPAN_RUN,
    SPAN_RESTART,
)

# -- span and metric attributes ---------------------------------------------------------------

SCOPE = "victor_actors.scope"  # "conversation:alice"
SCOPE_LEVEL = "victor_actors.scope.level"  # "conversation" (the low-cardinality one, on metrics)
OLD_VERSION = "victor_actors.old_version"
NEW_VERSION = "victor_actors.new_version"
EXPECTED_VERSION = "victor_actors.expected_version"
COMMITTED = "victor_actors.committed"  # False: the batch changed nothing
COMMIT_ID = "victor_actors.commit_id"
TRANSITION_COUNT = "victor_actors.transitions.count"
TRANSITION_TYPES = "victor_actors.transitions.types"  # distinct types, in order of first use
RUN_ID = "victor_actors.run_id"
DURABILITY = "victor_actors.durability"  # "sync", "async", "manual" or "memory"
GROUP_COMMIT_SIZE = "victor_actors.group_commit.size"  # store jobs in the LMDB txn that made it durable
CROSS_SCOPE = "victor_actors.cross_scope"
INVOLVED = "victor_actors.involved"  # the scopes a cross-scope batch committed in
OUTCOME = "victor_actors.outcome"  # a participant's: "committed", "aborted" or "rejected"
EVENT_KIND = "victor_actors.event"  # "commit", or a supervision event's kind
TOOL_NAME = "victor_actors.tool.name"
TOOL_REQUEST_ID = "victor_actors.tool.request_id"
TOOL_REDELIVERY = "victor_actors.tool.redelivery"
SESSION_ID = "victor_actors.run.session_id"
RUN_TIMEOUT = "victor_actors.run.timeout"
RUN_STATUS = "victor_actors.run.status"
REASON = "victor_actors.reason"  # a restart's or a rollback's
OPERATION = "victor_actors.operation"  # "apply" or "aapply" (on the latency histogram)
MANAGER = "victor_actors.manager"  # which open manager (on the observed metrics)
STATE = "victor_actors.state"  # "live" or "passivated" (on victor_actors.scopes)
ERROR_TYPE = "error.type"  # OpenTelemetry's own name

ATTRIBUTES = (
    SCOPE,
    SCOPE_LEVEL,
    OLD_VERSION,
    NEW_VERSION,
    EXPECTED_VERSION,
    COMMITTED,
    COMMIT_ID,
    TRANSITION_COUNT,
    TRANSITION_TYPES,
    RUN_ID,
    DURABILITY,
    GROUP_COMMIT_SIZE,
    CROSS_SCOPE,
    INVOLVED,
    OUTCOME,
    EVENT_KIND,
    TOOL_NAME,
    TOOL_REQUEST_ID,
    TOOL_REDELIVERY,
    SESSION_ID,
    RUN_TIMEOUT,
    RUN_STATUS,
    REASON,
    OPERATION,
    MANAGER,
    STATE,
    ERROR_TYPE,
)

# -- metrics ----------------------------------------------------------------------------------

# updated by the hooks
COMMIT_DURATION = "victor_actors.commit.duration"
RESTARTS = "victor_actors.restarts"
ROLLBACKS = "victor_actors.rollbacks"
REFUSALS = "victor_actors.backpressure.refusals"
STORE_TRANSACTIONS = "victor_actors.store.transactions"
COMMITS_PER_TRANSACTION = "victor_actors.store.commits_per_transaction"
# observed from manager.stats() of every open manager
COMMITS = "victor_actors.commits"
MAILBOX_DEPTH = "victor_actors.mailbox.depth"
SCOPES = "victor_actors.scopes"
ACTIVATIONS = "victor_actors.activations"
PASSIVATIONS = "victor_actors.passivations"
EVICTIONS = "victor_actors.evictions"

METRICS = (
    COMMIT_DURATION,
    RESTARTS,
    ROLLBACKS,
    REFUSALS,
    STORE_TRANSACTIONS,
    COMMITS_PER_TRANSACTION,
    COMMITS,
    MAILBOX_DEPTH,
    SCOPES,
    ACTIVATIONS,
    PASSIVATIONS,
    EVICTIONS,
)
