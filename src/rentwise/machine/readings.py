"""GPU readings: the one interface (`GpuSource`) through which doctor, bench and watch see the hardware.

Two implementations: `NvmlSource` reads a live machine through NVML (`nvidia-ml-py`, the `gpu` extra) and
`TraceSource` replays a trace file written by `rentwise watch --record`. The advice rules, the bench verdict
and the rendering only ever see the frozen dataclasses below, so they are tested on CPU with trace files.

Field meanings follow the NVML API reference (docs.nvidia.com/deploy/nvml-api): `utilization_pct` is
nvmlDeviceGetUtilizationRates().gpu, "percent of time over the past sample period during which one or more
kernels was executing on the GPU"; `memory_used_bytes` is nvmlDeviceGetMemoryInfo().used (nvidia-smi's
"used"); `clock_event_reasons` is the nvmlDeviceGetCurrentClocksEventReasons() bitmask (once called
"throttle reasons").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from types import UnionType
from typing import IO, Any, Protocol, TypeVar, Union, get_args, get_origin, get_type_hints

from rentwise.errors import ConfigError, NotFoundError

T = TypeVar("T")

TRACE_FORMAT = "rentwise-gpu-trace"
TRACE_VERSION = 1

# nvmlClocksEventReason* bits (nvml.h; the same values pynvml exports).
REASON_GPU_IDLE = 0x1
REASON_APPLICATIONS_CLOCKS = 0x2
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SYNC_BOOST = 0x10
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80
REASON_NAMES: dict[int, str] = {
    REASON_SW_POWER_CAP: "power cap",
    REASON_HW_SLOWDOWN: "hardware slowdown",
    REASON_SW_THERMAL: "thermal (software)",
    REASON_HW_THERMAL: "thermal (hardware)",
    REASON_HW_POWER_BRAKE: "power brake (host PSU)",
}
THERMAL_REASONS = REASON_SW_THERMAL | REASON_HW_THERMAL
HARDWARE_REASONS = REASON_HW_SLOWDOWN | REASON_HW_POWER_BRAKE
SLOWDOWN_REASONS = THERMAL_REASONS | HARDWARE_REASONS | REASON_SW_POWER_CAP


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU (NVML compute + graphics process lists)."""

    pid: int
    used_memory_bytes: int | None


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one instant."""

    index: int
    uuid: str
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_pct: float | None = None
    memory_utilization_pct: float | None = None
    """Percent of time device memory was being read or written (NVML), not how full it is."""
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: float | None = None
    memory_clock_mhz: float | None = None
    clock_event_reasons: int = 0
    processes: tuple[GpuProcess, ...] = ()

    @property
    def memory_used_fraction(self) -> float:
        return self.memory_used_bytes / self.memory_total_bytes if self.memory_total_bytes else 0.0

    def slowdown_reasons(self) -> list[str]:
        """Names of the active clock-slowdown reasons (idle, sync boost and app clocks are not slowdowns)."""
        return [name for bit, name in REASON_NAMES.items() if self.clock_event_reasons & bit]


@dataclass(frozen=True)
class HostReading:
    """The host at one instant: CPU, RAM and disk throughput since the previous sample."""

    cpu_pct: float
    ram_used_bytes: int
    ram_total_bytes: int
    disk_read_bytes_per_s: float = 0.0
    disk_write_bytes_per_s: float = 0.0


@dataclass(frozen=True)
class Sample:
    """Everything read at one instant. `gpus` lists the GPUs that answered; a missing one fell off the bus."""

    t_s: float
    """Seconds since the start of the recording."""
    gpus: tuple[GpuReading, ...]
    host: HostReading | None = None
    job_pids: tuple[int, ...] = ()
    """The watched command's process tree at this instant (empty when no command is watched)."""
    job_alive: bool | None = None
    """Whether the watched command still runs; None when no command is watched."""
    lost_gpus: tuple[int, ...] = ()
    """GPU indexes that stopped answering (NVML_ERROR_GPU_IS_LOST) at this instant."""


@dataclass(frozen=True)
class GpuFacts:
    """What does not change while a machine runs: identity, limits, link state, error counters."""

    index: int
    name: str
    uuid: str
    memory_total_bytes: int
    compute_capability: str | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_max_gen: int | None = None
    pcie_max_width: int | None = None
    persistence_mode: bool | None = None
    ecc_enabled: bool | None = None
    ecc_uncorrected_volatile: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_failed: bool | None = None
    power_limit_w: float | None = None
    default_power_limit_w: float | None = None
    max_sm_clock_mhz: float | None = None
    nvlink_active_links: int | None = None


@dataclass(frozen=True)
class MachineFacts:
    """The machine as a source sees it. `unavailable` says why there are no GPUs to read, in words."""

    source: str
    """"nvml", "trace:<path>" or "none"."""
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    """The newest CUDA version the driver supports, e.g. "12.4" (nvmlSystemGetCudaDriverVersion)."""
    gpus: tuple[GpuFacts, ...] = ()
    topology: tuple[tuple[int, int, str], ...] = ()
    """(gpu a, gpu b, link) for each pair: "NVLink", "same PCIe switch", "across CPU sockets", ..."""
    unavailable: str | None = None
    synthetic: bool = False
    """True for hand-written scenario traces (never for anything read from hardware)."""
    description: str = ""


class GpuSource(Protocol):
    """Where readings come from: a live NVML session or a recorded trace."""

    def facts(self) -> MachineFacts:
        """Static facts, read once."""
        ...

    def sample(self, t_s: float) -> Sample | None:
        """The next reading (a trace returns None when it is exhausted)."""
        ...


# ---------------------------------------------------------------------------------------------------------
# No GPU


@dataclass(frozen=True)
class NoGpuSource:
    """A machine without NVML: facts say why, samples carry no GPUs."""

    reason: str

    def facts(self) -> MachineFacts:
        return MachineFacts(source="none", unavailable=self.reason)

    def sample(self, t_s: float) -> Sample | None:
        return Sample(t_s=t_s, gpus=())


def open_source() -> GpuSource:
    """The live NVML source, or a `NoGpuSource` that says why NVML cannot be used here."""
    from rentwise.machine.nvml import NvmlSource, nvml_unavailable_reason

    reason = nvml_unavailable_reason()
    if reason is not None:
        return NoGpuSource(reason)
    return NvmlSource()


# ---------------------------------------------------------------------------------------------------------
# Trace files: JSON Lines. Line 1 is a header {"format", "version", "facts"}; each further line is a Sample.


class FieldError(ValueError):
    """A JSON value that does not fit its dataclass field. `field` is its path, e.g. 'gpus[0].power_w'."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"field '{field}' {problem}")
        self.field = field


def from_json(cls: type[T], raw: object, where: str = "") -> T:
    """Build the frozen dataclass `cls` from its JSON form, checking every field against its annotation.

    Unknown keys are ignored (a newer writer may add fields); JSON lists become tuples and integers are
    accepted where a float is declared. Raises `FieldError` naming the first field that does not fit.
    """
    if not isinstance(raw, Mapping):
        raise FieldError(where or cls.__name__, f"must be an object, got {_shown(raw)}")
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    for spec in fields(cls):  # type: ignore[arg-type]
        path = f"{where}.{spec.name}" if where else spec.name
        if spec.name in raw:
            values[spec.name] = _checked(hints[spec.name], raw[spec.name], path)
        elif spec.default is MISSING and spec.default_factory is MISSING:
            raise FieldError(path, "is missing")
    return cls(**values)


def _checked(annotation: Any, value: object, path: str) -> Any:
    """`value` converted to `annotation` (the types these dataclasses use), or a `FieldError`."""
    options = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    if value is None and type(None) in options:
        return None
    (expected,) = [option for option in options if option is not type(None)]  # X or X | None only
    nullable = " or null" if len(options) > 1 else ""
    if is_dataclass(expected):
        return from_json(expected, value, path)  # type: ignore[arg-type]
    if get_origin(expected) is tuple:
        items = get_args(expected)
        if not isinstance(value, list) or (items[-1] is not Ellipsis and len(value) != len(items)):
            size = "" if items[-1] is Ellipsis else f" of {len(items)}"
            raise FieldError(path, f"must be a list{size}{nullable}, got {_shown(value)}")
        kinds = [items[0]] * len(value) if items[-1] is Ellipsis else list(items)
        pairs = enumerate(zip(kinds, value, strict=True))
        return tuple(_checked(kind, item, f"{path}[{i}]") for i, (kind, item) in pairs)
    name, fits = _SCALARS[expected]
    if not fits(value):
        wanted = "true, false or null" if nullable and expected is bool else f"{name}{nullable}"
        raise FieldError(path, f"must be {wanted}, got {_shown(value)}")
    return float(value) if expected is float else value  # type: ignore[arg-type]


# JSON booleans are Python ints, so `int` and `float` fields reject them explicitly.
_SCALARS: dict[Any, tuple[str, Callable[[object], bool]]] = {
    bool: ("true or false", lambda v: isinstance(v, bool)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool)),
    str: ("a string", lambda v: isinstance(v, str)),
}


def _shown(value: object) -> str:
    """A JSON value as the user wrote it, cut short: 'lots', null, 3, [1, 2]."""
    text = f"'{value}'" if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def sample_from_dict(raw: Mapping[str, Any]) -> Sample:
    """A `Sample` from its JSON form (as written in traces and saved bench results)."""
    return from_json(Sample, raw)


def gpu_facts_from_dict(raw: Mapping[str, Any]) -> GpuFacts:
    """A `GpuFacts` from its JSON form."""
    return from_json(GpuFacts, raw)


def _to_dict(value: Any) -> Any:
    from rentwise.cli.render import to_jsonable

    return to_jsonable(value)


class TraceWriter:
    """Appends samples to a trace file as they arrive, so a crash keeps what was read."""

    def __init__(self, path: Path, facts: MachineFacts) -> None:
        self.path = path
        self._handle: IO[str] = path.open("w", encoding="utf-8")
        header = {"format": TRACE_FORMAT, "version": TRACE_VERSION, "facts": _to_dict(facts)}
        self._handle.write(json.dumps(header) + "\n")
        self._handle.flush()

    def write(self, sample: Sample) -> None:
        self._handle.write(json.dumps(_to_dict(sample)) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


def read_trace(path: Path) -> tuple[MachineFacts, tuple[Sample, ...]]:
    """Load a trace file.

    Raises:
        NotFoundError: the file does not exist.
        ConfigError: it is not a rentwise trace; the message names the line.
    """
    if not path.exists():
        raise NotFoundError(
            f"trace file '{path}' does not exist", hint="record one with `rentwise watch --record`"
        )
    text = read_text_file(
        path, "trace file", hint="pass the .jsonl file `rentwise watch --record FILE` wrote"
    )
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ConfigError(f"{path}: empty trace file", hint="record one with `rentwise watch --record FILE`")
    header = _parse_line(path, 1, lines[0])
    if header.get("format") != TRACE_FORMAT or header.get("version") != TRACE_VERSION:
        raise ConfigError(
            f"{path}: line 1 is not a {TRACE_FORMAT} v{TRACE_VERSION} header",
            hint="record one with `rentwise watch --record FILE`",
        )
    facts = _build(path, 1, MachineFacts, header.get("facts", {}), where="facts")
    samples = tuple(
        _build(path, n, Sample, _parse_line(path, n, line)) for n, line in enumerate(lines[1:], 2)
    )
    return facts, samples


def read_text_file(path: Path, what: str, hint: str) -> str:
    """The text of `path`, or a `ConfigError` saying why it cannot be read (a folder, binary, no access)."""
    if not path.is_file():
        raise ConfigError(f"{what} '{path}' is not a file", hint=hint)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{what} '{path}' is not a text file", hint=hint) from None
    except OSError as error:
        raise ConfigError(f"cannot read {what} '{path}': {error.strerror}", hint=hint) from None


def _parse_line(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        parsed = json.loads(line)
    except json.JSONDecodeError as error:
        raise ConfigError(
            f"{path}: line {number} is not JSON ({error.msg})", hint="is this a trace file?"
        ) from None
    if not isinstance(parsed, dict):
        raise ConfigError(f"{path}: line {number} is not a JSON object", hint="is this a trace file?")
    return parsed


def _build(path: Path, number: int, cls: type[T], raw: object, where: str = "") -> T:
    try:
        return from_json(cls, raw, where)
    except FieldError as error:
        raise ConfigError(f"{path}: line {number}: {error}", hint="is this a trace file?") from None


@dataclass
class TraceSource:
    """Replays a recorded trace: `facts()` from its header, `sample()` hands out its samples in order."""

    facts_: MachineFacts
    samples: tuple[Sample, ...]
    _cursor: Iterator[Sample] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._cursor = iter(self.samples)

    @classmethod
    def from_file(cls, path: Path) -> TraceSource:
        facts, samples = read_trace(path)
        return cls(facts_=facts, samples=samples)

    def facts(self) -> MachineFacts:
        return self.facts_

    def sample(self, t_s: float) -> Sample | None:
        return next(self._cursor, None)
