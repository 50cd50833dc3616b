"""Delta messaging (reference G.5): merging a delta publish into a record, and the
changed fields a delta subscription receives. Pure functions over decoded JSON.

Rules:

1. **Merge** (:func:`merge`): a field present in the update replaces the stored one,
   even when equal; a field not stored yet is added; a field absent from the update
   is kept (a delta publish cannot remove a field). Nested objects merge field by
   field, recursively; an array replaces the stored array whole; JSON ``null`` is
   stored as null (the field stays); an empty object changes nothing.
2. **Changes** (:func:`changes`): compared leaf by leaf; a changed leaf is sent with the
   objects around it (holding only what changed); an array that changed is sent
   whole. A field that disappeared is not reported (a record update that drops a
   field changes no field the subscriber can merge).
3. The fields a delta always carries (the record's key fields, or a view's grouping
   fields) are added by :func:`with_fields`, whether they changed or not.
"""

from __future__ import annotations

from typing import Any

from conveyor.expr.projection import put_path


def merge(stored: Any, update: Any) -> Any:
    """Rule 1: ``update`` merged over ``stored`` (neither is changed)."""
    if not isinstance(stored, dict) or not isinstance(update, dict):
        return update
    out = dict(stored)
    for name, value in update.items():
        old = out.get(name)
        if isinstance(value, dict) and isinstance(old, dict):
            out[name] = merge(old, value)
        else:
            out[name] = value
    return out


_MISSING = object()


def changes(old: Any, new: Any) -> dict[str, object]:
    """Rule 2: the fields of ``new`` that differ from ``old`` (both JSON objects)."""
    out: dict[str, object] = {}
    if not isinstance(new, dict):
        return out
    old = old if isinstance(old, dict) else {}
    for name, value in new.items():
        before = old.get(name, _MISSING)
        if isinstance(value, dict) and isinstance(before, dict):
            inner = changes(before, value)
            if inner:
                out[name] = inner
        elif before is _MISSING or not _same(before, value):
            out[name] = value
    return out


def _same(a: Any, b: Any) -> bool:
    # JSON equality: 1 and 1.0 are the same number, true is not 1.
    if type(a) is bool or type(b) is bool:
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) in (int, float) and type(b) in (int, float) and a == b or (type(a) is type(b) and a == b)


def with_fields(delta: dict[str, object], record: Any, paths: tuple[tuple[str, ...], ...]) -> dict[str, object]:
    """Rule 3: ``delta`` plus the value in ``record`` of each of ``paths`` (a key field
    path as steps), whether it changed or not."""
    if not paths or not isinstance(record, dict):
        return delta
    out = delta
    for steps in paths:
        value: Any = record
        for s in steps:
            value = value.get(s, _MISSING) if isinstance(value, dict) else _MISSING
            if value is _MISSING:
                break
        if value is not _MISSING:
            put_path(out, steps, value)
    return out
