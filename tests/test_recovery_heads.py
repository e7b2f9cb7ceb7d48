"""A scope is never loaded short of its head without a report (issue 28, item 6).

Damage is real: bytes flipped in ``data.mdb`` on the pages of the ``log``
database (found with ``lmdb_pages``), then the store opened through LMDB.
Each test whose docstring starts "Old code" failed on the code before this
work (checked with PYTHONPATH pointing at a checkout of aa8bb61, and again at
main's 77cc008, run from outside this checkout); the docstring says how.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import lmdb
import msgpack
import pytest
from lmdb_pages import key_spans

from victor_actors import CheckpointCorruptError, GlobalStateManager, ScopeRef, TransitionBatch
from victor_actors.store import versioned_key

TESTS = Path(__file__).parent
COMMITS = {f"c{c}": 8 for c in range(6)}  # checkpoints at 5: commits 6..8 live only in the log


def _make_store(path: Path, commits: dict[str, int] = COMMITS, every: int = 5) -> None:
    with GlobalStateManager.open(path, checkpoint_every=every) as manager:
        for name, n in commits.items():
            conv = manager.get_conversation_state(name, team_id="t")
            for i in range(n):
                conv.apply(TransitionBatch().add_message(f"{name} m{i}").update_state("i", i))


def _flip_key(path: Path, key: bytes, at: int, *, leaf: bool = True) -> None:
    """Flip bit 0 of byte ``at`` of ``key`` where it sits on a page of the ``log`` database."""
    data = path / "data" / "data.mdb"
    (span,) = [s for s in key_spans(data, "log") if s.key == key and s.leaf == leaf]
    raw = bytearray(data.read_bytes())
    raw[span.offset + at] ^= 1
    data.write_bytes(raw)


def _env(path: Path) -> lmdb.Environment:
    return lmdb.open(str(path / "data"), max_dbs=10, map_size=1 << 30)


def test_a_flipped_byte_in_the_previous_scopes_key_does_not_hide_the_next_scopes_head(
    tmp_path: Path,
) -> None:
    """Old code: conversation c1 loaded cleanly at version 5 (its checkpoint), without its head
    and its acknowledged commits 6 to 8, because one bit of c0's newest log key was flipped."""
    _make_store(tmp_path)
    c0 = ScopeRef("conversation", "c0")
    _flip_key(tmp_path, versioned_key(c0, 8), 1)  # the id length's high byte: the key sorts far away
    for read_only in (True, False):
        with GlobalStateManager.open(tmp_path, read_only=read_only) as manager:
            for name in ("c1", "c2", "c3", "c4", "c5"):
                snap = manager.scope(f"conversation:{name}").snapshot()
                assert snap.version == 8 and list(snap.messages) == [f"{name} m{i}" for i in range(8)]
            assert {r.ref for r in manager.recovery_reports} <= {c0}


def test_a_flipped_byte_in_a_branch_key_does_not_hide_heads_below_it(tmp_path: Path) -> None:
    """Old code: with one bit of the log's branch key flipped, every scope on the leaf the search
    was sent past loaded cleanly at version 5, without its commits 6 to 8."""
    _make_store(tmp_path)
    branch = [s for s in key_spans(tmp_path / "data" / "data.mdb", "log") if not s.leaf]
    assert branch, "the log needs more than one page for this test"
    for at in range(4):
        copy = tmp_path / f"copy{at}"
        shutil.copytree(tmp_path / "data", copy / "data")
        _flip_key(copy, branch[0].key, at, leaf=False)
        with GlobalStateManager.open(copy, read_only=True) as manager:
            for name, n in COMMITS.items():
                assert manager.scope(f"conversation:{name}").version == n, (at, name)
            assert not manager.recovery_reports


def _hide(path: Path, ref: ScopeRef, versions: list[int]) -> None:
    """Move ``ref``'s head and the log records at ``versions`` out of its key range (as damage
    that no reader could see past would): their bytes stay in the store, unseen."""
    prefix = versioned_key(ref, 0)[:-8]
    env = _env(path)
    try:
        log = env.open_db(b"log")
        with env.begin(write=True, db=log) as txn:
            for key in [prefix + b"\0" * 8] + [versioned_key(ref, v) for v in versions]:
                raw = txn.get(key)
                assert raw is not None
                txn.delete(key)
                txn.put(b"\xfe" + key, raw)  # no scope key starts with fe
    finally:
        env.close()


def test_a_scope_whose_head_cannot_be_found_is_reported_and_never_served_for_writing(
    tmp_path: Path,
) -> None:
    """Old code: c1 loaded cleanly at version 5; a commit made then was acknowledged at version 6
    over the hidden acknowledged commit 6, and the next open lost it the same way."""
    _make_store(tmp_path)
    c1 = ScopeRef("conversation", "c1")
    _hide(tmp_path, c1, [6, 7, 8])
    with GlobalStateManager.open(tmp_path) as manager:
        for _ in range(2):  # refused on every attempt, and nothing is written meanwhile
            with pytest.raises(CheckpointCorruptError, match="no head record") as info:
                manager.scope(c1)
            assert info.value.ref == c1
        report = manager.recovery_reports[-1]
        assert report.ref == c1 and not report.head_found and not report.clean
        assert report.version == 5 and "not loaded" in str(info.value)
        assert manager.scope("conversation:c2").set("still", "served").version == 9
    with GlobalStateManager.open(tmp_path, read_only=True) as manager:
        snap = manager.scope(c1).snapshot()  # read-only: shown as far as it can be, with a report
        assert snap.version == 5
        (report,) = manager.recovery_reports
        assert not report.head_found and any("no head record" in s for s in report.skipped)
    assert _quarantined(tmp_path) == 0  # nothing of c1 was moved or overwritten


def _quarantined(path: Path) -> int:
    env = _env(path)
    try:
        with env.begin(db=env.open_db(b"quarantine")) as txn:
            return int(txn.stat()["entries"])
    finally:
        env.close()


def test_a_new_scope_has_a_head_from_its_first_transaction(tmp_path: Path) -> None:
    """A scope never committed to is not "a scope without a head": its record comes with head 0,
    so one whose head is missing is known to be damaged."""
    with GlobalStateManager.open(tmp_path) as manager:
        manager.get_conversation_state("empty", team_id="t")
        manager.flush()
        store = manager.store
        assert store is not None
        assert store.head(ScopeRef("conversation", "empty")) == 0
        assert store.head(ScopeRef("team", "t")) == 0
    with GlobalStateManager.open(tmp_path) as manager:
        assert manager.scope("conversation:empty").version == 0 and not manager.recovery_reports


def test_manual_durability_and_forks_move_the_head_with_their_checkpoints(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path, durability="manual") as manager:
        conv = manager.get_conversation_state("c")
        for i in range(4):
            conv.set("i", i)
        cid = manager.save_checkpoint(conv.ref)
        manager.fork(conv.ref, cid, "c-fork")
        store = manager.store
        assert store is not None
        assert store.head(conv.ref) == 4 and store.head(ScopeRef("conversation", "c-fork")) == 4
    with GlobalStateManager.open(tmp_path) as manager:
        assert manager.scope("conversation:c").version == 4
        assert manager.scope("conversation:c-fork").get("i") == 3
        assert not manager.recovery_reports


def test_a_format_2_store_opens_and_gives_its_uncommitted_scopes_a_head(tmp_path: Path) -> None:
    """A store written before format 3 has heads only for scopes that committed: read-only it opens
    as before; a writable open gives the others a head at 0 and moves it to format 3."""
    with GlobalStateManager.open(tmp_path, checkpoint_every=3) as manager:
        manager.get_conversation_state("never", team_id="t")
        _fill = manager.get_conversation_state("busy", team_id="t")
        for i in range(7):
            _fill.set("i", i)
    env = _env(tmp_path)
    try:
        log, meta = env.open_db(b"log"), env.open_db(b"meta")
        with env.begin(write=True) as txn:
            for ref in (
                ScopeRef("conversation", "never"),
                ScopeRef("team", "t"),
                ScopeRef("global", "global"),
            ):
                assert txn.delete(versioned_key(ref, 0), db=log)  # as format 2 wrote no head for them
            record = msgpack.unpackb(txn.get(b"format", db=meta))
            txn.put(b"format", msgpack.packb({**record, "format": 2}), db=meta)
    finally:
        env.close()
    with GlobalStateManager.open(tmp_path, read_only=True) as manager:
        assert manager.scope("conversation:never").version == 0
        assert manager.scope("conversation:busy").get("i") == 6
        assert not manager.recovery_reports
    with GlobalStateManager.open(tmp_path) as manager:
        store = manager.store
        assert store is not None and store.headed
        assert store.head(ScopeRef("conversation", "never")) == 0
        assert manager.scope("conversation:busy").set("i", 7).version == 8
        assert not manager.recovery_reports


# Seeds per open: disjoint, so the two opens see different damage. On the old code each range
# held seeds that loaded a scope short of its head with no report (read-only: 30, 32, 34;
# writable: 152, 174, 184, 186, 194).
DAMAGE_SEEDS = {True: range(0, 60), False: range(150, 210)}


def test_random_key_damage_on_log_pages_never_loads_a_scope_short_without_a_report(
    tmp_path: Path,
) -> None:
    """Old code (main at 77cc008): 3 of the 60 read-only seeds and 5 of the 60 writable ones
    loaded a scope short of its head with no report (over 150 seeds per open: 9 loads read-only,
    26 writable, and 2 writable children died of SIGBUS). Each seed flips 1 to 4 bits of a copy
    of a 12-scope store: of keys on the log's pages (leaves and branches) for even seeds, of any
    byte of those pages for odd ones; then it opens the copy (read-only or writable) and reads
    every scope: each must load at its acknowledged head with exactly its messages, or be
    reported, or raise a typed error. In a child process, since a damaged page is read through
    LMDB's C code (a crash fails the test too)."""
    commits = {f"c{c}": 8 + c % 3 for c in range(12)}
    _make_store(tmp_path / "src", commits)
    GlobalStateManager.open(tmp_path / "src").close()  # a writable open leaves zeros past the end
    seeds = {ro: (r.start, r.stop) for ro, r in DAMAGE_SEEDS.items()}
    script = textwrap.dedent(
        f"""
        import random, shutil, sys, tempfile
        from pathlib import Path
        sys.path.insert(0, {str(TESTS)!r})
        from lmdb_pages import key_spans, page_size
        from victor_actors import GlobalStateManager, ScopeRef, VictorActorsError
        src = Path({str(tmp_path / "src")!r})
        commits = {commits!r}
        spans = key_spans(src / "data" / "data.mdb", "log")
        pages = sorted({{s.page for s in spans}})
        psize = page_size(src / "data" / "data.mdb")
        assert len(pages) >= 3, "the log must span several pages"
        for read_only, (first, stop) in {seeds!r}.items():
            outcomes = {{"at head": 0, "reported": 0, "typed error": 0}}
            for seed in range(first, stop):
                rng = random.Random(seed)
                dst = Path(tempfile.mkdtemp())
                shutil.copytree(src, dst, dirs_exist_ok=True)
                data = dst / "data" / "data.mdb"
                raw = bytearray(data.read_bytes())
                for _ in range(rng.randint(1, 4)):
                    if seed % 2 == 0:  # a key's byte: what misleads LMDB's search
                        span = rng.choice(spans)
                        at = span.offset + rng.randrange(len(span.key))
                    else:  # any byte of a log page: headers, node offsets and sizes, values
                        at = rng.choice(pages) * psize + rng.randrange(psize)
                    raw[at] ^= 1 << rng.randrange(8)
                data.write_bytes(raw)
                try:
                    with GlobalStateManager.open(dst, read_only=read_only) as m:
                        for name, n in commits.items():
                            ref = ScopeRef("conversation", name)
                            try:
                                snap = m.scope(ref).snapshot()
                            except VictorActorsError:
                                outcomes["typed error"] += 1
                                continue
                            got = list(snap.messages)
                            want = [f"{{name}} m{{i}}" for i in range(snap.version)]
                            assert got == want, (read_only, seed, name, got)
                            reported = any(r.ref == ref and not r.clean for r in m.recovery_reports)
                            if snap.version < n:
                                assert reported, ("short of its head, no report", read_only, seed, name)
                                outcomes["reported"] += 1
                            else:
                                outcomes["at head"] += 1
                except VictorActorsError:
                    outcomes["typed error"] += 1
                shutil.rmtree(dst)
            print("read-only" if read_only else "writable", outcomes)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    print(done.stdout)  # what the damage did: loads at head, reported, typed errors
