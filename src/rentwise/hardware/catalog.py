"""The GPU spec catalog: `GpuSpec` rows from the bundled `gpus.toml`, overridable by the user's TOML files.

Lookups are forgiving about case, spaces, dashes and vendor prefixes ("NVIDIA GeForce RTX 4090" == "rtx4090")
and fail with a did-you-mean `NotFoundError`. Usable memory per card is modelled explicitly (`usable_bytes`):
the total nvidia-smi reports where it is known, else a stated rule. Loading never imports torch.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from rentwise.errors import ConfigError, NotFoundError, RentwiseError, did_you_mean
from rentwise.units import GIB, MIB

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

Dtype = Literal["fp32", "tf32", "fp16", "bf16", "fp8", "int8"]
DTYPES: tuple[str, ...] = get_args(Dtype)

BUNDLED_FILE = Path(__file__).with_name("gpus.toml")
USER_FILE_NAME = "gpus.toml"
LIST_HINT = "run `rentwise gpus` to list known GPUs"

# ECC on GDDR memory stores check bits in ordinary memory: 1/16 of it (Tesla T4: 16384 MiB nameplate,
# nvidia-smi total 15360 MiB = 15/16; L4 23034 and A10/A10G 23028 of 24576 MiB, within 0.05% of 15/16).
ECC_RESERVED_FRACTION = 1 / 16
# Cards without ECC-on-GDDR lose a little to the driver/firmware: 0% (A100 80GB: 81920 MiB) to 1.37%
# (V100 16GB: 16160 of 16384 MiB) among the nvidia-smi totals in gpus.toml. 1/64 (1.56%) bounds them all.
OTHER_RESERVED_FRACTION = 1 / 64

# Vendor prefixes nvidia-smi and price lists put in front of a card's name.
_PREFIXES = ("nvidia", "geforce", "tesla", "quadro")


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model as the vendor specifies it. Peaks are dense (no 2:4 sparsity); absent means unknown."""

    name: str
    vendor: str
    memory_gib: float
    """Nameplate memory. NVIDIA's "80GB" HBM parts are 80 GiB (A100-SXM4-80GB: 81920 MiB in nvidia-smi)."""
    architecture: str
    compute_capability: str
    """CUDA compute capability "8.0", or text such as "n/a (gfx942)" for non-NVIDIA parts."""
    supports_bf16: bool
    source: str
    as_of: str
    aliases: tuple[str, ...] = ()
    memory_bandwidth_gbps: float | None = None
    fp32_tflops: float | None = None
    """Non-tensor fp32 peak."""
    tf32_tflops: float | None = None
    fp16_tflops: float | None = None
    """Tensor-core fp16 peak with fp32 accumulate (what PyTorch AMP uses)."""
    bf16_tflops: float | None = None
    fp8_tflops: float | None = None
    int8_tops: float | None = None
    interconnect: str = ""
    nvlink_gbps: float | None = None
    """NVLink bandwidth per GPU as the vendor states it; 0 = no NVLink; None = NVLink of unstated speed."""
    pcie_gbps: float | None = None
    """PCIe x16 bandwidth, both directions together (Gen4 x16 = 64); one direction is half. None = unknown."""
    tdp_w: float | None = None
    ecc_reserves_memory: bool = False
    """GDDR datacenter card shipped with ECC on, which reserves 1/16 of memory."""
    smi_total_mib: int | None = None
    """The total nvidia-smi prints for this card, where a public printout was found."""
    notes: str = ""
    origin: str = "bundled"
    """Where the row was last set: "bundled" or the path of the user file that overrode it."""

    @property
    def memory_bytes(self) -> int:
        """Nameplate memory in bytes."""
        return int(self.memory_gib * GIB)

    @property
    def usable_bytes(self) -> int:
        """Memory a process can see in total (nvidia-smi's total); the CUDA context is NOT subtracted."""
        if self.smi_total_mib is not None:
            return self.smi_total_mib * MIB
        reserved = ECC_RESERVED_FRACTION if self.ecc_reserves_memory else OTHER_RESERVED_FRACTION
        return int(self.memory_bytes * (1 - reserved))

    @property
    def usable_rule(self) -> str:
        """How `usable_bytes` was obtained, in words."""
        if self.smi_total_mib is not None:
            return f"nvidia-smi total {self.smi_total_mib} MiB"
        if self.ecc_reserves_memory:
            return "nameplate x 15/16 (ECC on GDDR reserves 1/16)"
        return "nameplate x (1 - 1/64) (no nvidia-smi total known; bound on driver reservation)"

    def matches_memory_total(self, total_bytes: int) -> bool:
        """Whether a total reported by NVML fits this card: within 1% of the known nvidia-smi total, or
        between the rule's lower bound and the nameplate when no total is known (the rule is a bound)."""
        tolerance = 0.01
        if self.smi_total_mib is not None:
            return abs(total_bytes - self.usable_bytes) <= tolerance * self.usable_bytes
        return (1 - tolerance) * self.usable_bytes <= total_bytes <= (1 + tolerance) * self.memory_bytes

    def tflops(self, dtype: Dtype) -> float | None:
        """Dense peak for `dtype` (TOPS for int8), or None when the catalog does not know it."""
        value: float | None = getattr(self, "int8_tops" if dtype == "int8" else f"{dtype}_tflops")
        return value


# ---------------------------------------------------------------------------------------------------------
# Lookup


@functools.lru_cache(maxsize=4096)
def normalize_name(name: str) -> str:
    """The lookup key: lower case, no spaces/dashes/underscores, no vendor prefix ('NVIDIA GeForce ')."""
    key = re.sub(r"[\s\-_]+", "", name.lower())
    stripped = True
    while stripped:
        stripped = False
        for prefix in _PREFIXES:
            if key.startswith(prefix) and len(key) > len(prefix):
                key = key[len(prefix) :]
                stripped = True
    return key


def find_gpu(name: str, gpus: Sequence[GpuSpec] | None = None) -> GpuSpec:
    """Return the catalog entry called `name` (or one of its aliases).

    Raises:
        NotFoundError: no such GPU, with the closest names suggested.
    """
    catalog = load_gpus() if gpus is None else tuple(gpus)
    index = _lookup_index(catalog)
    found = index.get(normalize_name(name))
    if found is not None:
        return found
    known = [gpu.name for gpu in catalog] + [alias for gpu in catalog for alias in gpu.aliases]
    raise NotFoundError(f"no GPU named '{name}' in the catalog{did_you_mean(name, known)}", hint=LIST_HINT)


# load_gpus() hands out the same cached tuple each time, so its index is kept by identity (planners call
# find_gpu once per offer).
_INDEX_CACHE: dict[int, tuple[tuple[GpuSpec, ...], dict[str, GpuSpec]]] = {}


def _lookup_index(catalog: tuple[GpuSpec, ...]) -> dict[str, GpuSpec]:
    cached = _INDEX_CACHE.get(id(catalog))
    if cached is not None and cached[0] is catalog:
        return cached[1]
    if len(_INDEX_CACHE) >= 16:
        _INDEX_CACHE.clear()
    index = _index(catalog)
    _INDEX_CACHE[id(catalog)] = (catalog, index)
    return index


def _index(gpus: Iterable[GpuSpec]) -> dict[str, GpuSpec]:
    index: dict[str, GpuSpec] = {}
    for gpu in gpus:
        for key in (gpu.name, *gpu.aliases):
            index.setdefault(normalize_name(key), gpu)
    return index


def dense_tflops(gpu: GpuSpec, dtype: Dtype) -> float:
    """Dense peak TFLOPS of `gpu` for `dtype` (TOPS for int8).

    Raises:
        RentwiseError: the card lacks the dtype (bf16 on a T4) or the catalog has no figure for it.
    """
    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype '{dtype}'", hint=f"use one of {', '.join(DTYPES)}")
    if dtype == "bf16" and not gpu.supports_bf16:
        raise RentwiseError(f"{gpu.name} has no bf16 support", hint="use fp16 (with a loss scaler) or fp32")
    value = gpu.tflops(dtype)
    if value is None:
        raise RentwiseError(
            f"the catalog has no dense {dtype} peak for {gpu.name}",
            hint=f"add {'int8_tops' if dtype == 'int8' else dtype + '_tflops'} for '{gpu.name}' "
            f"to {user_catalog_path()}",
        )
    return value


# ---------------------------------------------------------------------------------------------------------
# Loading


def user_config_dir() -> Path:
    """$RENTWISE_CONFIG_DIR, else the platform's config folder (XDG on Linux, AppData on Windows)/rentwise."""
    explicit = os.environ.get("RENTWISE_CONFIG_DIR")
    if explicit:
        return Path(explicit).expanduser()
    if sys.platform == "win32":
        return Path(os.environ.get("APPDATA", Path.home() / "AppData" / "Roaming")) / "rentwise"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "rentwise"
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "rentwise"


def user_catalog_path() -> Path:
    """Where the user's own GPU rows live (read if it exists)."""
    return user_config_dir() / USER_FILE_NAME


def load_gpus(extra_files: Sequence[Path] = ()) -> tuple[GpuSpec, ...]:
    """The bundled catalog, then the user's `gpus.toml`, then `extra_files`, later files winning.

    A row whose name (or alias) matches an existing GPU overrides only the fields it gives; any other row
    adds a GPU and must give every required field.

    Raises:
        ConfigError: a file is unreadable or invalid; the message names the file, entry and field.
    """
    files = [user_catalog_path(), *extra_files]
    stamps = tuple((str(path), _mtime_ns(path)) for path in files)
    return _load_cached(stamps)


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return -1


@functools.lru_cache(maxsize=16)
def _load_cached(stamps: tuple[tuple[str, int], ...]) -> tuple[GpuSpec, ...]:
    gpus = list(_bundled())
    for index, (path_text, mtime) in enumerate(stamps):
        path = Path(path_text)
        is_user_default = index == 0
        if mtime < 0:
            if is_user_default:
                continue  # the user's own file is optional
            raise NotFoundError(f"GPU catalog file '{path}' does not exist", hint="check the path")
        gpus = merge_rows(gpus, _read_rows(path), origin=str(path))
    return tuple(gpus)


@functools.lru_cache(maxsize=1)
def _bundled() -> tuple[GpuSpec, ...]:
    return tuple(merge_rows([], _read_rows(BUNDLED_FILE), origin="bundled"))


def _read_rows(path: Path) -> list[Any]:
    try:
        with path.open("rb") as handle:
            document = tomllib.load(handle)
    except OSError as error:
        raise ConfigError(
            f"cannot read GPU catalog '{path}': {error.strerror}", hint="check the path"
        ) from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(
            f"{path}: not valid TOML ({error})",
            hint="each GPU is a [[gpu]] table; see `rentwise gpus --help`",
        ) from None
    rows = document.get("gpu", [])
    unknown = sorted(set(document) - {"gpu"})
    if unknown or not isinstance(rows, list):
        found = ", ".join(repr(key) for key in unknown) or "gpu = ..."
        raise ConfigError(
            f"{path}: expected only [[gpu]] tables, found {found}",
            hint="each GPU is a [[gpu]] table with a name and the fields of `rentwise gpus --json`",
        )
    return rows


_FIELDS = {f.name: f for f in dataclasses.fields(GpuSpec) if f.name != "origin"}
_REQUIRED = tuple(f.name for f in dataclasses.fields(GpuSpec) if f.default is dataclasses.MISSING)
_NUMBER_FIELDS = frozenset(
    name for name, f in _FIELDS.items() if f.type in ("float", "float | None", "int | None")
)
_BOOL_FIELDS = frozenset(name for name, f in _FIELDS.items() if f.type == "bool")


def merge_rows(gpus: Sequence[GpuSpec], rows: Sequence[Any], origin: str) -> list[GpuSpec]:
    """Apply TOML rows (dicts) on top of `gpus`; raise one `ConfigError` listing every problem."""
    merged = list(gpus)
    index = _index(merged)
    problems: list[str] = []
    for position, row in enumerate(rows, start=1):
        label = f"{origin}: gpu #{position}"
        if not isinstance(row, dict) or not isinstance(row.get("name"), str) or not row["name"].strip():
            problems.append(f"{label}: every [[gpu]] needs a non-empty text field 'name'")
            continue
        label = f"{origin}: gpu #{position} '{row['name']}'"
        values, row_problems = _check_row(row, label)
        problems.extend(row_problems)
        if row_problems:
            continue
        existing = index.get(normalize_name(row["name"]))
        if existing is not None:
            values.pop("name")  # an alias may have matched: keep the catalog's own name
            updated = dataclasses.replace(existing, origin=origin, **values)
            merged[merged.index(existing)] = updated
            index = _index(merged)  # rare (user overrides only): aliases may have changed
            continue
        missing = [name for name in _REQUIRED if name not in values]
        if missing:
            problems.append(f"{label}: a new GPU needs field(s) {', '.join(repr(m) for m in missing)}")
            continue
        added = GpuSpec(origin=origin, **values)
        merged.append(added)
        for key in (added.name, *added.aliases):
            index.setdefault(normalize_name(key), added)
    if problems:
        raise ConfigError(
            "; ".join(problems), hint="fix the file, or run `rentwise gpus --json` for examples"
        )
    return merged


def _check_row(row: Mapping[str, Any], label: str) -> tuple[dict[str, Any], list[str]]:
    values: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in row.items():
        if key not in _FIELDS:
            problems.append(f"{label}: unknown field '{key}'{did_you_mean(key, _FIELDS)}")
        elif key == "aliases":
            if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
                problems.append(f"{label}: field 'aliases' must be a list of strings, got {value!r}")
            else:
                values[key] = tuple(value)
        elif key in _BOOL_FIELDS:
            if not isinstance(value, bool):
                problems.append(f"{label}: field '{key}' must be true or false, got {value!r}")
            values[key] = value
        elif key in _NUMBER_FIELDS:
            problems.extend(_check_number(label, key, value))
            values[key] = int(value) if key == "smi_total_mib" and isinstance(value, int) else value
        elif not isinstance(value, str):
            problems.append(f"{label}: field '{key}' must be text, got {value!r}")
        else:
            values[key] = value
    return values, problems


def _check_number(label: str, key: str, value: Any) -> list[str]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return [f"{label}: field '{key}' must be a number, got {value!r}"]
    if key == "smi_total_mib" and not isinstance(value, int):
        return [f"{label}: field 'smi_total_mib' must be a whole number of MiB, got {value!r}"]
    if value < 0 or (value == 0 and key not in ("nvlink_gbps",)):
        return [f"{label}: field '{key}' must be positive, got {value!r}"]
    return []
