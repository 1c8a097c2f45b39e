"""Which record types always read back what the journal writes, so a write can skip reading its
JSON back.

The journal promises that it never stores what its own reader refuses. For most values that takes
reading each written record back, as every reader will (`session.encode`): a pydantic model built
with `model_construct`, or copied with `model_copy(update=...)`, skipped validation and can hold
anything, and a float that is NaN is written as null. A type whose every part is known to
round-trip needs no read-back: its validated value serializes to JSON that validates again. That
is a type built only of `Record` models (built only by validation, finite floats, defaults that
validate), strings, numbers, booleans, literals, lists, tuples, dicts, unions, JSON values and
the cleaning validators of `harness.messages`, with no alias, custom serializer, computed or
excluded field, and no recursion but within JSON values `clean_json` bounds. Anything else (an
application's own model, a plain validator function, `Any`, a recursive type) keeps the read-back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from harness.messages import Record, clean_json, clean_text

_PLAIN_NODES = frozenset({
    "model-fields", "tagged-union", "union", "nullable", "literal", "str", "int", "bool", "none", "list", "tuple",
    "dict",
})
"""Schema nodes whose validated value serializes to JSON the same node accepts. (An int of more
than 4,300 digits is written but not read: `session.encode` reads back a record with so long a
number in it, which no schema can rule out.)"""

_CLEANING = frozenset({clean_text, clean_json})
"""After-validators that return a value their own inner schema accepts again."""

_VERDICTS: dict[TypeAdapter[Any], bool] = {}
"""Each adapter's verdict. An adapter is kept for good, as an address's is anyway (a weak key
would cost a reference object on every look-up, two dozen a turn)."""


def always_reads_back(adapter: TypeAdapter[Any]) -> bool:
    """True when every value `adapter` validates serializes to JSON that `adapter` reads back
    (see the module docstring); decided once per adapter, from its core schema."""
    try:
        return _VERDICTS[adapter]
    except KeyError:
        verdict = _VERDICTS[adapter] = _Walk(adapter.core_schema).safe()
        return verdict


@dataclass(frozen=True)
class _Config:
    """What holds where the walk is: floats are finite and defaults valid (the enclosing model's
    config says so), nesting is bounded (`clean_json` refuses JSON deeper than `MAX_JSON_DEPTH`)."""

    finite: bool
    validated_defaults: bool
    bounded_depth: bool


def _keeps_validating_copies(cls: type[Record]) -> bool:
    """No class between `cls` and `Record` brings back pydantic's unvalidated construction."""
    below = cls.__mro__[:cls.__mro__.index(Record)]
    return not any({"model_construct", "model_copy"} & vars(kind).keys() for kind in below)


@cache
def _defaults_validate(cls: type[BaseModel]) -> bool:
    """Whether every default of `cls`'s fields (a factory's result too) is a value `cls` accepts:
    pydantic does not validate defaults, and one that does not fit is written as it is. One
    validation of the defaults alone, whose only errors may then be the required fields' absence."""
    try:
        defaults = {name: info.get_default(call_default_factory=True, validated_data={})
                    for name, info in cls.model_fields.items() if not info.is_required()}
        cls.__pydantic_validator__.validate_python(defaults)
    except ValidationError as error:
        return all(problem["type"] == "missing" for problem in error.errors())
    except Exception:  # a factory that needs the other fields: unknown, so not promised
        return False
    return True


class _Walk:
    """One pass over a core schema, following each definition reference once per context."""

    def __init__(self, schema: Any) -> None:
        self._root = schema
        self._definitions: dict[str, Any] = {}
        self._walking: set[str] = set()
        self._verdicts: dict[tuple[str, _Config], bool] = {}

    def safe(self) -> bool:
        return self._node(self._root, _Config(finite=False, validated_defaults=False, bounded_depth=False))

    def _node(self, node: Any, config: _Config) -> bool:
        if isinstance(node, list):
            return all(self._node(item, config) for item in node)
        if not isinstance(node, dict):
            return True
        kind = node.get("type")
        if "serialization" in node or node.get("computed_fields"):
            return False  # a custom serializer or a computed field writes what validation never saw
        if not isinstance(kind, str):  # a mapping of schemas (a union's choices, a model's fields)
            return all(self._node(value, config) for value in node.values())
        if kind == "definitions":  # each is walked where it is referenced, as that place allows
            self._definitions.update((d["ref"], d) for d in node["definitions"] if "ref" in d)
            return self._node(node["schema"], config)
        if kind == "definition-ref":
            return self._reference(node["schema_ref"], config)
        if kind == "json-or-python":  # the JSON side only reads: accepting any JSON is safe there
            json_side = node["json_schema"]
            return ((json_side.get("type") == "any" or self._node(json_side, config))
                    and self._node(node["python_schema"], config))
        if kind == "model":
            cls = node["cls"]
            if not (issubclass(cls, Record) and _keeps_validating_copies(cls)
                    and cls.model_config.get("revalidate_instances") == "subclass-instances"
                    and not node.get("custom_init") and not node.get("post_init")):
                return False
            config = replace(config, finite=cls.model_config.get("allow_inf_nan") is False,
                             validated_defaults=_defaults_validate(cls))
        elif kind == "model-field":
            if {"validation_alias", "serialization_alias", "serialization_exclude"} & node.keys():
                return False
        elif kind == "default":
            if not (config.validated_defaults or node.get("validate_default")):
                return False  # an unvalidated default is written as it is
        elif kind == "float":
            if not (config.finite or node.get("allow_inf_nan") is False):
                return False  # NaN would be written as null, which a float refuses
        elif kind == "function-after":
            function = node["function"].get("function")
            if function not in _CLEANING:
                return False
            if function is clean_json:  # it refuses NaN, the infinities and nesting past MAX_JSON_DEPTH
                config = replace(config, finite=True, bounded_depth=True)
        elif kind not in _PLAIN_NODES:
            return False  # "any" among them: it takes any Python value, however deep or odd
        return all(self._node(value, config) for key, value in node.items()
                   if key not in ("cls", "config", "metadata", "ref", "function") and isinstance(value, dict | list))

    def _reference(self, ref: str, config: _Config) -> bool:
        """A definition where it is referenced. One reached again inside itself is a recursive
        type: its values may nest deeper than the JSON reader's limit (about 200 levels), unless
        `clean_json` bounds them."""
        if ref in self._walking:
            return config.bounded_depth
        key = (ref, config)
        if key not in self._verdicts:
            self._walking.add(ref)
            try:
                self._verdicts[key] = self._node(self._definitions.get(ref), config)
            finally:
                self._walking.discard(ref)
        return self._verdicts[key]
