"""Byte sizes as people write them: `"80GiB"` → bytes (`parse_size`), bytes → `"1.50 GiB"`.

Used by `tokenmill plan` (`--device-memory 80GiB`) and in the memory planner's messages.
"""

from __future__ import annotations

import re
from decimal import Decimal
from types import MappingProxyType

# Size units, lower-case: decimal KB..TB, binary KiB..TiB (also Kubernetes' Ki..Ti).
_UNITS: MappingProxyType[str, int] = MappingProxyType(
    {"": 1, "b": 1}
    | {f"{p}b": 10 ** (3 * n) for n, p in enumerate("kmgt", 1)}
    | {f"{p}{i}": 2 ** (10 * n) for n, p in enumerate("kmgt", 1) for i in ("ib", "i")}
)
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes from `"80GiB"`, `"512MiB"`, `"1.5GB"`, `"1073741824"` (floored to whole bytes).

    Binary units: KiB MiB GiB TiB (also Ki Mi Gi Ti); decimal: KB MB GB TB; `B` or no unit:
    bytes. Case-insensitive. A bare `K`/`M`/`G`/`T` is refused as ambiguous.
    """
    match = _SIZE_RE.match(text)
    if match is None:
        raise ValueError(
            f"cannot read {text!r} as a size; write a number with an optional unit, "
            "e.g. 80GiB, 512MiB, 1.5GB or 1073741824"
        )
    number, unit = match.groups()
    key = unit.lower()
    if key in ("k", "m", "g", "t"):
        raise ValueError(
            f"ambiguous unit {unit!r} in {text!r}: write {unit.upper()}iB (binary, "
            f"2**{10 * 'kmgt'.index(key) + 10}) or {unit.upper()}B (decimal)"
        )
    if key not in _UNITS:
        raise ValueError(
            f"unknown unit {unit!r} in {text!r}; use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB"
        )
    return int(Decimal(number) * _UNITS[key])


def format_bytes(n: int) -> str:
    """`1610612736` → `"1.50 GiB"` (binary units; negative numbers keep their sign)."""
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{sign}{value:.0f} B" if unit == "B" else f"{sign}{value:.2f} {unit}"
        value /= 1024
    return f"{sign}{value:.2f} TiB"
