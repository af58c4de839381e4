"""Structured outputs: a JSON schema as a byte grammar, for guided decoding (guide.py).

The schema is compiled to nodes (objects with their properties in order, arrays, strings,
numbers, integers, literals from enum/const/boolean/null, unions from anyOf/oneOf/type lists,
local $refs), and the grammar runs them as a nondeterministic automaton: a state is the set of
configurations it may be in, each a matcher of the next bytes (a literal, a run of blanks, or
one JSON value under json_step) and what must follow it. Enforced: structure, types, enums,
consts, required properties; properties come in the schema's order and no others are
written. Not enforced: value constraints (pattern, format, lengths, ranges, item counts).
"""

from __future__ import annotations

import json

from workers.engine.errors import InvalidRequest
from workers.engine.guide import BLANKS, DONE, MAX_BLANKS, NUMBER_ENDS, VALUE, json_step

UNSUPPORTED = ("allOf", "not", "if", "then", "else", "patternProperties", "dependentSchemas",
               "prefixItems", "contains", "unevaluatedProperties")
MAX_CONTINUATION = 256  # nesting bound: what may follow a value, deepest first
ACCEPT = ("accept",)
VALUE_START = ("", VALUE, 0, 0)
FIRST_BYTES = {"string": b'"', "number": b"-0123456789", "integer": b"-0123456789",
               "object": b"{", "array": b"[", "any": b'{["-0123456789tfn'}


def _refuse(message: str) -> InvalidRequest:
    return InvalidRequest(f"This model's engine cannot enforce that schema: {message}",
                          param="response_format")


class SchemaGrammar:
    """`start`, `step(state, byte)` (None: that byte breaks the schema) and `is_done(state)`."""

    def __init__(self, schema: dict) -> None:
        if not isinstance(schema, dict):
            raise _refuse("a schema is an object")
        self.root = schema
        self.nodes: list[tuple] = []
        self._ids: dict[int, int] = {}  # id(schema dict) -> node id ($refs and recursion)
        self._kept: list[dict] = []  # the dicts those ids belong to, alive while compiling
        root = self._compile(schema)
        self._kept.clear()
        self.start = self._closure({(None, (("n", root),))})

    # -- compiling ------------------------------------------------------------------------------

    def _ref(self, ref: str) -> dict:
        if not ref.startswith("#/"):
            raise _refuse(f"only local $refs ({ref!r})")
        target = self.root
        for part in ref[2:].split("/"):
            target = target.get(part.replace("~1", "/").replace("~0", "~")) \
                if isinstance(target, dict) else None
        if not isinstance(target, dict):
            raise _refuse(f"$ref {ref!r} points nowhere")
        return target

    def _compile(self, schema) -> int:
        if schema is True or schema == {}:
            schema = {}
        if not isinstance(schema, dict):
            raise _refuse("every subschema is an object")
        if "$ref" in schema:
            return self._compile(self._ref(schema.get("$ref")))
        if id(schema) in self._ids:
            return self._ids[id(schema)]
        self._kept.append(schema)
        index = self._ids[id(schema)] = len(self.nodes)
        self.nodes.append(("any",))  # a placeholder while its parts compile (recursion)
        self.nodes[index] = self._node(schema)
        return index

    def _node(self, schema: dict) -> tuple:
        for keyword in UNSUPPORTED:
            if keyword in schema:
                raise _refuse(f"'{keyword}'")
        if "const" in schema:
            return ("lit", (json.dumps(schema.get("const")).encode(),))
        if "enum" in schema:
            values = schema.get("enum")
            if not isinstance(values, list) or not values:
                raise _refuse("'enum' is a non-empty array")
            return ("lit", tuple(json.dumps(v).encode() for v in values))
        options = schema.get("anyOf") or schema.get("oneOf")
        if options is not None:
            if not isinstance(options, list) or not options:
                raise _refuse("'anyOf' / 'oneOf' is a non-empty array")
            return ("alt", tuple(self._compile(option) for option in options))
        kind = schema.get("type")
        if isinstance(kind, list):
            return ("alt", tuple(self._compile({**schema, "type": k}) for k in kind))
        if kind == "object":
            properties = schema.get("properties") or {}
            if not properties:
                return ("value", "object")
            required = set(schema.get("required") or ())
            return ("obj", tuple((json.dumps(key).encode(), self._compile(sub), key in required)
                                 for key, sub in properties.items()))
        if kind == "array":
            return ("arr", self._compile(schema.get("items", {})))
        if kind in ("boolean", "null"):
            return ("lit", (b"true", b"false") if kind == "boolean" else (b"null",))
        if kind in ("string", "number", "integer"):
            return ("value", kind)
        if kind is None:
            return ("value", "any")
        raise _refuse(f"type {kind!r}")

    # -- running --------------------------------------------------------------------------------

    def _expand(self, item: tuple) -> list[tuple]:
        """A pending item as (frame, items to push after it) alternatives."""
        kind = item[0]
        if kind == "lit":
            return [(("lit", item[1]), ())]
        if kind == "ws":
            return [(("ws", 0), ())]
        if kind == "rest":  # an object's next property, or its end
            return self._object_rest(*item[1:])
        if kind == "items":  # an array's next item, or its end
            node, is_first = item[1], item[2]
            more = ((("lit", b","),) if not is_first else ()) + (
                ("ws",), ("n", node), ("ws",), ("items", node, False))
            return [(("lit", b"]"), ()), (None, more)]
        node = self.nodes[item[1]]
        if node[0] == "lit":
            return [(("lit", value), ()) for value in node[1]]
        if node[0] == "alt":
            return [(None, (("n", option),)) for option in node[1]]
        if node[0] == "obj":
            return [(("lit", b"{"), (("ws",), ("rest", item[1], 0, True)))]
        if node[0] == "arr":
            return [(("lit", b"["), (("ws",), ("items", node[1], True)))]
        return [(("value", node[1], VALUE_START), ())]

    def _object_rest(self, node_id: int, start: int, is_first: bool) -> list[tuple]:
        properties = self.nodes[node_id][1]
        out = []
        for j in range(start, len(properties)):
            key, value, _ = properties[j]
            comma = () if is_first else (("lit", b","), ("ws",))
            out.append((None, comma + (("lit", key), ("ws",), ("lit", b":"), ("ws",),
                                       ("n", value), ("ws",), ("rest", node_id, j + 1, False))))
            if properties[j][2]:  # required: nothing after it may come first
                return out
        out.append((("lit", b"}"), ()))
        return out

    def _closure(self, configs) -> frozenset:
        """Every configuration reachable without reading a byte, keeping those that read one
        (and ACCEPT when the document may end here)."""
        done, todo, seen = set(), list(configs), set()
        while todo:
            config = todo.pop()
            if config in seen:
                continue
            seen.add(config)
            frame, pending = config
            if frame is not None and not self._is_finished(frame):
                done.add(config)
            if frame is not None and not self._may_end(frame):
                continue
            if not pending:
                done.add(ACCEPT)
                continue
            if len(pending) > MAX_CONTINUATION:
                continue
            for new_frame, pushed in self._expand(pending[-1]):
                todo.append((new_frame, pending[:-1] + tuple(reversed(pushed))))
        return frozenset(done)

    @staticmethod
    def _is_finished(frame: tuple) -> bool:
        """It can read no more bytes (a literal read whole, a value closed)."""
        return not frame[1] if frame[0] == "lit" else frame[0] == "value" and frame[2][1] == DONE

    @staticmethod
    def _may_end(frame: tuple) -> bool:
        kind = frame[0]
        if kind == "lit":
            return not frame[1]
        if kind == "ws":
            return True
        state = frame[2]
        return state[1] == DONE or (not state[0] and state[1] in NUMBER_ENDS)

    @staticmethod
    def _read(frame: tuple, byte: int) -> tuple | None:
        kind = frame[0]
        if kind == "lit":
            return ("lit", frame[1][1:]) if frame[1] and frame[1][0] == byte else None
        if kind == "ws":
            return ("ws", frame[1] + 1) if byte in BLANKS and frame[1] < MAX_BLANKS else None
        value_kind, state = frame[1], frame[2]
        if state == VALUE_START and byte not in FIRST_BYTES[value_kind]:
            return None
        if value_kind == "integer" and byte in b".eE":
            return None
        state = json_step(state, byte)
        return None if state is None else ("value", value_kind, state)

    def step(self, state: frozenset, byte: int) -> frozenset | None:
        moved = set()
        for config in state:
            if config is ACCEPT or config == ACCEPT:
                continue
            frame = self._read(config[0], byte)
            if frame is not None:
                moved.add((frame, config[1]))
        return self._closure(moved) or None if moved else None

    @staticmethod
    def is_done(state: frozenset) -> bool:
        return ACCEPT in state

    @staticmethod
    def is_open(state: frozenset) -> bool:
        """Whether more bytes may come (or only the end)."""
        return any(config != ACCEPT for config in state)
