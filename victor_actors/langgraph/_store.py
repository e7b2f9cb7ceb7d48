"""VictorActorsStore: LangGraph's long-term memory store (``BaseStore``) on one scope of the runtime.

Layout (docs/adr/0029): a store is one team scope, ``lgstore:<name>``; each
item is one key of its state (see ``_items``). One scope, not one per
namespace, because a ``batch`` must commit across namespaces all or nothing
and the runtime commits atomically within a scope and its ancestors only:
every batch is one commit of that scope, through its actor. The price is one
writer for the whole store (the scope's actor, with group commit) and reads
that scan the items of a namespace prefix (an index of the keys is kept per
committed version, so a scan decodes only the items of the prefix).

Beyond LangGraph's ``BaseStore``: each item has a version (``item.version``,
1 when created, one more at each put), and ``put(..., expected_version=N)``
writes only if the item is still at version ``N`` (0: only if it does not
exist), else raises ``VersionConflictError`` (:class:`ItemVersionConflictError`)
and writes nothing of its batch. Concurrent puts to one key never lose an
update: each batch is built on the scope's committed state and applied only if
that state did not move (``handle.modify``), else rebuilt, and after a few
tries built under the scope's lock (``transact``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple, cast

from langgraph.store.base import (  # type: ignore[import-not-found, unused-ignore]
    NOT_PROVIDED,
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    NotProvided,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
)
from langgraph.store.base.embed import (  # type: ignore[import-not-found, unused-ignore]
    ensure_embeddings,
    get_text_at_path,
    tokenize_path,
)

from victor_actors import (
    ContextSnapshot,
    StateTransition,
    TransitionType,
    TransitionValidationError,
    VersionConflictError,
    VictorActorsError,
)
from victor_actors.langgraph import _items as I
from victor_actors.langgraph._segments import Handle, Manager

__all__ = ["ItemVersionConflictError", "StoreItem", "StoreSearchItem", "VersionedPutOp", "VictorActorsStore"]

logger = logging.getLogger("victor_actors")
SCOPE_PREFIX = "lgstore:"
_TRIES = 4  # optimistic attempts before the batch is built under the scope's lock
TTL_KEYS = frozenset({"default_ttl", "refresh_on_read", "sweep_interval_minutes", "omit_expired"})


class ItemVersionConflictError(VersionConflictError):
    """A put or delete named an ``expected_version`` the item is not at; nothing of its batch was written.

    ``namespace`` and ``key`` name the item, ``expected_version`` the version
    named, ``current_version`` the item's (0: it does not exist).
    """

    def __init__(self, namespace: tuple[str, ...], key: str, expected: int, current: int) -> None:
        VictorActorsError.__init__(
            self,
            f"store item {namespace!r}/{key!r}: expected version {expected} but the item is at version "
            f"{current}{' (it does not exist)' if current == 0 else ''}; nothing of the batch was written",
        )
        self.ref = (namespace, key)
        self.namespace, self.key = namespace, key
        self.expected_version = expected
        self.current_version = current


class StoreItem(Item):
    """An item as ``get`` returns it, with its ``version`` (1 when created, one more at each put)."""

    __slots__ = ("version",)

    def __init__(self, *, version: int, **fields: Any) -> None:
        super().__init__(**fields)
        self.version = version

    def dict(self) -> dict[str, Any]:
        return {**super().dict(), "version": self.version}


class StoreSearchItem(SearchItem):
    """An item as ``search`` returns it: ``score`` (with a query) and ``version``."""

    __slots__ = ("version",)

    def __init__(self, *, version: int, **fields: Any) -> None:
        super().__init__(**fields)
        self.version = version

    def dict(self) -> dict[str, Any]:
        return {**super().dict(), "version": self.version}


class VersionedPutOp(NamedTuple):
    """A :class:`PutOp` that applies only if the item is at ``expected_version`` (0: absent)."""

    namespace: tuple[str, ...]
    key: str
    value: Mapping[str, Any] | None
    expected_version: int
    index: Literal[False] | list[str] | None = None  # type: ignore[assignment]  # as in PutOp
    ttl: float | None = None


class _Put(NamedTuple):
    namespace: tuple[str, ...]
    key: str
    value: bytes | None  # packed, None to delete
    expected: int | None
    ttl: float | None
    vectors: list[bytes] | None  # None: keep none


class _Nothing(Exception):
    """A batch's writes change nothing: no commit."""


def _when(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def _check_ttl(ttl: Mapping[str, Any] | None) -> TTLConfig | None:
    if ttl is None:
        return None
    if not isinstance(ttl, Mapping) or any(k not in TTL_KEYS for k in ttl):
        raise TransitionValidationError(
            f"ttl takes the keys {sorted(TTL_KEYS)}, not {ttl!r}; nothing was opened", field="ttl"
        )
    for key in ("default_ttl", "sweep_interval_minutes"):
        value = ttl.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
        ):
            raise TransitionValidationError(
                f"ttl[{key!r}] must be a positive number of minutes or None, not {value!r}", field="ttl"
            )
    for key in ("refresh_on_read", "omit_expired"):
        if key in ttl and not isinstance(ttl[key], bool):
            raise TransitionValidationError(f"ttl[{key!r}] must be a bool, not {ttl[key]!r}", field="ttl")
    return cast(TTLConfig, dict(ttl))


def _check_minutes(ttl: Any) -> float | None:
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl < float("inf"):
        raise TransitionValidationError(
            f"an item's ttl must be a positive number of minutes or None, not {ttl!r}; nothing was written",
            field="ttl",
        )
    return float(ttl)


class VictorActorsStore(BaseStore):
    """LangGraph's ``BaseStore`` (long-term memory) on the runtime: durable, atomic, versioned.

    ``VictorActorsStore(manager)`` keeps its items in the scope
    ``lgstore:<name>`` of ``manager`` (``name`` defaults to ``"default"``;
    several stores may share a manager, and a ``VictorActorsSaver``). Every
    operation of LangGraph's store works (``put``, ``get``, ``search`` with
    ``filter``, ``limit``, ``offset`` and ``query``, ``delete``,
    ``list_namespaces``, ``batch`` and their asyncio twins). A ``batch``
    reads one snapshot (its reads do not see its own writes) and commits all
    its writes as one commit, across namespaces: all or nothing, durable on
    return under ``durability="sync"``.

    ``ttl`` takes LangGraph's ``TTLConfig`` keys: ``default_ttl`` (minutes an
    item lives after its last write, or read with ``refresh_on_read=True``;
    as in LangGraph's SQL stores, reads refresh nothing unless it is set),
    ``sweep_interval_minutes`` (a background sweeper
    deletes expired items that often; ``sweep_ttl()`` does it now) and
    ``omit_expired`` (reads skip expired items not yet swept). ``clock``
    (seconds) is for tests.

    ``index`` (LangGraph's ``IndexConfig``: ``dims``, ``embed`` a function or
    LangChain ``Embeddings`` you pass, ``fields``) turns on vector search:
    a put embeds the item's fields, and ``search(query=...)`` ranks by cosine
    similarity. Nothing is downloaded.

    Raises:
        TransitionValidationError: from the constructor, for a bad ``ttl`` or
            ``index``; nothing was opened.
    """

    supports_ttl = True

    def __init__(
        self,
        manager: Manager,
        ttl: TTLConfig | None = None,
        index: IndexConfig | None = None,
        *,
        name: str = "default",
        clock: Callable[[], float] = time.time,
        timeout: float | None = None,
    ) -> None:
        self.manager = manager
        self.ttl_config = _check_ttl(ttl)
        self.name = I.check_text(str(name), "the store name")
        self.clock = clock
        self.timeout = timeout
        self.index_config: IndexConfig | None = None
        self.embeddings: Any = None
        self._fields: list[tuple[str, Any]] = []
        if index is not None:
            if not isinstance(index, Mapping) or "embed" not in index:
                raise TransitionValidationError(
                    "index needs an 'embed' function (and 'dims', 'fields' if you like); nothing was opened",
                    field="index",
                )
            self.index_config = cast(IndexConfig, dict(index))
            self.embeddings = ensure_embeddings(index["embed"])
            self._fields = [(p, p if p == "$" else tokenize_path(p)) for p in (index.get("fields") or ["$"])]
        self._handle: Handle | None = None
        self._cache: tuple[int, dict[tuple[str, ...], list[str]]] | None = None
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None
        if self.ttl_config and self.ttl_config.get("sweep_interval_minutes"):
            self.start_ttl_sweeper()

    # -- the scope -----------------------------------------------------------------------

    @property
    def handle(self) -> Handle:
        """The store's scope (created on first use)."""
        handle = self._handle
        if handle is None:
            handle = self._handle = self.manager.get_team_state(SCOPE_PREFIX + self.name)
        return handle

    def _index(self, snap: ContextSnapshot) -> dict[tuple[str, ...], list[str]]:
        """Namespace -> state keys of its items, for one committed version (cached per version)."""
        cached = self._cache
        if cached is not None and cached[0] == snap.version:
            return cached[1]
        out: dict[tuple[str, ...], list[str]] = {}
        for key in snap.state:
            if key.startswith(I.ITEM_PREFIX):
                out.setdefault(I.split_key(key)[0], []).append(key)
        self._cache = (snap.version, out)
        return out

    # -- ops: checked, then embedded, then read, then written ----------------------------------

    def _prepare(self, ops: Iterable[Op | VersionedPutOp]) -> tuple[list[Op | VersionedPutOp], list[_Put]]:
        """Every op checked before anything is read or written; the writes, in order."""
        checked: list[Op | VersionedPutOp] = []
        puts: list[_Put] = []
        for op in ops:
            if isinstance(op, GetOp):
                op = op._replace(namespace=I.check_labels(op.namespace, what="the namespace", nonempty=False))
                I.check_text(str(op.key), "the key")
            elif isinstance(op, SearchOp):
                prefix = I.check_labels(op.namespace_prefix, what="the namespace prefix", nonempty=False)
                op = op._replace(namespace_prefix=prefix)
                for n, what in ((op.limit, "limit"), (op.offset, "offset")):
                    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                        raise TransitionValidationError(f"search's {what} must be an int >= 0, not {n!r}")
            elif isinstance(op, ListNamespacesOp):
                for cond in op.match_conditions or ():
                    I.check_labels(
                        tuple(p for p in cond.path if p != "*"), what="a match path", nonempty=False
                    )
            elif isinstance(op, (PutOp, VersionedPutOp)):
                puts.append(self._put_of(op))
            else:
                raise TransitionValidationError(
                    f"unknown store operation {type(op).__name__}; nothing was run"
                )
            checked.append(op)
        return checked, puts

    def _put_of(self, op: PutOp | VersionedPutOp) -> _Put:
        namespace = I.check_labels(op.namespace, what="the namespace", nonempty=True)
        key = I.check_text(str(op.key), "the key")
        expected = op.expected_version if isinstance(op, VersionedPutOp) else None
        if expected is not None and (
            isinstance(expected, bool) or not isinstance(expected, int) or expected < 0
        ):
            raise TransitionValidationError(
                f"expected_version must be an int >= 0 (0: the item must not exist), not {expected!r}",
                field="expected_version",
            )
        if op.value is None:
            return _Put(namespace, key, None, expected, None, None)
        return _Put(namespace, key, I.pack_value(op.value), expected, _check_minutes(op.ttl), None)

    def _texts(self, ops: Sequence[Op | VersionedPutOp], puts: list[_Put]) -> list[list[str]]:
        """Per put: the texts to embed (none without an index, for ``index=False`` or a delete)."""
        out: list[list[str]] = []
        put_ops = [op for op in ops if isinstance(op, (PutOp, VersionedPutOp))]
        for op, put in zip(put_ops, puts, strict=True):
            texts: list[str] = []
            if self.embeddings is not None and put.value is not None and op.index is not False:
                fields = self._fields if op.index is None else [(p, tokenize_path(p)) for p in op.index]
                value = dict(op.value or {})
                for _path, tokens in fields:
                    texts.extend(get_text_at_path(value, tokens))
            out.append(texts)
        return out

    def _with_vectors(
        self, puts: list[_Put], texts: list[list[str]], vectors: list[list[float]]
    ) -> list[_Put]:
        dims = self.index_config.get("dims") if self.index_config else None
        if sum(map(len, texts)) != len(vectors):
            raise TransitionValidationError(
                f"the embedding function returned {len(vectors)} vectors for {sum(map(len, texts))} texts; "
                "nothing was written",
                field="index",
            )
        it = iter(vectors)
        out = []
        for put, mine in zip(puts, texts, strict=True):
            packed = [I.vector_bytes(next(it), dims) for _ in mine] if mine else None
            out.append(put._replace(vectors=packed))
        return out

    def _queries(self, ops: Sequence[Op | VersionedPutOp]) -> list[str]:
        if self.embeddings is None:
            return []
        return sorted({op.query for op in ops if isinstance(op, SearchOp) and op.query})

    # -- reads ---------------------------------------------------------------------------

    def _refreshes(self, op: GetOp | SearchOp) -> bool:
        """Whether a read refreshes its items' TTL: the op asks and the store's ttl has refresh_on_read.

        As LangGraph's SQL stores read it: ``refresh_on_read`` is off unless
        the store's ``ttl`` sets it.
        """
        return bool(op.refresh_ttl and self.ttl_config and self.ttl_config.get("refresh_on_read", False))

    def _live(self, record: Mapping[str, Any], now: float) -> bool:
        expires = record.get("e")
        omit = bool(self.ttl_config and self.ttl_config.get("omit_expired"))
        return not (omit and expires is not None and expires <= now)

    def _read(
        self,
        ops: Sequence[Op | VersionedPutOp],
        snap: ContextSnapshot,
        queries: Mapping[str, Sequence[float]],
    ) -> tuple[list[Result], set[str]]:
        """Each op's result on one snapshot; and the state keys of the items to refresh (TTL)."""
        now = self.clock()
        state = snap.state
        results: list[Result] = []
        refresh: set[str] = set()
        for op in ops:
            if isinstance(op, GetOp):
                skey = I.item_key(op.namespace, str(op.key))
                stored = state.get(skey)
                record = I.unpack(stored) if stored is not None else None
                if record is None or not self._live(record, now):
                    results.append(None)
                    continue
                if self._refreshes(op) and record.get("t") is not None:
                    refresh.add(skey)
                results.append(self._item(op.namespace, str(op.key), record))
            elif isinstance(op, SearchOp):
                found = self._search(op, snap, queries, now)
                if self._refreshes(op):
                    refresh.update(skey for skey, record, _ in found if record.get("t") is not None)
                results.append([self._item(*I.split_key(skey), r, score=s) for skey, r, s in found])
            elif isinstance(op, ListNamespacesOp):
                results.append(self._namespaces(op, snap, now))
            else:
                results.append(None)
        return results, refresh

    def _item(self, namespace: tuple[str, ...], key: str, record: Mapping[str, Any], **score: Any) -> Any:
        fields = {
            "namespace": namespace,
            "key": key,
            "value": I.unpack_value(record["v"]),
            "created_at": _when(record["c"]),
            "updated_at": _when(record["u"]),
            "version": record["n"],
        }
        if score:
            return StoreSearchItem(**fields, **score)
        return StoreItem(**fields)

    def _search(
        self, op: SearchOp, snap: ContextSnapshot, queries: Mapping[str, Sequence[float]], now: float
    ) -> list[tuple[str, dict[str, Any], float | None]]:
        prefix = tuple(op.namespace_prefix)
        n = len(prefix)
        candidates: list[tuple[str, dict[str, Any]]] = []
        for namespace, keys in self._index(snap).items():
            if namespace[:n] != prefix:
                continue
            for skey in keys:
                record = I.unpack(snap.state[skey])
                if not self._live(record, now):
                    continue
                if op.filter and not I.matches(I.unpack_value(record["v"]), op.filter):
                    continue
                candidates.append((skey, record))
        query = queries.get(op.query) if op.query else None
        if query is None:  # newest first, as LangGraph's SQL stores order a search without a query
            candidates.sort(key=lambda c: (-c[1]["u"], c[0]))
            return [(skey, r, None) for skey, r in candidates[op.offset : op.offset + op.limit]]
        scored = [(I.cosine(query, map(I.vector_of, r.get("x") or ())), skey, r) for skey, r in candidates]
        ranked = sorted((s for s in scored if s[0] is not None), key=lambda s: (-(s[0] or 0.0), s[1]))
        ranked += [s for s in scored if s[0] is None]  # items without vectors come last
        return [(skey, r, score) for score, skey, r in ranked[op.offset : op.offset + op.limit]]

    def _namespaces(self, op: ListNamespacesOp, snap: ContextSnapshot, now: float) -> list[tuple[str, ...]]:
        found = []
        for namespace, keys in self._index(snap).items():
            if op.match_conditions and not all(
                I.namespace_matches(c, namespace) for c in op.match_conditions
            ):
                continue
            if self.ttl_config and self.ttl_config.get("omit_expired"):
                if not any(self._live(I.unpack(snap.state[k]), now) for k in keys):
                    continue
            found.append(namespace)
        if op.max_depth is not None:
            found = list({ns[: op.max_depth] for ns in found})
        found.sort()
        return found[op.offset : op.offset + op.limit]

    # -- writes --------------------------------------------------------------------------

    def _build(
        self, puts: list[_Put], refresh: set[str]
    ) -> Callable[[ContextSnapshot], list[StateTransition]]:
        """The batch's writes on a snapshot: each put on the ones before it, then the TTL refreshes."""

        def build(snap: ContextSnapshot) -> list[StateTransition]:
            now = self.clock()
            state = snap.state
            over: dict[str, dict[str, Any] | None] = {}

            def current(skey: str) -> dict[str, Any] | None:
                if skey in over:
                    return over[skey]
                stored = state.get(skey)
                return I.unpack(stored) if stored is not None else None

            for put in puts:
                skey = I.item_key(put.namespace, put.key)
                record = current(skey)
                version = record["n"] if record is not None else 0
                if put.expected is not None and put.expected != version:
                    raise ItemVersionConflictError(put.namespace, put.key, put.expected, version)
                if put.value is None:
                    if record is not None:
                        over[skey] = None
                    continue
                new = {
                    "v": put.value,
                    "c": record["c"] if record is not None else now,
                    "u": now,
                    "n": version + 1,
                    "t": put.ttl,
                    "e": now + put.ttl * 60 if put.ttl is not None else None,
                }
                if put.vectors:
                    new["x"] = put.vectors
                over[skey] = new
            for skey in refresh:
                record = current(skey)
                if record is not None and record.get("t") is not None:
                    over[skey] = {**record, "e": now + record["t"] * 60}
            if not over:
                raise _Nothing
            return [
                StateTransition(TransitionType.DELETE_STATE, {"key": k})
                if r is None
                else StateTransition(TransitionType.UPDATE_STATE, {"key": k, "value": I.pack(r)})
                for k, r in over.items()
            ]

        return build

    def _commit(self, build: Callable[[ContextSnapshot], list[StateTransition]]) -> None:
        handle = self.handle
        try:
            handle.modify(build, retries=_TRIES - 1, timeout=self.timeout)
        except _Nothing:
            return
        except ItemVersionConflictError:
            raise
        except VersionConflictError:  # contended: build it under the scope's lock, where nothing moves
            try:
                handle.transact(build, lock=[handle.ref], timeout=self.timeout)
            except _Nothing:
                return

    async def _acommit(self, build: Callable[[ContextSnapshot], list[StateTransition]]) -> None:
        handle = self.handle
        try:
            await handle.amodify(build, retries=_TRIES - 1, timeout=self.timeout)
        except _Nothing:
            return
        except ItemVersionConflictError:
            raise
        except VersionConflictError:
            try:
                await handle.atransact(build, lock=[handle.ref], timeout=self.timeout)
            except _Nothing:
                return

    # -- BaseStore -----------------------------------------------------------------------

    def batch(self, ops: Iterable[Op | VersionedPutOp]) -> list[Result]:
        """Run ``ops`` in order on one snapshot; commit their writes (and TTL refreshes) as one commit.

        Raises:
            ItemVersionConflictError: a put's ``expected_version`` did not hold;
                nothing of the batch was written.
            TransitionValidationError, StoreNamespaceError: a bad op; nothing
                was read or written.
        """
        checked, puts = self._prepare(ops)
        texts = self._texts(checked, puts)
        if any(texts):
            puts = self._with_vectors(
                puts, texts, self.embeddings.embed_documents([t for ts in texts for t in ts])
            )
        queries = {q: self.embeddings.embed_query(q) for q in self._queries(checked)}
        results, refresh = self._read(checked, self.handle.snapshot(), queries)
        if puts or refresh:
            self._commit(self._build(puts, refresh))
        return results

    async def abatch(self, ops: Iterable[Op | VersionedPutOp]) -> list[Result]:
        checked, puts = self._prepare(ops)
        texts = self._texts(checked, puts)
        if any(texts):
            flat = [t for ts in texts for t in ts]
            puts = self._with_vectors(puts, texts, await self.embeddings.aembed_documents(flat))
        names = self._queries(checked)
        embedded = await asyncio.gather(*(self.embeddings.aembed_query(q) for q in names)) if names else []
        queries = dict(zip(names, embedded, strict=True))
        handle = self._handle
        if handle is None:
            handle = await asyncio.to_thread(lambda: self.handle)  # may restore the scope
        results, refresh = self._read(checked, handle.snapshot(), queries)
        if puts or refresh:
            await self._acommit(self._build(puts, refresh))
        return results

    def put(
        self,
        namespace: tuple[str, ...],
        key: str,
        value: Mapping[str, Any],
        index: Literal[False] | list[str] | None = None,
        *,
        ttl: float | NotProvided | None = NOT_PROVIDED,
        expected_version: int | None = None,
    ) -> None:
        """Store ``value`` under ``namespace`` and ``key`` (see ``BaseStore.put``).

        ``expected_version``: write only if the item is at that version (0:
        only if it does not exist), else :class:`ItemVersionConflictError`
        and nothing is written.
        """
        if expected_version is None:
            super().put(namespace, key, value, index, ttl=ttl)
            return
        self._check_put_namespace(namespace)
        self.batch([VersionedPutOp(namespace, str(key), value, expected_version, index, self._ttl(ttl))])

    async def aput(
        self,
        namespace: tuple[str, ...],
        key: str,
        value: Mapping[str, Any],
        index: Literal[False] | list[str] | None = None,
        *,
        ttl: float | NotProvided | None = NOT_PROVIDED,
        expected_version: int | None = None,
    ) -> None:
        if expected_version is None:
            await super().aput(namespace, key, value, index, ttl=ttl)
            return
        self._check_put_namespace(namespace)
        await self.abatch(
            [VersionedPutOp(namespace, str(key), value, expected_version, index, self._ttl(ttl))]
        )

    def delete(self, namespace: tuple[str, ...], key: str, *, expected_version: int | None = None) -> None:
        """Delete an item; with ``expected_version``, only if it is at that version."""
        if expected_version is None:
            super().delete(namespace, key)
            return
        self.batch([VersionedPutOp(namespace, str(key), None, expected_version)])

    async def adelete(
        self, namespace: tuple[str, ...], key: str, *, expected_version: int | None = None
    ) -> None:
        if expected_version is None:
            await super().adelete(namespace, key)
            return
        await self.abatch([VersionedPutOp(namespace, str(key), None, expected_version)])

    def _ttl(self, ttl: float | NotProvided | None) -> float | None:
        if isinstance(ttl, NotProvided):
            return self.ttl_config.get("default_ttl") if self.ttl_config else None
        return ttl

    @staticmethod
    def _check_put_namespace(namespace: tuple[str, ...]) -> None:
        I.check_labels(namespace, what="the namespace", nonempty=True)
        if namespace[0] == "langgraph":
            raise I.StoreNamespaceError(f'a namespace cannot start with "langgraph": {namespace!r}')

    # -- TTL -----------------------------------------------------------------------------

    def sweep_ttl(self) -> int:
        """Delete every expired item now, in one commit; the number deleted."""
        return self._sweep()

    def _sweep(self) -> int:
        now = self.clock()
        counted: list[int] = []

        def build(snap: ContextSnapshot) -> list[StateTransition]:
            gone = [
                k
                for k, v in snap.state.items()
                if k.startswith(I.ITEM_PREFIX) and (e := I.unpack(v).get("e")) is not None and e <= now
            ]
            counted[:] = [len(gone)]
            if not gone:
                raise _Nothing
            return [StateTransition(TransitionType.DELETE_STATE, {"key": k}) for k in gone]

        self._commit(build)
        return counted[0] if counted else 0

    async def asweep_ttl(self) -> int:
        return await asyncio.to_thread(self._sweep)

    def start_ttl_sweeper(self) -> None:
        """Start the background sweeper (every ``sweep_interval_minutes``); idempotent."""
        minutes = (self.ttl_config or {}).get("sweep_interval_minutes")
        if minutes is None:
            raise TransitionValidationError("the store's ttl has no sweep_interval_minutes", field="ttl")
        if self._sweeper is not None and self._sweeper.is_alive():
            return
        self._stop.clear()
        self._sweeper = threading.Thread(
            target=self._sweep_loop, args=(minutes * 60,), name="victor-actors-store-sweeper", daemon=True
        )
        self._sweeper.start()

    def _sweep_loop(self, seconds: float) -> None:
        while not self._stop.wait(seconds):
            if self.manager.closed:
                return
            try:
                self._sweep()
            except Exception:  # retried at the next interval
                logger.exception("the LangGraph store's TTL sweep failed; it runs again next interval")

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the background sweeper; True once it has stopped (or never ran)."""
        self._stop.set()
        sweeper = self._sweeper
        if sweeper is None or sweeper is threading.current_thread():
            return True
        sweeper.join(timeout)
        return not sweeper.is_alive()

    def close(self) -> None:
        """Stop the sweeper. The manager stays open (it is the caller's)."""
        self.stop_ttl_sweeper()

    def __enter__(self) -> VictorActorsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
