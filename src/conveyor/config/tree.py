"""The XML document as a tree of elements with paths and line numbers, and typed reads.

Rules this module keeps for every section reader:

- Element names are case-sensitive (as in AMPS). Attributes, DOCTYPEs and entity
  declarations are refused; comments and processing instructions are ignored.
- A container declares its children with a cardinality (:data:`OPTIONAL`,
  :data:`REQUIRED`, :data:`MANY`, :data:`REQUIRED_MANY`). An unknown child, a second
  copy of a singleton, or a missing required child is a :class:`ConfigError`; an
  unknown name gets a hint with the nearest known names.
- An element path names each element by its tag; repeatable elements always carry
  their 1-based position among same-named siblings: ``AMPSConfig/SOW/Queue[2]/Name``.
- Values are the element's text with surrounding whitespace removed and ``${VAR}``
  expanded (see :mod:`conveyor.config.env`). An empty value is refused.
- Every error names the element path, and the source and line where the element starts.
"""

from __future__ import annotations

import difflib
import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar
from xml.parsers import expat

from conveyor.config._invalid import Invalid
from conveyor.config.env import expanded
from conveyor.config.units import duration_s, size_bytes
from conveyor.errors import ConfigError

OPTIONAL = "optional"  # at most once
REQUIRED = "required"  # exactly once
MANY = "many"  # any number of times
REQUIRED_MANY = "required-many"  # at least once

E = TypeVar("E", bound=enum.Enum)

# Counts in the configuration are backlogs, depths and retry limits; anything past a
# signed 64-bit integer is a typo (and would not fit the journal's fields).
COUNT_MAX = 2**63 - 1

_BOOLEANS = {"true": True, "false": False}
_INTEGER = re.compile(r"[0-9]+")


@dataclass(eq=False)
class Node:
    """One XML element: its tag, where it starts, its text and child elements."""

    tag: str
    line: int
    column: int  # 1-based
    children: list[Node] = field(default_factory=list)
    chunks: list[str] = field(default_factory=list)
    path: str = ""  # given by the reader that knows whether the element repeats

    @property
    def raw_text(self) -> str:
        return "".join(self.chunks)


class Children:
    """The checked children of a container, by tag, in document order."""

    def __init__(self, by_tag: dict[str, list[Node]], ordered: list[Node]) -> None:
        self._by_tag = by_tag
        self._ordered = ordered

    def all(self) -> list[Node]:
        """Every child, in document order (for sections mixing several tags)."""
        return list(self._ordered)

    def one(self, tag: str) -> Node | None:
        nodes = self._by_tag.get(tag, ())
        return nodes[0] if nodes else None

    def many(self, tag: str) -> list[Node]:
        return list(self._by_tag.get(tag, ()))

    def __contains__(self, tag: str) -> bool:
        return bool(self._by_tag.get(tag))


class Document:
    """A parsed configuration: the root node plus what errors need (source, lines)."""

    def __init__(self, root: Node, source: str, env: Mapping[str, str]) -> None:
        self.root = root
        self.source = source
        self.env = env
        self._where: dict[str, tuple[int, int]] = {}
        root.path = root.tag
        self._where[root.path] = (root.line, root.column)

    # --- errors ---------------------------------------------------------------------

    def error(self, path: str, message: str, hint: str = "") -> ConfigError:
        """A ConfigError at ``path``, its message ending with the source and line."""
        where = self._where.get(path)
        if where is None:  # a path below any element (cannot happen for readers here)
            return ConfigError(f"{message} ({self.source})", path=path, hint=hint)
        line, column = where
        return ConfigError(
            f"{message} ({self.source}, line {line}, column {column})", path=path, hint=hint
        )

    # --- structure ------------------------------------------------------------------

    def children(
        self,
        node: Node,
        spec: Mapping[str, str],
        refused: Mapping[str, str] | None = None,
    ) -> Children:
        """Check ``node``'s children against ``spec`` (tag -> cardinality)."""
        self._no_text(node)
        counts: dict[str, int] = {}
        by_tag: dict[str, list[Node]] = {}
        for child in node.children:
            n = counts[child.tag] = counts.get(child.tag, 0) + 1
            cardinality = spec.get(child.tag)
            repeats = cardinality in (MANY, REQUIRED_MANY) or n > 1
            child.path = f"{node.path}/{child.tag}[{n}]" if repeats else f"{node.path}/{child.tag}"
            self._where[child.path] = (child.line, child.column)
            if cardinality is None:
                if refused and child.tag in refused:
                    raise self.error(
                        child.path,
                        f"<{child.tag}> is not supported in <{node.tag}>",
                        refused[child.tag],
                    )
                raise self.error(
                    child.path,
                    f"unknown element <{child.tag}> in <{node.tag}>",
                    _nearest_hint(child.tag, spec),
                )
            if n > 1 and cardinality in (OPTIONAL, REQUIRED):
                raise self.error(
                    child.path,
                    f"<{child.tag}> appears more than once in <{node.tag}>",
                    f"give <{child.tag}> once",
                )
            by_tag.setdefault(child.tag, []).append(child)
        for tag, cardinality in spec.items():
            if cardinality in (REQUIRED, REQUIRED_MANY) and tag not in by_tag:
                raise self.error(
                    node.path,
                    f"<{node.tag}> is missing the required element <{tag}>",
                    f"add <{tag}>...</{tag}> inside <{node.tag}>",
                )
        return Children(by_tag, list(node.children))

    def _no_text(self, node: Node) -> None:
        if node.raw_text.strip():
            raise self.error(
                node.path,
                f"<{node.tag}> holds elements, not text (found {node.raw_text.strip()[:40]!r})",
                f"put the value inside one of the child elements of <{node.tag}>",
            )

    # --- values ---------------------------------------------------------------------

    def text(self, node: Node) -> str:
        """The element's value: stripped, ``${VAR}`` expanded, never empty."""
        if node.children:
            raise self.error(
                node.path,
                f"<{node.tag}> takes a value, not elements (found <{node.children[0].tag}>)",
                f"write <{node.tag}>value</{node.tag}>",
            )
        try:
            value = expanded(node.raw_text.strip(), self.env).strip()
        except Invalid as e:
            raise self.error(node.path, e.message, e.hint) from None
        if not value:
            raise self.error(node.path, f"<{node.tag}> is empty", f"give <{node.tag}> a value")
        return value

    def duration(self, node: Node, *, positive: bool = True) -> float:
        value = self._read(node, duration_s)
        if positive and value <= 0:
            raise self.error(
                node.path,
                f"<{node.tag}> must be longer than zero",
                "give a positive duration such as 30s, or leave the element out",
            )
        return value

    def size(self, node: Node, *, positive: bool = True) -> int:
        value = self._read(node, size_bytes)
        if positive and value <= 0:
            raise self.error(
                node.path,
                f"<{node.tag}> must be larger than zero",
                "give a positive size such as 64K, or leave the element out",
            )
        return value

    def positive_int(self, node: Node) -> int:
        text = self.text(node)
        if not _INTEGER.fullmatch(text):
            raise self.error(
                node.path,
                f"<{node.tag}> must be a whole number, not {text!r}",
                "write a positive integer such as 10 (no units, signs or separators)",
            )
        value = int(text)
        if value <= 0:
            raise self.error(
                node.path,
                f"<{node.tag}> must be a positive integer, not {value}",
                "write a positive integer, or leave the element out for no limit",
            )
        if value > COUNT_MAX:
            raise self.error(
                node.path,
                f"<{node.tag}> of {value} is too large (at most {COUNT_MAX})",
                "write a positive integer that fits in 64 bits, or leave the element out",
            )
        return value

    def boolean(self, node: Node) -> bool:
        return self.choice(node, _BOOLEANS)

    def choice(self, node: Node, choices: Mapping[str, object]) -> object:
        """One of ``choices`` (keys compared without regard to case)."""
        text = self.text(node)
        for key, value in choices.items():
            if key.lower() == text.lower():
                return value
        raise self.error(
            node.path,
            f"{text!r} is not a valid <{node.tag}>",
            "use one of: " + ", ".join(choices),
        )

    def enum(self, node: Node, cls: type[E]) -> E:
        return self.choice(node, {m.value: m for m in cls})  # type: ignore[return-value]

    def _read(self, node: Node, reader) -> float | int:
        text = self.text(node)
        try:
            return reader(text)
        except Invalid as e:
            raise self.error(node.path, e.message, e.hint) from None


def parse(text: str | bytes, source: str, env: Mapping[str, str]) -> Document:
    """Parse XML into a :class:`Document`; malformed XML reports line and column."""
    builder = _Builder()
    parser = expat.ParserCreate()
    parser.StartElementHandler = lambda tag, attrs: builder.start(parser, tag, attrs, source)
    parser.EndElementHandler = lambda tag: builder.end()
    parser.CharacterDataHandler = builder.data
    parser.StartDoctypeDeclHandler = lambda *a: builder.refuse_doctype(parser, source)
    parser.EntityDeclHandler = lambda *a: builder.refuse_doctype(parser, source)
    try:
        parser.Parse(text, True)
    except expat.ExpatError as e:
        raise ConfigError(
            f"malformed XML in {source}: {expat.ErrorString(e.code)} "
            f"at line {e.lineno}, column {e.offset + 1}",
            hint="fix the XML syntax at that position (unclosed or mismatched tags, "
            "a bare '&' or '<' in text: write &amp; and &lt;, or use CDATA)",
        ) from None
    assert builder.root is not None  # expat refuses a document with no element
    return Document(builder.root, source, env)


class _Builder:
    def __init__(self) -> None:
        self.root: Node | None = None
        self._stack: list[Node] = []

    def start(self, parser, tag: str, attrs: dict[str, str], source: str) -> None:
        node = Node(tag, parser.CurrentLineNumber, parser.CurrentColumnNumber + 1)
        if attrs:
            name = next(iter(attrs))
            raise ConfigError(
                f"<{tag}> has an attribute {name!r} ({source}, line {node.line}, "
                f"column {node.column})",
                hint="configuration elements take no attributes: write values as "
                "child elements",
            )
        if self._stack:
            self._stack[-1].children.append(node)
        else:
            self.root = node
        self._stack.append(node)

    def end(self) -> None:
        self._stack.pop()

    def data(self, text: str) -> None:
        if self._stack:
            self._stack[-1].chunks.append(text)

    def refuse_doctype(self, parser, source: str) -> None:
        raise ConfigError(
            f"a DOCTYPE or entity declaration is not allowed ({source}, line "
            f"{parser.CurrentLineNumber})",
            hint="remove the <!DOCTYPE ...> declaration; conveyor reads plain XML",
        )


def _nearest_hint(tag: str, known: Iterable[str]) -> str:
    known = list(known)
    same_but_case = [k for k in known if k.lower() == tag.lower()]
    if same_but_case:
        return f"element names are case-sensitive: did you mean <{same_but_case[0]}>?"
    close = difflib.get_close_matches(tag, known, n=3, cutoff=0.6)
    if close:
        return "did you mean " + " or ".join(f"<{c}>" for c in close) + "?"
    return "known elements here: " + ", ".join(f"<{k}>" for k in known)
