"""Reading one key range so that a damaged key elsewhere on its page cannot hide it.

LMDB finds a key by binary search: on each branch page down the tree, then
on the leaf. The pages carry no checksum, so one flipped bit in *another*
key (a neighbouring scope's last commit, or a branch key above) makes a
comparison lie, and the search ends beside that key instead of at the one
asked for: ``get`` says "not there" and ``set_range`` starts past the range
or before it. A scope's head record, or its whole log, then looks absent
while every byte of it is intact (docs/adr/0023).

The search can be misled; the order of the nodes cannot. Stepping a cursor
(``prev``/``next``) follows the nodes as they sit on their pages and the
pages as their parents list them, comparing nothing. So :func:`prefix_items`
seeks as usual, then walks back until it has passed ``MARGIN`` keys in a
row that sort before the range, and forward, collecting every key of the
range, until ``MARGIN`` keys in a row sort after it. In a sound tree that is
``MARGIN`` extra steps on each side; with one damaged key the walk steps
over it (a key out of order resets the count), and a search sent to a
neighbouring page is walked back from. Each direction stops after ``WALK``
steps, so damage far away cannot make a read cost more than that: a range
the walk still cannot find is reported by recovery (a scope without its head
is never loaded as complete), never trusted.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MARGIN", "WALK", "prefix_items"]

MARGIN = 2  # keys in a row beyond the range before a walk stops: steps over one damaged key
WALK = 4096  # the most steps a walk takes in each direction (about 20 leaf pages of log records)


def prefix_items(cur: Any, prefix: bytes, *, values: bool = True) -> list[tuple[bytes, bytes]]:
    """Every ``(key, value)`` under ``prefix`` of the cursor's database.

    ``cur`` is an open ``lmdb.Cursor``. With ``values`` False, values are
    ``b""``. The items are sorted by key (stable: a key met twice, as a put
    into a damaged page can leave a second node with the same key, is
    returned twice, in page order).
    """
    if not cur.set_range(prefix) and not cur.last():
        return []  # an empty database
    below = 0  # keys in a row that sort before the range
    steps = 0
    for key in cur.iterprev(keys=True, values=False):  # from the seek, back (page order)
        below = below + 1 if key < prefix else 0
        steps += 1
        if below >= MARGIN or steps >= WALK:
            break
    else:
        cur.first()  # walked back to the first key
    out: list[tuple[bytes, bytes]] = []
    above = 0  # keys in a row that sort after the range
    outside = 0  # steps over keys not in the range (the range itself is read whatever its length)
    for item in cur.iternext(keys=True, values=values):
        key = item[0] if values else item
        if key.startswith(prefix):
            out.append(item if values else (key, b""))
            above = 0
            continue
        outside += 1
        if key > prefix:
            above += 1
            if above >= MARGIN:
                break
        if outside >= WALK:
            break
    out.sort(key=_first)
    return out


def _first(item: tuple[bytes, bytes]) -> bytes:
    return item[0]
