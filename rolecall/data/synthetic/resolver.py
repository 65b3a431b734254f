"""Re-derive a synthetic question's answer from the entity graph, independently of how the question was generated.

Every synthetic :class:`~rolecall.data.types.Example` carries ``metadata["program"]``; :func:`resolve` runs it and
raises when the answer is not unique (a tie in a comparison, an intersection with zero or several members).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rolecall.data.synthetic.entities import Entity
from rolecall.errors import DataFormatError

__all__ = ["resolve"]


def _value(entities: Mapping[str, Entity], key: str, path: list[str]) -> Any:
    entity = entities[key]
    for name in path[:-1]:
        entity = entities[entity.attrs[name]]
    return entity.attrs[path[-1]]


def _text(entities: Mapping[str, Entity], value: Any, relation_name: str) -> str:
    if isinstance(value, str) and value in entities:
        return entities[value].name
    if relation_name == "population":
        return f"{value:,}"
    return str(value)


def resolve(entities: Mapping[str, Entity], program: dict[str, Any]) -> str:
    """The unique answer of ``program`` over ``entities``.

    Programs:
        ``{"op": "chain", "start": key, "path": [relation, ...]}``: follow the relations; the last may be literal.
        ``{"op": "compare", "entities": [a, b], "path": [...], "pick": "min" | "max"}``: the name of the entity whose
        path value is smaller / larger.
        ``{"op": "same", "entities": [a, b], "path": [...]}``: ``"yes"`` if both path values are equal, else ``"no"``.
        ``{"op": "intersect", "entities": [a, b], "relation": r}``: the one name in both lists.

    Raises:
        DataFormatError: for an unknown op, or when the answer is not unique.

    Example:
        >>> from rolecall.data.synthetic.entities import EntityGraph
        >>> g = EntityGraph(); c = g.add("city", "Tavrimo", population=120000)
        >>> resolve(g, {"op": "chain", "start": c.key, "path": ["population"]})
        '120,000'
    """
    op = program.get("op")
    if op == "chain":
        path = program["path"]
        return _text(entities, _value(entities, program["start"], path), path[-1])
    if op in ("compare", "same"):
        a, b = program["entities"]
        va, vb = _value(entities, a, program["path"]), _value(entities, b, program["path"])
        if op == "same":
            return "yes" if va == vb else "no"
        if va == vb:
            raise DataFormatError(f"comparison {program} is a tie ({va!r}); its answer is not unique")
        smaller = a if va < vb else b
        larger = b if smaller == a else a
        return entities[smaller if program["pick"] == "min" else larger].name
    if op == "intersect":
        a, b = (entities[k].attrs.get(program["relation"]) or [] for k in program["entities"])
        common = [k for k in a if k in b]
        if len(common) != 1:
            raise DataFormatError(f"intersection {program} has {len(common)} members; it must have exactly one")
        return entities[common[0]].name
    raise DataFormatError(f"unknown program op {op!r}; expected one of chain, compare, same, intersect")
