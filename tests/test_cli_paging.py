"""``victor-actors inspect`` a page at a time: ``--limit``, ``--after``, ``--level``, ``--prefix``.

On real LMDB stores (plaintext and encrypted) of 256 scopes: following the
``next page:`` line from the first page to the last visits every scope
exactly once, in the same order as one page holding them all; the filters
list the matching scopes in key order; bad options are one-line errors with
status 2. And paged views never read every scope record: with
``Store.scope_records`` made to fail, they still work (that is the O(page)
property, checked without timing anything).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

from victor_actors import GlobalStateManager, Keyring, ScopeRef, StateScope
from victor_actors.cli import _commands, main
from victor_actors.store import ScopeRecord, Store

GLOBAL = ScopeRef(StateScope.GLOBAL, "global")
RING = Keyring({"k1": bytes(range(32))}, active="k1")
CONVERSATIONS = 250  # ids c0..c249: lengths 2 to 4 interleave, so key order is not string order


def tree() -> list[ScopeRecord]:
    """global; teams t0, t1; workflows t0-w0, t0-w1 (under t0), t1-w0; 250 conversations under them."""
    teams = [ScopeRef(StateScope.TEAM, f"t{t}") for t in range(2)]
    flows = [(ScopeRef(StateScope.WORKFLOW, f"t{t}-w{w}"), teams[t]) for t, w in ((0, 0), (0, 1), (1, 0))]
    out = [ScopeRecord(GLOBAL, (), 1.0)]
    out += [ScopeRecord(team, (GLOBAL,), 1.0) for team in teams]
    out += [ScopeRecord(flow, (team, GLOBAL), 1.0) for flow, team in flows]
    for c in range(CONVERSATIONS):
        ref = ScopeRef(StateScope.CONVERSATION, f"c{c}")
        if c % 4 == 0:  # directly under a team
            out.append(ScopeRecord(ref, (teams[c % 2], GLOBAL), 1.0))
        else:
            flow, team = flows[c % 3]
            out.append(ScopeRecord(ref, (flow, team, GLOBAL), 1.0))
    return out


RECORDS = tree()


def build(path: Path, keyring: Keyring | None = None, records: list[ScopeRecord] = RECORDS) -> None:
    """The scope records in a few write transactions, then some commits through a manager."""
    store = Store(path, encryption=keyring)
    try:
        for i in range(0, len(records), 100):
            store.submit([store.op_put_scope(r) for r in records[i : i + 100]], wait=True)
    finally:
        store.close()
    with GlobalStateManager.open(path, encryption=keyring, checkpoint_every=2) as m:
        for i in range(3):
            m.scope("conversation:c7").set("i", i)
        m.scope("team:t1").set("goal", "ship")


@pytest.fixture(scope="module", params=["plain", "encrypted"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """``[PATH]``, or ``[PATH, --key-file, FILE]`` for the encrypted store."""
    home = tmp_path_factory.mktemp(f"paging-{request.param}")
    if request.param == "plain":
        build(home / "store")
        yield [str(home / "store")]
    else:
        build(home / "store", RING)
        RING.write_file(home / "keys.json")
        yield [str(home / "store"), "--key-file", str(home / "keys.json")]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def table(out: str) -> list[tuple[str, int]]:
    """The SCOPE column of inspect's table: each ref with its indent (in steps of two spaces)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("SCOPE "))
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith(("recovery", "note:", "next page:")):
            break
        name = line.split()[0]
        rows.append((name, (len(line) - len(line.lstrip())) // 2))
    return rows


def next_page(out: str) -> list[str] | None:
    """The arguments of the ``next page:`` line (without the program name), or None on the last page."""
    hints = [line for line in out.splitlines() if line.startswith("next page: ")]
    if not hints:
        return None
    (hint,) = hints
    argv = shlex.split(hint.removeprefix("next page: "))
    assert argv[0] == "victor-actors"
    return argv[1:]


def pages(capsys: pytest.CaptureFixture[str], *argv: str) -> list[list[tuple[str, int]]]:
    """Every page, from ``inspect ARGV`` on through each page's ``next page:`` line."""
    out: list[list[tuple[str, int]]] = []
    args: list[str] | None = ["inspect", *argv]
    while args is not None:
        code, text, err = run(capsys, *args)
        assert code == 0 and err == "", err
        out.append(table(text))
        args = next_page(text)
        assert len(out) < 100
    return out


def key_order(store: list[str]) -> Store:
    """The store, opened read-only, for its key layout (``layout.ref_key``)."""
    return Store(store[0], read_only=True, encryption=RING if len(store) > 1 else None)


def expected_tree(layout_store: Store) -> list[tuple[str, int]]:
    """The scope tree in pre-order, children in key order, with depths."""
    kids: dict[ScopeRef | None, list[ScopeRef]] = {}
    for r in RECORDS:
        kids.setdefault(r.lineage[0] if r.lineage else None, []).append(r.ref)
    out: list[tuple[str, int]] = []

    def walk(parent: ScopeRef | None, depth: int) -> None:
        for ref in sorted(kids.get(parent, []), key=layout_store.layout.ref_key):
            out.append((str(ref), depth))
            walk(ref, depth + 1)

    walk(None, 0)
    return out


def test_following_the_hints_visits_the_tree_once_in_order(
    store: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    got = pages(capsys, *store, "--limit", "40")
    assert [len(p) for p in got] == [40] * 6 + [len(RECORDS) - 240]
    flat = [row for page in got for row in page]
    assert len(flat) == len(RECORDS) == len({ref for ref, _ in flat})
    layout = key_order(store)
    try:
        assert flat == expected_tree(layout)
    finally:
        layout.close()
    (whole,) = pages(capsys, *store, "--limit", "1000")
    assert whole == flat
    _, out, _ = run(capsys, "inspect", *store, "--limit", "40")
    assert out.splitlines()[0].endswith(f": {len(RECORDS)} scopes; the first 40 shown (tree order)")
    assert "recovery: every scope listed loaded cleanly" in out
    assert out.splitlines()[-1].startswith("next page: victor-actors inspect ")


def test_a_page_resumes_after_a_scope_with_its_children_first(
    store: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    (rest,) = pages(capsys, *store, "--after", "team:t1", "--limit", "0")
    layout = key_order(store)
    try:
        tree_rows = expected_tree(layout)
    finally:
        layout.close()
    at = tree_rows.index(("team:t1", 1))
    assert rest == tree_rows[at + 1 :]
    assert rest[0][1] == 2  # a child of team:t1 (the tree is walked in pre-order)
    code, out, _ = run(capsys, "inspect", *store, "--after", "team:t1", "--limit", "3")
    assert code == 0 and "3 shown (after team:t1; tree order)" in out.splitlines()[0]
    assert next_page(out) == ["inspect", *store, "--limit", "3", "--after", rest[2][0]]


def test_the_level_filter_lists_one_level_in_key_order(
    store: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    got = pages(capsys, *store, "--level", "conversation", "--limit", "40")
    assert [len(p) for p in got] == [40] * 6 + [10]
    flat = [row for page in got for row in page]
    assert all(depth == 0 for _, depth in flat)
    layout = key_order(store)
    try:
        want = sorted((r.ref for r in RECORDS if r.ref.scope == "conversation"), key=layout.layout.ref_key)
    finally:
        layout.close()
    assert [ref for ref, _ in flat] == [str(r) for r in want]
    code, out, _ = run(capsys, "inspect", *store, "--level", "team")
    assert code == 0 and sorted(ref for ref, _ in table(out)) == ["team:t0", "team:t1"]
    assert next_page(out) is None and "level team; key order" in out.splitlines()[0]
    code, out, _ = run(capsys, "inspect", *store, "--level", "team", "--limit", "1")
    assert code == 0 and len(table(out)) == 1
    last = table(out)[0][0]
    assert next_page(out) == ["inspect", *store, *"--limit 1 --level team --after".split(), last]


def test_the_prefix_filter_with_and_without_a_level(
    store: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    got = pages(capsys, *store, "--level", "conversation", "--prefix", "c1", "--limit", "50")
    refs = [ref for page in got for ref, _ in page]
    want = {f"conversation:c{c}" for c in range(CONVERSATIONS) if str(c).startswith("1")}
    assert len(refs) == len(want) == 111 and set(refs) == want
    assert [len(p) for p in got] == [50, 50, 11]
    if len(store) == 1:  # plaintext: key order is level, id length, id
        assert refs[:3] == ["conversation:c1", "conversation:c10", "conversation:c11"]
    (any_level,) = pages(capsys, *store, "--prefix", "t1")
    assert [ref for ref, _ in any_level] == ["team:t1", "workflow:t1-w0"]  # level order
    (none,) = pages(capsys, *store, "--level", "team", "--prefix", "c")
    assert none == []


def test_versions_and_checkpoints_are_shown_on_a_page(
    store: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "inspect", *store, "--level", "conversation", "--prefix", "c7", "--limit", "0")
    assert code == 0 and len(table(out)) == 11 and next_page(out) is None
    (line,) = [line for line in out.splitlines() if line.startswith("conversation:c7 ")]
    assert line.split()[1:5] == ["3", "1", "(newest", "v2)"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--limit", "-1"], "--limit takes a number of rows (0: all), not '-1'"),
        (["--limit", "ten"], "--limit takes a number of rows"),
        (["--after", "c1"], "--after takes a scope ref"),
        (["--after", "galaxy:c1"], "--after takes a scope ref"),
        (["--after", "conversation:"], "--after takes a scope ref"),
        (["--level", "galaxy"], "--level takes one of global, team, workflow, conversation, not 'galaxy'"),
        (["--level", "team", "--after", "conversation:c1"], "--after conversation:c1 is not of --level team"),
        (["--after", "conversation:c999"], "--after conversation:c999: no scope conversation:c999 exists"),
    ],
)
def test_bad_options_are_one_line_errors_with_status_2(
    store: list[str], capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, "inspect", *store, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("victor-actors: error: ") and message in err, err


def test_paged_views_never_read_every_scope_record(
    store: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def everything(self: Store) -> list[ScopeRecord]:
        raise AssertionError("a paged view read every scope record")

    monkeypatch.setattr(Store, "scope_records", everything)
    monkeypatch.setattr(_commands, "SCAN_ALL", 10)  # did_you_mean: this store counts as a big one
    assert len(pages(capsys, *store, "--limit", "60")) == 5
    assert sum(map(len, pages(capsys, *store, "--level", "conversation", "--limit", "100"))) == CONVERSATIONS
    assert sum(map(len, pages(capsys, *store, "--prefix", "c2", "--limit", "30"))) == 61
    code, out, err = run(capsys, "inspect", *store)  # the default limit: 200 of the 256
    assert code == 0 and next_page(out) is not None and len(table(out)) == _commands.DEFAULT_LIMIT
    code, _, err = run(capsys, "show", *store, "conversation:c7x")
    assert code == 2 and "no scope conversation:c7x exists" in err
    if len(store) == 1:  # plaintext keys hold the ids: near misses are found from a few pages
        assert "did you mean conversation:c7" in err
    code, _, err = run(capsys, "show", *store, "team:T1")  # another case: a lookup, in either layout
    assert code == 2 and "did you mean team:t1" in err
    with pytest.raises(AssertionError, match="read every scope record"):
        main(["inspect", *store, "--limit", "0"])  # the whole tree at once, as before


# -- small stores look as they did; damaged and older ones -------------------------------------------------


def test_a_small_store_prints_the_same_tree_as_limit_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with GlobalStateManager.open(tmp_path, checkpoint_every=5) as m:
        m.get_team_state("t1").set("goal", "ship")
        m.get_workflow_state("wf1", team_id="t1").set("step", 1)
        m.get_conversation_state("c1", workflow_id="wf1", team_id="t1").set("k", 1)
        conv = m.get_conversation_state("c2", team_id="t1")
        for i in range(6):
            conv.set("i", i)
    code, paged, _ = run(capsys, "inspect", str(tmp_path))
    assert code == 0
    code, whole, _ = run(capsys, "inspect", str(tmp_path), "--limit", "0")
    assert code == 0 and paged == whole
    assert paged.splitlines()[0].endswith(": 5 scopes") and "recovery: every scope loaded cleanly" in paged
    assert "next page" not in paged


def test_scopes_whose_parent_has_no_record_are_shown_at_the_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lost = ScopeRef(StateScope.WORKFLOW, "gone")
    team = ScopeRef(StateScope.TEAM, "t")
    records = [
        ScopeRecord(GLOBAL, (), 1.0),
        ScopeRecord(team, (GLOBAL,), 1.0),
        *(
            ScopeRecord(ScopeRef(StateScope.CONVERSATION, f"o{i}"), (lost, team, GLOBAL), 1.0)
            for i in range(3)
        ),
    ]
    store = Store(tmp_path)
    store.submit([store.op_put_scope(r) for r in records], wait=True)
    store.close()
    code, paged, err = run(capsys, "inspect", str(tmp_path))
    code0, whole, err0 = run(capsys, "inspect", str(tmp_path), "--limit", "0")
    assert (code, paged, err) == (code0, whole, err0)
    assert code == 2 and "3 scope(s) could not be loaded" in err  # their ancestor is missing
    orphans = [(f"conversation:o{i}", 0) for i in range(3)]
    assert table(paged) == [("global:global", 0), ("team:t", 1), *orphans]
    assert "conversation:o0's ancestor workflow:gone is missing from the store" in paged
    code, out, _ = run(capsys, "inspect", str(tmp_path), "--limit", "2")  # more scopes than the page
    assert code == 0 and table(out) == [("global:global", 0), ("team:t", 1)]
    assert "note: 3 stored scope(s) are not under the tree" in out and next_page(out) is None
    assert "recovery: every scope listed loaded cleanly" in out
    code, out, _ = run(capsys, "inspect", str(tmp_path), "--level", "conversation")
    assert [ref for ref, _ in table(out)] == ["conversation:o0", "conversation:o1", "conversation:o2"]


def test_a_store_from_before_the_children_index_still_pages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build(tmp_path)
    env = lmdb.open(str(tmp_path / "data"), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(b"children", txn=txn), delete=True)
    env.close()
    got = pages(capsys, str(tmp_path), "--limit", "50")
    flat = [row for page in got for row in page]
    assert len(got) == 6 and len(flat) == len(RECORDS) == len(set(flat))
    layout = Store(tmp_path, read_only=True)
    try:
        assert not layout.indexed
        assert flat == expected_tree(layout)
    finally:
        layout.close()
