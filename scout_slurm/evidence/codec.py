"""Evidence records <-> JSON, with no I/O: encoding a record (checked against its type hints),
decoding bytes with a hardened parser (UTF-8, no duplicate keys, no NaN, bounded nesting) and
building the dataclass field by field. What reads or writes files is evidence/safeio.py."""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import json
import math
import operator
import re
import types
import typing
from typing import Any, TypeVar

from scout_slurm.errors import EvidenceError

MAX_JSON_DEPTH = 32

# The record's type tag. Not "kind": Finding, StallDecision and Verdict have a field of that name.
KIND_KEY = "record_kind"

_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1

CORRUPT_ADVICE = "the file is corrupt or was not written by scout; the record is ignored"
_CORRUPT = CORRUPT_ADVICE

R = TypeVar("R")


class _Invalid(Exception):
    """A record does not match its dataclass; the caller adds where it came from."""

    def __init__(self, message: str, advice: str | None = None) -> None:
        super().__init__(message)
        self.advice = advice


# --------------------------------------------------------------------------------------------
# Records <-> JSON objects
# --------------------------------------------------------------------------------------------


def record_to_obj(record: Any) -> dict:
    """The JSON object for `record`, checked against its type hints so that what scout writes
    it can always read back."""
    cls = type(record)
    if isinstance(record, type) or not dataclasses.is_dataclass(cls):
        raise TypeError(f"record_to_obj needs a dataclass instance, got {record!r}")
    obj = {f.name: _plain(getattr(record, f.name)) for f in dataclasses.fields(record)}
    kind = getattr(cls, "KIND", None)
    if kind is not None:
        obj[KIND_KEY] = kind
    _from_obj(
        cls,
        obj,
        f"{cls.__name__} to be written",
        "a bug in the code that built the record; nothing was written",
    )
    return obj


def record_to_bytes(record: Any) -> bytes:
    obj = record_to_obj(record)
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def record_from_obj(cls: type[R], obj: Any, *, source: str) -> R:
    """Build a `cls` from a parsed JSON object, refusing anything that does not match the
    dataclass exactly: wrong tag, newer schema, missing or unknown fields, wrong types."""
    return _from_obj(cls, obj, source, _CORRUPT)


def _from_obj(cls: type[R], obj: Any, source: str, advice: str) -> R:
    kind = getattr(cls, "KIND", None)
    if type(obj) is dict and (kind is None or obj.get(KIND_KEY) == kind):
        try:
            return _fast_builder(cls, True)(obj)
        except _Slow:
            pass  # the full check below decides, and says what is wrong
    try:
        if not isinstance(obj, dict):
            raise _Invalid(f"expected a JSON object ({cls.__name__}), got {_show(obj)}")
        if kind is not None:
            if KIND_KEY not in obj:
                raise _Invalid(f"has no {KIND_KEY!r}, expected {kind!r}")
            if obj[KIND_KEY] != kind:
                raise _Invalid(
                    f"is a {_show(obj[KIND_KEY])} record, expected {kind!r}",
                    "check which file was meant",
                )
        return _build(cls, obj, "", top=True)
    except _Invalid as e:
        raise EvidenceError(f"{source}: {e}; {e.advice or advice}") from None


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(cls: type, obj: dict, where: str, *, top: bool) -> Any:
    fields = [f for f in dataclasses.fields(cls) if f.init]
    names = {f.name for f in fields}
    allowed = names | ({KIND_KEY} if top and getattr(cls, "KIND", None) is not None else set())
    if "schema_version" in names:
        # First, so that a newer record says "upgrade" rather than "unknown field".
        _check_version(cls, obj, where)
    unknown = sorted(str(k) for k in obj if k not in allowed)
    if unknown:
        at = f" in field {where}" if where else ""
        raise _Invalid(f"unknown field {unknown[0]!r}{at} (valid: {', '.join(sorted(names))})")
    hints = _hints(cls)
    values = {}
    for f in fields:
        path = f"{where}.{f.name}" if where else f.name
        if f.name not in obj:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise _Invalid(f"field {path}: missing")
            continue
        values[f.name] = _value(hints[f.name], obj[f.name], path)
    try:
        return cls(**values)
    except (ValueError, TypeError) as e:  # a record's own __post_init__ checks
        raise _Invalid(f"{f'field {where}: ' if where else ''}{e}") from None


def _check_version(cls: type, obj: dict, where: str) -> None:
    at = f"field {where}: " if where else ""
    known = next(f.default for f in dataclasses.fields(cls) if f.name == "schema_version")
    if "schema_version" not in obj:
        raise _Invalid(f"{at}has no schema_version")
    version = obj["schema_version"]
    if not _is_int(version) or version < 1:
        raise _Invalid(f"{at}schema_version must be a positive integer, got {_show(version)}")
    if version > known:
        raise _Invalid(
            f"{at}{cls.__name__} schema_version {version} is newer than this scout "
            f"understands ({known})",
            "upgrade scout on this node to read it",
        )
    oldest = getattr(cls, "OLDEST_SCHEMA_VERSION", 1)
    if version < oldest:
        raise _Invalid(
            f"{at}{cls.__name__} schema_version {version} was written by an older scout; this one "
            f"reads versions {oldest} to {known}",
            "read it with the scout that wrote it",
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _value(tp: Any, value: Any, path: str) -> Any:
    def wrong(expected: str, detail: str = "") -> _Invalid:
        return _Invalid(f"field {path}: expected {expected}, got {_show(value)}{detail}")

    origin = typing.get_origin(tp)
    if tp is bool:
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if tp is int:
        if not _is_int(value):
            raise wrong("an integer")
        if not _INT_MIN <= value <= _INT_MAX:
            raise wrong("an integer", " (outside the 64-bit range)")
        return value
    if tp is float:
        if not (_is_int(value) or isinstance(value, float)):
            raise wrong("a number")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise wrong("a finite number")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise wrong("a string")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise wrong("a string", " (contains an unpaired surrogate)") from None
        return value
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        choices = ", ".join(repr(m.value) for m in tp)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            try:
                return tp(value)
            except (ValueError, TypeError):
                pass
        raise wrong(f"one of {choices}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise wrong(f"a JSON object ({tp.__name__})")
        return _build(tp, value, path, top=False)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise wrong("a list")
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise wrong(f"a list of {len(args)} items")
        return tuple(_value(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp)
        if key_tp is not str:
            raise TypeError(f"unsupported annotation {tp!r}: dict keys must be str")
        if not isinstance(value, dict):
            raise wrong("a JSON object")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise wrong("a JSON object with string keys")
            out[k] = _value(val_tp, v, f"{path}[{k!r}]")
        return out
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
        others = [a for a in args if a is not type(None)]
        if len(others) == 1:
            if value is None:
                raise wrong(_describe(others[0]))
            return _value(others[0], value, path)
        for a in others:
            try:
                return _value(a, value, path)
            except _Invalid:
                continue
        raise wrong(" or ".join(_describe(a) for a in args))
    raise TypeError(f"unsupported annotation {tp!r} for field {path}")


# The fast reader: the same checks as `_build` and `_value`, compiled once per record type, for
# the common case of a valid record (a job end reads three records per rank). It accepts a
# subset of what `_build` accepts and builds the same record; on anything else it raises _Slow
# and `_from_obj` runs `_build`, which decides and explains.


class _Slow(Exception):
    """The fast reader does not decide this object; the full check will."""


@functools.cache
def _fast_builder(cls: type, top: bool) -> Any:
    hints = _hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    names = {f.name for f in fields}
    allowed = frozenset(
        names | ({KIND_KEY} if top and getattr(cls, "KIND", None) is not None else set())
    )
    known = next((f.default for f in fields if f.name == "schema_version"), None)
    oldest = getattr(cls, "OLDEST_SCHEMA_VERSION", 1)
    specs = tuple(
        (
            f.name,
            _fast_converter(hints[f.name]),
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in fields
    )

    def build(obj: dict) -> Any:
        if known is not None:
            version = obj.get("schema_version")
            if type(version) is not int or not oldest <= version <= known:
                raise _Slow
        if not allowed.issuperset(obj):
            raise _Slow
        values = {}
        for name, convert, required in specs:
            if name in obj:
                values[name] = convert(obj[name])
            elif required:
                raise _Slow
        try:
            return cls(**values)
        except (ValueError, TypeError):
            raise _Slow from None

    return build


class _Flat:
    """A list of records of int and str fields only, all required (the collectives of a progress
    ring: 32 of them a rank), checked column by column in C loops, then built by the record's
    own __init__. Anything it does not accept goes item by item through `_fast_builder`."""

    def __init__(self, cls: type, names: tuple[str, ...], kinds: tuple[type, ...]) -> None:
        self.cls, self.count = cls, len(names)
        self.get = operator.itemgetter(*names)
        self.int_at = tuple(i for i, k in enumerate(kinds) if k is int)
        self.str_at = tuple(i for i, k in enumerate(kinds) if k is str)

    @staticmethod
    def of(cls: Any) -> _Flat | None:
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            return None
        fields = dataclasses.fields(cls)
        hints = _hints(cls)
        kinds = tuple(hints[f.name] for f in fields)
        try:
            params = list(inspect.signature(cls).parameters)
        except (TypeError, ValueError):
            return None
        if (
            len(fields) < 2
            or params != [f.name for f in fields]  # built positionally
            or any(k is not int and k is not str for k in kinds)
            or any(
                f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
                for f in fields
            )
        ):
            return None
        return _Flat(cls, tuple(f.name for f in fields), kinds)

    def build_all(self, objs: list) -> tuple | None:
        """The records, or None when any item is not exactly such a record."""
        if not objs:
            return ()
        if set(map(type, objs)) != {dict} or set(map(len, objs)) != {self.count}:
            return None
        try:
            rows = list(map(self.get, objs))  # with the count: exactly the record's keys
        except KeyError:
            return None
        columns = list(zip(*rows))
        for i in self.int_at:
            column = columns[i]
            if set(map(type, column)) != {int} or min(column) < _INT_MIN or max(column) > _INT_MAX:
                return None
        for i in self.str_at:
            column = columns[i]
            if set(map(type, column)) != {str} or not all(map(str.isascii, column)):
                return None
        try:
            return tuple(map(self.cls, *columns))
        except (ValueError, TypeError):
            return None


def _fast_converter(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if tp is bool:

        def convert(v: Any) -> Any:
            if v is True or v is False:
                return v
            raise _Slow
    elif tp is int:

        def convert(v: Any) -> Any:
            if type(v) is int and _INT_MIN <= v <= _INT_MAX:
                return v
            raise _Slow
    elif tp is float:

        def convert(v: Any) -> Any:
            t = type(v)
            if t is float:
                if math.isfinite(v):
                    return v
            elif t is int and -(2**53) <= v <= 2**53:
                return float(v)
            raise _Slow
    elif tp is str:

        def convert(v: Any) -> Any:
            if type(v) is str and (v.isascii() or _encodes(v)):
                return v
            raise _Slow
    elif isinstance(tp, type) and issubclass(tp, enum.Enum):
        members = {m.value: m for m in tp if type(m.value) is str}

        def convert(v: Any) -> Any:
            if type(v) is str:
                m = members.get(v)
                if m is not None:
                    return m
            raise _Slow
    elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
        nested: list = []  # resolved on first use: a record type may contain itself

        def convert(v: Any) -> Any:
            if type(v) is not dict:
                raise _Slow
            if not nested:
                nested.append(_fast_builder(tp, False))
            return nested[0](v)
    elif origin is tuple and len(typing.get_args(tp)) == 2 and typing.get_args(tp)[1] is Ellipsis:
        item_tp = typing.get_args(tp)[0]
        item = _fast_converter(item_tp)
        flat = _Flat.of(item_tp)

        if item_tp is str or item_tp is int:

            def convert(v: Any) -> Any:
                # a whole list of plain strings (a stderr tail) or integers checked in C loops
                if type(v) is list or type(v) is tuple:
                    if (
                        not v
                        or set(map(type, v)) == {item_tp}
                        and (
                            all(map(str.isascii, v))
                            if item_tp is str
                            else _INT_MIN <= min(v) and max(v) <= _INT_MAX
                        )
                    ):
                        return tuple(v)
                    return tuple([item(x) for x in v])
                raise _Slow
        else:

            def convert(v: Any) -> Any:
                if type(v) is tuple and set(map(type, v)) <= {item_tp}:
                    # records built already (JSON gives lists, never tuples): a ring shared by the
                    # ranks of a node digest is built once and handed to each of them as it is
                    return v
                if type(v) is list or type(v) is tuple:
                    built = flat.build_all(v) if flat is not None else None
                    return built if built is not None else tuple([item(x) for x in v])
                raise _Slow
    elif origin is typing.Union or origin is types.UnionType:
        others = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(others) == 1 and len(typing.get_args(tp)) == 2:
            inner = _fast_converter(others[0])

            def convert(v: Any) -> Any:
                return None if v is None else inner(v)
        else:
            convert = _checked(tp)
    else:
        convert = _checked(tp)
    return convert


def _checked(tp: Any) -> Any:
    """The full `_value` check, for the annotations the fast reader has no shortcut for."""

    def convert(v: Any) -> Any:
        try:
            return _value(tp, v, "")
        except _Invalid:
            raise _Slow from None

    return convert


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _describe(tp: Any) -> str:
    if tp is type(None):
        return "null"
    simple = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if tp in simple:
        return simple[tp]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return f"a JSON object ({tp.__name__})"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in tp)
    if typing.get_origin(tp) is tuple:
        return "a list"
    return "a JSON object"


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a JSON object"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, (str, int, float)):
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return f"{type(value).__qualname__} {repr(value)[:60]}"


# --------------------------------------------------------------------------------------------
# JSON text -> object, bounded
# --------------------------------------------------------------------------------------------

# The closing quote is optional: a string that never ends then runs to the end of the text in one
# match. Required, every later quote would rescan the rest of the file (quadratic: hours for 4 MiB).
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _nesting_exceeds(text: str, limit: int) -> bool:
    if text.count("{") + text.count("[") <= limit:
        return False  # no deeper than the number of opening brackets, wherever they are
    # Brackets inside strings do not nest; drop the strings, then everything but brackets.
    skeleton = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    depth = 0
    for ch in skeleton:
        if ch == "[" or ch == "{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    obj = {}
    for k, v in pairs:
        if k in obj:
            raise ValueError(f"duplicate key {k!r}")
        obj[k] = v
    return obj


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} is not JSON")


# One decoder for every read: json.loads with hooks builds a new one (and its scanner) per call.
_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_refuse_constant)


def parse_json(data: bytes, source: str) -> Any:
    obj, text = parse_json_unbounded(data, source)
    check_depth(obj, text, source)
    return obj


def parse_json_unbounded(data: bytes, source: str) -> tuple[Any, str]:
    """The parsed object and its text; the caller checks the depth (`check_depth`) unless the
    object's type bounds it."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise EvidenceError(f"{source}: not valid UTF-8 (byte {e.start}); {_CORRUPT}") from None
    # Parsed first, then the depth checked on the result: for valid JSON that is the depth of the
    # text, and walking an exit record costs a seventh of stripping its strings to count brackets.
    # json bounds its own recursion (RecursionError); a text it refuses is then measured as text,
    # so what is too deep is reported as such, valid JSON or not.
    try:
        if text.startswith("\ufeff"):
            obj = json.loads(text)  # refuses it, in json's own words
        else:
            obj = _DECODER.decode(text)
    except (ValueError, RecursionError, TypeError) as e:
        if _nesting_exceeds(text, MAX_JSON_DEPTH):
            raise EvidenceError(
                f"{source}: JSON nested deeper than {MAX_JSON_DEPTH} levels; {_CORRUPT}"
            ) from None
        raise EvidenceError(f"{source}: not valid JSON ({e}); {_CORRUPT}") from None
    return obj, text


def check_depth(obj: Any, text: str, source: str) -> None:
    # no deeper than its count of opening brackets (in strings or not): most records skip the walk
    if text.count("{") + text.count("[") > MAX_JSON_DEPTH and _deeper_than(obj, MAX_JSON_DEPTH):
        raise EvidenceError(
            f"{source}: JSON nested deeper than {MAX_JSON_DEPTH} levels; {_CORRUPT}"
        )


def _deeper_than(obj: Any, limit: int) -> bool:
    """Do parsed JSON's objects and arrays nest deeper than `limit`?"""
    level = [obj] if type(obj) is dict or type(obj) is list else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below = []
        for container in level:
            for v in container.values() if type(container) is dict else container:
                if type(v) is dict or type(v) is list:
                    below.append(v)
        level = below
    return False


def decode_record(data: bytes, cls: type[R], *, source: str) -> R:
    """The `cls` record in JSON `data` (`source` names them in errors): the parsed object, depth
    bounded, checked against the dataclass."""
    obj, text = parse_json_unbounded(data, source)
    kind = getattr(cls, "KIND", None)
    if (
        type(obj) is dict
        and (kind is None or obj.get(KIND_KEY) == kind)
        and _type_depth(cls) <= MAX_JSON_DEPTH
    ):
        # A record the fast reader accepts matched its type field by field, so the JSON is no
        # deeper than the type: the depth walk (a third of reading an exit record) is not needed.
        try:
            return _fast_builder(cls, True)(obj)
        except _Slow:
            pass
    check_depth(obj, text, source)
    return record_from_obj(cls, obj, source=source)


@functools.cache
def _type_depth(tp: Any, _seen: frozenset = frozenset()) -> float:
    """How deep the JSON of a valid `tp` can nest (objects and arrays); inf for a type that
    contains itself."""
    if tp in _seen:
        return math.inf
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        inner = [_type_depth(hints[f.name], _seen | {tp}) for f in dataclasses.fields(tp) if f.init]
        return 1 + max(inner, default=0)
    if origin is tuple or origin is dict:
        return 1 + max((_type_depth(a, _seen) for a in args if a is not Ellipsis), default=0)
    if origin is typing.Union or origin is types.UnionType:
        return max((_type_depth(a, _seen) for a in args), default=0)
    return 0
