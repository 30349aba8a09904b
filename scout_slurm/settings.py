"""One way to declare a setting (name, type, default, range or choices, help, who reads it) and one
way to read a value for it, shared by the site config (config.py), the in-job settings
(jobconfig.py) and the timing rules (localise/straggler.py). Pure and standard library only: it
runs in the job's Python too.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class Kind(str, enum.Enum):
    BOOL = "bool"
    INT = "int"
    FLOAT = "float"
    DURATION = "duration"  # seconds, as a float
    STR = "str"  # any text, kept as given
    CHOICE = "choice"  # one of `choices`, case-insensitive
    PATH = "path"  # an absolute path
    CUSTOM = "custom"  # the setting's own `parser` reads it (a fault spec, check names)


class Owner(str, enum.Enum):
    USER = "user"  # a knob for the job's author
    SHIM = "shim"  # scout-task sets it for the bootstrap (a user setting wins where noted)
    SLURM = "slurm"  # Slurm sets it
    SITE = "site"  # the site config (/etc/scout/scout.toml, or SCOUT_<SECTION>_<KEY>)


_NUMBERS = (Kind.INT, Kind.FLOAT, Kind.DURATION)
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_SWITCH = {"on", "off"}
# what a value of each kind is, in the words of a type error
_TYPE_WORDS = {
    Kind.BOOL: "true or false",
    Kind.INT: "an integer",
    Kind.FLOAT: "a number",
    Kind.DURATION: "a number",
    Kind.STR: "a string",
    Kind.CHOICE: "a string",
    Kind.PATH: "a string",
    Kind.CUSTOM: "a string",
}


@dataclass(frozen=True)
class Setting:
    """One setting: where it lives (`name`: the variable or TOML key; `field`: the attribute it
    fills), its kind and default, what it accepts, what it changes and who reads it."""

    name: str
    field: str
    kind: Kind
    default: object
    help: str
    owner: Owner = Owner.USER
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    positive: bool = False  # above zero: a minimum of 0 itself is refused
    why: str = ""  # why the range is what it is, said with a refusal
    readers: tuple[str, ...] = ()  # the components that read it
    parser: Callable[[str], object] | None = dataclasses.field(default=None, compare=False)
    accepts_text: str = ""  # for a CUSTOM kind: what its parser accepts, in words

    def accepts(self) -> str:
        """What a valid value is, in words (for errors and the reference tables)."""
        if self.kind is Kind.CHOICE:
            also = (
                " (also 1 or 0, true/false, yes/no for on or off)"
                if _SWITCH <= set(self.choices)
                else ""
            )
            return "one of " + ", ".join(self.choices) + also
        if self.kind is Kind.BOOL:
            if self.owner is Owner.SITE:
                return "true or false"
            return "1 or 0 (also true/false, yes/no, on/off)"
        if self.kind in _NUMBERS:
            word = {Kind.INT: "an integer", Kind.FLOAT: "a number"}.get(
                self.kind, "a number of seconds"
            )
            if self.minimum is not None and self.maximum is not None:
                return f"{word} within {_num(self.minimum)}..{_num(self.maximum)}"
            if self.positive:
                return f"{word} > 0"
            if self.minimum is not None:
                return f"{word} >= {_num(self.minimum)}"
            return word
        if self.kind is Kind.PATH:
            return "an absolute path"
        if self.kind is Kind.CUSTOM:
            return self.accepts_text or "text"
        return "text"

    def rule(self) -> str:
        """The declared rule in the words of a refusal: "positive", "within 0..1", ..."""
        if self.kind is Kind.CHOICE:
            quoted = [repr(c) for c in self.choices]
            if len(quoted) == 2:
                return f"{quoted[0]} or {quoted[1]}"
            return "one of " + ", ".join(quoted)
        if self.minimum is not None and self.maximum is not None:
            return f"within {_num(self.minimum)}..{_num(self.maximum)}"
        if self.positive:
            return "positive"
        if self.minimum:
            return f"at least {_num(self.minimum)}" + (f" ({self.why})" if self.why else "")
        return f"a finite number >= {_num(self.minimum or 0)}"


class Refused(ValueError):
    """A value a setting does not accept. `reason` says how (in the in-job words: "not an
    integer", "out of range"); `broken` is the rule it broke in a sentence's words ("positive",
    "a finite number >= 0", "'warn' or 'fatal'"), empty for a value of the wrong type."""

    def __init__(self, setting: Setting, value: object, reason: str, broken: str = "") -> None:
        self.setting, self.value, self.reason, self.broken = setting, value, reason, broken
        expected = (
            "" if setting.kind in (Kind.PATH, Kind.CUSTOM) else f"; expected {setting.accepts()}"
        )
        super().__init__(reason + expected)

    def sentence(self, where: str) -> str:
        """The refusal as the site config says it: names the key, the value, the rule, the fix."""
        s = self.setting
        if self.broken:
            head = f"{where} must be {self.broken}, got {self.value!r}"
        else:
            head = f"{where}: expected {_TYPE_WORDS[s.kind]}, got {self.value!r}"
        valid = _TYPE_WORDS[s.kind] if s.kind is Kind.STR else s.accepts()
        default = repr(s.default) if isinstance(s.default, str) else format_value(s.default)
        return f"{head}; use {valid}, or remove the key for its default ({default})"


def parse(setting: Setting, value: object) -> object:
    """`value` (a TOML value, or a variable's text) as the setting's type, checked against its
    range or choices; Refused says why not (pure). The one reading path of every setting."""
    kind = setting.kind
    text = value.strip() if isinstance(value, str) else None
    if kind is Kind.BOOL:
        if isinstance(value, bool):
            return value
        if text is not None and text.lower() in TRUE_WORDS + FALSE_WORDS:
            return text.lower() in TRUE_WORDS
        raise Refused(setting, value, "not a boolean")
    if kind in _NUMBERS:
        number = _number(setting, value)
        broken = _out_of_range(setting, number)
        if broken:
            raise Refused(setting, number, "out of range", broken)
        return number
    if text is None:
        raise Refused(setting, value, "not text")
    if kind is Kind.CHOICE:
        word = text.lower()
        if _SWITCH <= set(setting.choices) and word in TRUE_WORDS + FALSE_WORDS:
            return "on" if word in TRUE_WORDS else "off"  # a switch also takes a boolean's words
        if word not in setting.choices:
            raise Refused(setting, value, "not a valid choice", setting.rule())
        return word
    if kind is Kind.PATH:
        if not os.path.isabs(text):
            raise Refused(setting, value, "not an absolute path")
        return Path(text)
    if kind is Kind.CUSTOM and setting.parser is not None:
        try:
            return setting.parser(text)
        except ValueError as exc:
            raise Refused(setting, value, str(exc)) from None
    return value  # Kind.STR: kept as given


def _number(setting: Setting, value: object) -> int | float:
    word = "not an integer" if setting.kind is Kind.INT else "not a number"
    # a boolean is no number, and int(2.5) would silently make it 2
    if isinstance(value, bool) or (setting.kind is Kind.INT and isinstance(value, float)):
        raise Refused(setting, value, word)
    try:
        return int(value) if setting.kind is Kind.INT else float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise Refused(setting, value, word) from None


def _out_of_range(s: Setting, v: float) -> str:
    """The rule `v` breaks, or "" (pure). Nothing is NaN or infinite; a setting whose minimum is
    0 or more is first refused below 0 in the words every count, size and duration shares."""
    floor = s.minimum is not None and s.minimum >= 0
    if not math.isfinite(v):
        return "a finite number >= 0" if floor else "a finite number"
    if s.minimum == 0 and v < 0:
        return "a finite number >= 0"
    if s.minimum is not None and v < s.minimum:
        return s.rule()
    if s.positive and v <= 0:
        return "positive"
    if s.maximum is not None and v > s.maximum:
        return s.rule()
    return ""


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def format_value(v: object) -> str:
    """A default as the reference tables show it."""
    if v is None or v == "" or v == frozenset():
        return "unset"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return _num(v) if abs(v) < 1e15 else f"{v:g}"
    if isinstance(v, enum.Enum):
        return str(v.value)
    return str(v)


# -- declarations on dataclass fields -------------------------------------------------------------

_META = "scout.setting"


def declare(
    default: Any,
    help: str,
    *,
    choices: tuple[str, ...] = (),
    minimum: float | None = 0,
    maximum: float | None = None,
    positive: bool = False,
    why: str = "",
    readers: tuple[str, ...] = (),
    owner: Owner = Owner.SITE,
) -> Any:
    """A dataclass field declared as a setting: its kind follows the default (a str with
    `choices` is a choice, a float whose name ends in `_s` a duration). Numbers are >= 0 unless
    `minimum` says otherwise (None: no floor)."""
    kind = (
        Kind.CHOICE
        if choices
        else Kind.BOOL
        if isinstance(default, bool)
        else Kind.INT
        if isinstance(default, int)
        else Kind.FLOAT
        if isinstance(default, float)
        else Kind.STR
    )
    spec = Setting(
        "",
        "",
        kind,
        default,
        help,
        owner=owner,
        choices=choices,
        minimum=minimum if kind in _NUMBERS else None,
        maximum=maximum,
        positive=positive,
        why=why,
        readers=readers,
    )
    return dataclasses.field(default=default, metadata={_META: spec})


def declared(cls: type, *, prefix: str = "", field_prefix: str = "") -> tuple[Setting, ...]:
    """The settings a dataclass declares with `declare`, named `prefix + FIELD` (upper case when
    there is a prefix, the field's own name otherwise), in field order (pure)."""
    out = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(_META)
        if spec is None:
            continue
        kind = spec.kind
        if kind is Kind.FLOAT and f.name.endswith("_s"):
            kind = Kind.DURATION
        name = prefix + f.name.upper() if prefix else f.name
        out.append(dataclasses.replace(spec, name=name, field=field_prefix + f.name, kind=kind))
    return tuple(out)
