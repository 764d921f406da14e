"""Units at the edges: bytes <-> GiB/GB, sizes typed by users, durations. Internally bytes are `int`.

"GiB" is 2**30 bytes and "GB" is 10**9 bytes, as the SI/IEC prefixes define them (accelerate labels
1024-based sizes "GB"; we do not).
"""

from __future__ import annotations

import re

from rentwise.errors import ConfigError

KIB = 1024
MIB = 1024**2
GIB = 1024**3
GB = 10**9

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_FACTORS = {
    "b": 1,
    "k": 10**3, "kb": 10**3, "ki": KIB, "kib": KIB,
    "m": 10**6, "mb": 10**6, "mi": MIB, "mib": MIB,
    "g": GB, "gb": GB, "gi": GIB, "gib": GIB,
    "t": 10**12, "tb": 10**12, "ti": 1024**4, "tib": 1024**4,
}  # fmt: skip


def parse_size(text: str, default_unit: str = "gib") -> int:
    """Parse '24', '24GB', '80 GiB', '512MiB' into bytes; a bare number uses `default_unit`."""
    match = _SIZE.match(text)
    if not match:
        raise ConfigError(f"cannot read '{text}' as a size", hint="write it like 24GiB, 80GB or 512MiB")
    number, unit = match.groups()
    return int(float(number) * _FACTORS[(unit or default_unit).lower()])


def gib(n_bytes: int | float) -> float:
    """Bytes as GiB (2**30)."""
    return n_bytes / GIB


def format_gib(n_bytes: int | float, digits: int = 2) -> str:
    """Bytes as a 'x.xx GiB' string."""
    return f"{n_bytes / GIB:.{digits}f} GiB"


def format_count(n: int | float) -> str:
    """A parameter or token count as 7.62B / 494M / 12.3K."""
    for factor, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= factor:
            return f"{n / factor:.3g}{suffix}"
    return f"{n:g}"


def format_duration(seconds: float) -> str:
    """Seconds as '2h 05m', '3m 20s' or '12.3s'."""
    if seconds >= 3600:
        hours, rest = divmod(round(seconds), 3600)
        return f"{hours}h {rest // 60:02d}m"
    if seconds >= 60:
        minutes, secs = divmod(round(seconds), 60)
        return f"{minutes}m {secs:02d}s"
    return f"{seconds:.1f}s"
