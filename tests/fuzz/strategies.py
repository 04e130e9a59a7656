"""Hypothesis strategies generated from the command models' JSON schemas.

`command_payloads` draws payloads that satisfy every keyword of a command's JSON schema (types,
bounds, patterns, lengths, required fields); model validators may still refuse some, which is
fine: the fuzz tests only require every input to be decided or refused with a typed error.
`broken_lines` draws one such payload broken in exactly one place (wrong type, missing or unknown
field, NaN or Infinity token, huge number or string, deep nesting, a lone surrogate left by
non-UTF-8 bytes, a bool for a number, a negative count) and says whether the schema guarantees a
refusal, and at which field. Nothing here is hand-written per command: a new command type is
fuzzed as soon as it is registered in `controlplane.commands.COMMAND_TYPES`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from controlplane.commands import COMMAND_TYPES

Schema = dict[str, Any]
JsonPath = tuple[str | int, ...]

# Names the seeded world of the fuzz tests registers (tests/fuzz/harness.py), by field, so that
# references often resolve and fuzzed commands reach their handlers, not only the precheck.
WORLD_NAMES: dict[str, tuple[str, ...]] = {
    "node_id": ("n1", "n2"), "model_id": ("llama-8b",), "pool_id": ("chat",), "replica_id": ("r1",),
    "request_id": ("req-1",), "rollout_id": ("ro-1",), "tenant": ("acme", "beta"),
    "principal_id": ("alice", "bob", "carol"), "budget_id": ("shared-1",),
    "release_id": ("rel-1", "rel-2"), "source_ref": ("doc-a", "doc-b"), "idempotency_key": ("k1",),
    "pointer_name": ("acme/assistant", "beta/assistant"), "profile_id": ("chat-small-v1",),
    "route_id": ("sh-1", "hc-1"), "plan_id": ("plan-1",), "catalog_id": ("meta-llama/Llama-3.1-8B",),
}
SCENARIO_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios"
PLACEHOLDER = "__fuzz_raw_token__"
SURROGATE = "\udcff"  # what non-UTF-8 bytes become when stdin is decoded with surrogateescape
UNICODE_LINE_BREAKS = ("\x85", "\u2028", "\u2029")  # raw in JSON strings; lines to splitlines
MUTATION_KINDS = ("wrong_type", "missing", "unknown_field", "non_finite", "huge_number", "huge_string",
                  "deep_nesting", "lone_surrogate", "bool_for_number", "negative_count", "unknown_type")
NON_FINITE_TOKENS = ("NaN", "Infinity", "-Infinity", "1e999", "-1e999")
JSON_TYPES = ("string", "integer", "number", "boolean", "null", "array", "object")
SAMPLE_OF_TYPE: dict[str, Any] = {"string": "fuzz", "integer": 7, "number": 0.5, "boolean": True,
                                  "null": None, "array": ["fuzz"], "object": {"fuzz": 1}}


def as_line(payload: object) -> str:
    """One JSON Lines line with non-ASCII text raw, as an editor writes it (a lone surrogate stays
    as the decoder left it); the separators `str.splitlines` honours stay escaped, because
    splitting on them is a known bug with its own test (test_submit_garbage)."""
    text = json.dumps(payload, ensure_ascii=False)
    for separator in UNICODE_LINE_BREAKS:
        text = text.replace(separator, f"\\u{ord(separator):04x}")
    return text


def fuzz_settings(max_examples: int) -> settings:
    """Reproducible settings: the seed is derived from the test (derandomize), never the clock."""
    return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large, HealthCheck.filter_too_much,
                                           HealthCheck.large_base_example])


@cache
def command_schema(command_type: str) -> tuple[Schema, dict[str, Schema]]:
    schema = COMMAND_TYPES[command_type].model_json_schema()
    return schema, schema.get("$defs", {})


def resolve(schema: Schema, defs: dict[str, Schema]) -> Schema:
    while "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def allowed_types(schema: Schema, defs: dict[str, Schema]) -> set[str] | None:
    """The JSON types a schema accepts, or None when it accepts anything."""
    schema = resolve(schema, defs)
    if "anyOf" in schema:
        found: set[str] = set()
        for branch in schema["anyOf"]:
            types = allowed_types(branch, defs)
            if types is None:
                return None
            found |= types
        return found
    if "const" in schema or "enum" in schema:
        return {"string"}
    kind = schema.get("type")
    if kind is None:
        return None
    types = {kind}
    if kind == "number":
        types.add("integer")  # a strict float still takes a whole JSON number
    if schema.get("format") in ("date-time", "date"):
        types |= {"integer", "number"}  # a datetime also parses from a unix timestamp
    return types


def _names(schema: Schema, name: str) -> st.SearchStrategy[str]:
    pattern: str | None = schema.get("pattern")
    low, high = int(schema.get("minLength", 0)), int(schema.get("maxLength", 64))
    known = [n for n in WORLD_NAMES.get(name, ())
             if low <= len(n) <= high and (not pattern or re.fullmatch(pattern, n))]
    drawn = st.from_regex(re.compile(pattern), fullmatch=True) if pattern else st.text(min_size=low,
                                                                                       max_size=12)
    drawn = drawn.filter(lambda s: low <= len(s) <= high)
    return st.one_of(st.sampled_from(known), drawn) if known else drawn


def _integers(schema: Schema) -> st.SearchStrategy[int]:
    low = schema.get("minimum", schema.get("exclusiveMinimum", -10**6 - 1) + 1)
    high = schema.get("maximum", schema.get("exclusiveMaximum", 10**6 + 1) - 1)
    return st.one_of(st.integers(low, min(high, low + 64)), st.integers(low, high),
                     st.sampled_from([low, high]))


def _floats(schema: Schema) -> st.SearchStrategy[float]:
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    return st.floats(min_value=low, max_value=high, exclude_min="exclusiveMinimum" in schema,
                     exclude_max="exclusiveMaximum" in schema, allow_nan=False, allow_infinity=False)


def _scenarios() -> st.SearchStrategy[Any]:
    files = sorted(SCENARIO_DIR.glob("*.json"))
    return st.sampled_from([json.loads(f.read_text()) for f in files]) if files else st.nothing()


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                     st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
_json_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=8)


def schema_values(schema: Schema, defs: dict[str, Schema], name: str = "") -> st.SearchStrategy[Any]:
    """Values that satisfy every keyword of `schema` (model validators aside)."""
    schema = resolve(schema, defs)
    if name == "scenario":
        return st.one_of(_scenarios(), st.dictionaries(st.text(max_size=8), _json_values, max_size=3))
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of(*[schema_values(branch, defs, name) for branch in schema["anyOf"]])
    kind = schema.get("type")
    if kind == "string" and schema.get("format") == "date-time":
        return st.datetimes(datetime(2026, 1, 1), datetime(2027, 1, 1), timezones=st.just(UTC)).map(
            lambda moment: moment.isoformat())
    if kind == "string":
        return _names(schema, name)
    if kind == "integer":
        return _integers(schema)
    if kind == "number":
        return _floats(schema)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        low = schema.get("minItems", 0)
        return st.lists(schema_values(schema.get("items", {}), defs, name), min_size=low,
                        max_size=min(schema.get("maxItems", low + 3), low + 3))
    if kind == "object" and "properties" in schema:
        required = set(schema.get("required", ()))
        properties = {key: schema_values(sub, defs, key) for key, sub in schema["properties"].items()}
        return st.fixed_dictionaries({k: v for k, v in properties.items() if k in required},
                                     optional={k: v for k, v in properties.items() if k not in required})
    if kind == "object":
        return st.dictionaries(st.text(max_size=8), _json_values, max_size=3)
    return _json_values


@cache
def command_payloads(command_type: str) -> st.SearchStrategy[dict[str, Any]]:
    """Payloads of `command_type` that satisfy its JSON schema; `type` is always present."""
    schema, defs = command_schema(command_type)
    return schema_values(schema, defs).map(lambda payload: {**payload, "type": command_type})


@cache
def any_command_payloads() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of([command_payloads(command_type) for command_type in sorted(COMMAND_TYPES)])


@dataclass(frozen=True)
class BrokenLine:
    """One JSON line broken at `path`; `refused` when the schema guarantees a refusal there."""

    text: str
    command_type: str
    kind: str
    path: JsonPath
    refused: bool

    @property
    def field(self) -> str:
        return ".".join(str(part) for part in self.path) or "(command)"


def _sites(value: Any, schema: Schema, defs: dict[str, Schema], path: JsonPath,
           declared: Schema | None = None) -> list[tuple[JsonPath, Schema, Schema, Any]]:
    """Every node of `value` whose schema is known: (path, declared schema, the branch it took, value).

    The declared schema (an `anyOf` for `X | None`) decides which types are wrong; the branch the
    value took gives its bounds.
    """
    declared = declared or schema
    schema = resolve(schema, defs)
    if "anyOf" in schema:
        branches = [resolve(b, defs) for b in schema["anyOf"]]
        matching = [b for b in branches if (value is None) == (b.get("type") == "null")]
        return _sites(value, matching[0] if matching else branches[0], defs, path, declared)
    found = [(path, declared, schema, value)]
    if isinstance(value, dict) and "properties" in schema:
        for key, sub in schema["properties"].items():
            if key in value:
                found += _sites(value[key], sub, defs, (*path, key))
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            found += _sites(item, schema["items"], defs, (*path, index))
    return found


def _at(payload: Any, path: JsonPath) -> Any:
    for part in path:
        payload = payload[part]
    return payload


def _replace(payload: Any, path: JsonPath, new: Any) -> Any:
    if not path:
        return new
    copy = list(payload) if isinstance(payload, list) else dict(payload)
    copy[path[0]] = _replace(payload[path[0]], path[1:], new)  # type: ignore[index]
    return copy


def _mutations(declared: Schema, schema: Schema, defs: dict[str, Schema], value: Any,
               depth: int) -> list[tuple[str, Any, bool]]:
    """(kind, replacement, refusal guaranteed) for one node."""
    accepted = allowed_types(declared, defs)
    known = accepted is not None
    types = accepted or set()
    out: list[tuple[str, Any, bool]] = []
    if known:
        out += [("wrong_type", SAMPLE_OF_TYPE[t], True) for t in JSON_TYPES if t not in types]
        nested = json.loads("[" * depth + "]" * depth)
        out.append(("deep_nesting", nested, "array" not in types or depth > 3))
    if known and {"integer", "number"} & types and "string" not in types:
        out += [("non_finite", PLACEHOLDER, True), ("bool_for_number", True, True)]
        low = schema["minimum"] if "minimum" in schema else schema.get("exclusiveMinimum")
        if low is not None and low >= 0:
            out.append(("negative_count", -1 - depth, True))
        high = schema.get("maximum", schema.get("exclusiveMaximum"))
        out.append(("huge_number", 10 ** (20 + depth * 20), high is not None))
    if isinstance(value, str) and known:
        limit = schema.get("maxLength")
        if limit is not None and limit < 100_000:
            out.append(("huge_string", "x" * (limit + 1 + depth), True))
        out.append(("lone_surrogate", value[:1] + SURROGATE + value[1:], True))
    if isinstance(value, dict) and "properties" in schema:
        for key in schema.get("required", ()):
            if key in value:
                out.append((f"missing:{key}", None, True))
        if schema.get("additionalProperties") is False:
            out.append(("unknown_field", None, True))
    return out


@st.composite
def broken_lines(draw: st.DrawFn, command_type: str | None = None) -> BrokenLine:
    """A schema-valid payload broken in one place, as one JSON line."""
    kind_of_command = command_type or draw(st.sampled_from(sorted(COMMAND_TYPES)))
    payload = draw(command_payloads(kind_of_command))
    schema, defs = command_schema(kind_of_command)
    depth = draw(st.integers(1, 200))
    # The kind is drawn first, so that every kind is tried as often as any other.
    wanted = draw(st.sampled_from(MUTATION_KINDS))
    options = [(path, choice) for path, declared, node_schema, value in _sites(payload, schema, defs, ())
               if path != ("type",)
               for choice in _mutations(declared, node_schema, defs, value, depth)
               if choice[0].split(":")[0] == wanted]
    if wanted == "unknown_type" or not options:
        options = [((), ("unknown_type", "LaunchMissiles", True))]
    path, (kind, replacement, refused) = draw(st.sampled_from(options))
    value = _at(payload, path)
    if kind == "unknown_type":
        text = json.dumps({**payload, "type": replacement})
        return BrokenLine(text, kind_of_command, kind, ("type",), refused)
    if kind.startswith("missing:"):
        key = kind.split(":", 1)[1]
        node = {k: v for k, v in value.items() if k != key}
        return BrokenLine(json.dumps(_replace(payload, path, node)), kind_of_command, "missing_field",
                          (*path, key), refused)
    if kind == "unknown_field":
        node = {**value, "zz_fuzz_unknown": 1}
        return BrokenLine(json.dumps(_replace(payload, path, node)), kind_of_command, kind,
                          (*path, "zz_fuzz_unknown"), refused)
    text = as_line(_replace(payload, path, replacement))
    if kind == "non_finite":
        text = text.replace(json.dumps(PLACEHOLDER), draw(st.sampled_from(NON_FINITE_TOKENS)))
    return BrokenLine(text, kind_of_command, kind, path, refused)


def garbage_texts() -> st.SearchStrategy[str]:
    """Text that is mostly not a command: random characters, JSON values, JSON fragments."""
    fragments = st.sampled_from(['{"type":', "[", "]", "{", "}", '"', ",", ":", "NaN", "\n",
                                 '{"type":"AssessMemory"}', "null", "\ufeff", "\x00", SURROGATE])
    return st.one_of(
        st.text(max_size=200),
        _json_values.map(json.dumps),
        st.lists(fragments, max_size=30).map("".join),
        st.lists(_json_values.map(json.dumps), min_size=1, max_size=5).map("\n".join),
        broken_lines().map(lambda line: line.text),
    )
