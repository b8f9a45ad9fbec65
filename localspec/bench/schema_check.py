"""Checks a JSON value against a JSON Schema, independently of the grammar that constrained it (llguidance): the
bench's "% valid" is a second opinion, not the constraint reading itself back.

It knows the keywords a bench task's schema may use (SUPPORTED) and refuses a schema with any other, so an
unchecked keyword can never pass silently.
"""

from __future__ import annotations

import json
import re
from typing import Any

from localspec.config import ConfigError

SUPPORTED = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "minItems",
        "maxItems",
        "enum",
        "const",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "pattern",
        "title",
        "description",
    }
)
TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def check_supported(schema: Any, where: str = "schema") -> None:
    """A ConfigError naming the first keyword (or type) this checker does not know."""
    if not isinstance(schema, dict):
        raise ConfigError(f"{where} must be an object")
    unknown = sorted(set(schema) - SUPPORTED)
    if unknown:
        raise ConfigError(f"{where} uses {unknown[0]!r}; the bench checks {', '.join(sorted(SUPPORTED))}")
    if "type" in schema and schema["type"] not in TYPES:
        raise ConfigError(f"{where}.type is {schema['type']!r}; one of {', '.join(TYPES)}")
    for name, sub in (schema.get("properties") or {}).items():
        check_supported(sub, f"{where}.properties.{name}")
    if "items" in schema:
        check_supported(schema["items"], f"{where}.items")
    if isinstance(schema.get("additionalProperties"), dict):
        check_supported(schema["additionalProperties"], f"{where}.additionalProperties")


def errors(value: Any, schema: dict, where: str = "$") -> list[str]:
    """What in value breaks schema (empty: valid)."""
    kind = schema.get("type")
    if kind is not None and not TYPES[kind](value):
        return [f"{where}: not a{'n' if kind[0] in 'aeiou' else ''} {kind}"]
    found = []
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{where}: {value!r} not in the enum")
    if "const" in schema and value != schema["const"]:
        found.append(f"{where}: {value!r} is not {schema['const']!r}")
    if TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            found.append(f"{where}: {value} < {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            found.append(f"{where}: {value} > {schema['maximum']}")
    if isinstance(value, str):
        if not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value)):
            found.append(f"{where}: length {len(value)} outside the schema's bounds")
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            found.append(f"{where}: does not match {schema['pattern']!r}")
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
            found.append(f"{where}: {len(value)} items outside the schema's bounds")
        for i, item in enumerate(value):
            found += errors(item, schema.get("items") or {}, f"{where}[{i}]")
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        found += [f"{where}: {name!r} is missing" for name in schema.get("required", ()) if name not in value]
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in properties:
                found += errors(item, properties[name], f"{where}.{name}")
            elif extra is False:
                found.append(f"{where}: {name!r} is not allowed")
            elif isinstance(extra, dict):
                found += errors(item, extra, f"{where}.{name}")
    return found


def is_valid(text: str, schema: dict) -> bool:
    """Whether text is one JSON value valid against schema."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return not errors(value, schema)
