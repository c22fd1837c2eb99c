"""The bases of every API body. Requests forbid unknown fields, so a typo is a 422
instead of a silently ignored option.

Every request body (``Request`` and its subclasses, in every module of
``gpufleet.api``) refuses, in any field and at any depth (list items, dict keys and
values), what no database column can hold: a NUL character (PostgreSQL's text
cannot store U+0000), a lone surrogate (not Unicode: it cannot be encoded as UTF-8),
an integer beyond 64 bits. One validator on the base class, so a field added later is
covered without thinking of it. The one exception is log output from a node
(``LogChunkIn.data``): shown, never interpreted, so it is cleaned instead of refused.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated, Any, ClassVar, Literal, Self, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
NODE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
"""A node's name: at most 63 characters (a host name's first label, what the agent
takes by default), letters, digits, ``.``, ``_``, ``-``, not starting with a symbol.
It is joined with commas (``Job.stopping_on``) and prefixed in actors (``node:<name>``),
so it never holds a comma, and every column it goes into has room for it."""
NodeName = Annotated[str, StringConstraints(pattern=NODE_NAME)]
Role = Literal["admin", "operator", "user"]


def plain_text(value: str) -> str:
    """A name shown to others must read as what it is: refuse control characters and
    Unicode format characters (category Cc, Cf: the bidirectional overrides and isolates
    U+202A-U+202E and U+2066-U+2069, zero-width marks and joiners, U+FEFF), with which a
    name can show reversed or hidden text (a job named ``\u202egnp.exe``)."""
    if value.isascii() and value.isprintable():
        return value
    for ch in value:
        if unicodedata.category(ch) in ("Cc", "Cf"):
            what = "a NUL character" if ch == "\x00" else unicodedata.name(ch, "a control character")
            raise ValueError(f"holds U+{ord(ch):04X} ({what}): control and format characters are refused")
    return value


Label = Annotated[str, StringConstraints(max_length=128), AfterValidator(plain_text)]
"""A free-text name (a job's, a reservation's; up to 128 characters, any script), without
control or format characters (``plain_text``). Users, teams, pools and nodes are
``Name``/``NodeName`` (ASCII); services ``SERVICE_NAME``."""
EnvKey = Annotated[
    str, StringConstraints(min_length=1, max_length=256, pattern=r"^[^=]+$"), AfterValidator(plain_text)
]
"""An environment variable's name: 1-256 characters, no ``=`` (it would end the name),
no control or format character."""
MAX_ENV = 1024
"""Variables in one environment (Slurm has no bound; Linux's is the argument space)."""
INT32 = 2**31 - 1
"""The largest value of an ``Integer`` column (PostgreSQL's ``integer``)."""
INT64 = 2**63 - 1
MAX_GPU_INDEX = 1023
ID_RANGE = "1 .. 2^31-1"
Id = Annotated[int, Field(ge=1, le=INT32, description=f"an object id ({ID_RANGE})")]
"""An object's id wherever it is given (a body field, and through ``problems.ObjectId``
and ``IdQuery`` a path or query parameter): every id column is an ``Integer``
(PostgreSQL's ``integer``), so a larger number is refused here (422) instead of failing
in the driver (a 500 on PostgreSQL, where SQLite answered 404)."""
_SURROGATE = re.compile("[\ud800-\udfff]")
_FINE: frozenset[type] = frozenset({float, bool, type(None)})


def unstorable(value: object) -> str | None:
    """Why ``value`` (a validated field value) cannot be stored, or None. Nested models
    are skipped: their own validator has run."""
    kind = type(value)
    if kind in _FINE:
        return None
    if kind is str:
        text: str = value  # type: ignore[assignment]
        if "\x00" in text:
            return "contains a NUL character (U+0000), which cannot be stored"
        if not text.isascii() and _SURROGATE.search(text) is not None:
            return "is not valid Unicode text (it holds a lone surrogate)"
        return None
    if kind is int:
        return None if -INT64 - 1 <= value <= INT64 else "is out of range (at most 64-bit integers)"  # type: ignore[operator]
    if isinstance(value, str | int):  # a subclass (an enum member...): as its base
        return unstorable(str(value) if isinstance(value, str) else int(value))
    if isinstance(value, list | tuple | set | frozenset):
        for i, item in enumerate(value):
            why = unstorable(item)
            if why is not None:
                return f"item {i} {why}"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            shown = repr(key[:40] if isinstance(key, str) else key)
            why = unstorable(key)
            if why is not None:
                return f"key {shown} {why}"
            why = unstorable(item)
            if why is not None:
                return f"the value of {shown} {why}"
    return None


def clean_text(text: str) -> str:
    """Output to show, made storable: NUL becomes U+2400 "\u2400" (the symbol for it), a
    lone surrogate U+FFFD; every other character stays as it is."""
    if "\x00" in text:
        text = text.replace("\x00", "\u2400")
    if not text.isascii():
        text = _SURROGATE.sub("\ufffd", text)
    return text


def _may_be_unstorable(annotation: object) -> bool:
    """Whether a field of this type can hold a value ``unstorable`` refuses: not for
    floats, booleans, literals and nested models (those check themselves)."""
    if annotation in _FINE or annotation is type(None):
        return False
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return False
    origin = get_origin(annotation)
    if origin is Literal:
        return False
    if origin is Annotated:
        return _may_be_unstorable(get_args(annotation)[0])
    if origin is not None:
        return any(_may_be_unstorable(a) for a in get_args(annotation) if a is not Ellipsis)
    return True


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    _checked: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._checked = tuple(n for n, f in cls.model_fields.items() if _may_be_unstorable(f.annotation))

    @model_validator(mode="after")
    def _storable(self) -> Self:
        """One pass over the fields that may hold text or integers (a validator per
        field cost several times more: a sync with eight GPUs has some 250 fields)."""
        errors: list[InitErrorDetails] = []
        values = self.__dict__
        for name in self._checked:
            value = values[name]
            kind = type(value)
            if (
                kind in _FINE
                or (kind is int and -INT64 - 1 <= value <= INT64)
                or (kind is str and value.isascii() and "\x00" not in value)
                or (kind is list and not value)
            ):
                continue  # the common cases, without a call
            why = unstorable(value)
            if why is not None:
                unfit = PydanticCustomError("unstorable", "{why}", {"why": why})
                errors.append(InitErrorDetails(type=unfit, loc=(name,), input=value))
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self


class Reply(BaseModel):
    model_config = ConfigDict(frozen=True)
