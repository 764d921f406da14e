"""`doctor`: judge a machine for a use (train, inference or plan), one check per line, each with its fix.

Pure: takes `DoctorInputs` (gathered by `probe.gather_inputs`) and returns `Check`s. What a check cannot see
it says, as a "skip" with the reason. Only "fail" makes the machine unfit for the requested use; "warn" is
worth knowing (and fails under --strict).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

from rentwise.errors import RentwiseError
from rentwise.hardware.catalog import GpuSpec, find_gpu
from rentwise.machine.probe import DoctorInputs, Use
from rentwise.machine.readings import GpuFacts
from rentwise.units import GIB, format_gib

Status = Literal["ok", "info", "warn", "fail", "skip"]
USES: tuple[str, ...] = get_args(Use)

# bf16 tensor cores arrived with Ampere (compute capability 8.0) and fp8 with Ada (8.9) and Hopper (9.0):
# CUDA C++ Programming Guide, "Compute Capabilities" / NVIDIA Ada and Hopper architecture whitepapers.
BF16_MIN_CAPABILITY = (8, 0)
FP8_MIN_CAPABILITY = (8, 9)
# Memory held on a GPU beyond one CUDA context (~0.3-1.3 GiB, shared/data README) means another job is there.
FOREIGN_MEMORY_BYTES = GIB
TORCH_CUDA_WHEELS = "https://download.pytorch.org/whl/"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str | None = None


@dataclass(frozen=True)
class DoctorReport:
    use: Use
    checks: tuple[Check, ...]

    @property
    def failed(self) -> bool:
        return any(c.status == "fail" for c in self.checks)

    @property
    def warned(self) -> bool:
        return any(c.status == "warn" for c in self.checks)


def _needs_gpu(use: Use) -> bool:
    return use in ("train", "inference")


def _no_gpu_skip(name: str, inputs: DoctorInputs) -> Check:
    """A GPU check that cannot run: the short form of the reason (the driver line gives the long one)."""
    reason = (inputs.facts.unavailable or "no GPU found").split(" (")[0]
    return Check(name, "skip", f"skipped: {reason}")


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())


# ---------------------------------------------------------------------------------------------------------
# Checks: each takes the inputs and the use and returns one or more Check.


def check_driver(inputs: DoctorInputs, use: Use) -> list[Check]:
    facts = inputs.facts
    if facts.unavailable:
        if not _needs_gpu(use):
            return [Check("NVIDIA driver", "skip", f"skipped: {facts.unavailable} (planning needs no GPU)")]
        return [
            Check(
                "NVIDIA driver",
                "fail",
                facts.unavailable,
                "rent an instance with an NVIDIA GPU and driver; in a container, start it with `--gpus all` "
                "(NVIDIA Container Toolkit) and install nvidia-ml-py (pip install 'rentwise[gpu]')",
            )
        ]
    if not facts.gpus:
        status: Status = "fail" if _needs_gpu(use) else "info"
        return [Check("NVIDIA driver", status, f"driver {facts.driver_version} loaded but no GPU is visible")]
    return [
        Check(
            "NVIDIA driver",
            "ok",
            f"driver {facts.driver_version}, supports CUDA up to {facts.cuda_driver_version or '?'}, "
            f"{len(facts.gpus)} GPU(s)",
        )
    ]


def check_torch(inputs: DoctorInputs, use: Use) -> list[Check]:
    torch = inputs.torch
    if not torch.installed:
        if use == "plan":
            return [Check("torch", "skip", "skipped: torch is not installed (planning does not need it)")]
        return [Check("torch", "fail", "torch is not installed", "pip install 'rentwise[train]'")]
    if not torch.imported:
        return [
            Check("torch", "info", f"torch {torch.version} installed (not imported: {use} does not need it)")
        ]
    if torch.error:
        return [Check("torch", "fail", f"torch does not import: {torch.error}", "reinstall torch")]
    if torch.cuda_build is None:
        detail = f"torch {torch.version} is a CPU-only build"
        if inputs.facts.gpus and _needs_gpu(use):
            return [Check("torch", "fail", detail, _torch_wheel_hint(inputs.facts.cuda_driver_version))]
        return [Check("torch", "info" if use == "plan" else "warn", detail)]
    return [
        Check("torch", "ok", f"torch {torch.version}, built for CUDA {torch.cuda_build}"),
        _torch_vs_driver(inputs),
    ]


def _torch_wheel_hint(driver_cuda: str | None) -> str:
    if driver_cuda is None:
        return f"install a CUDA build of torch ({TORCH_CUDA_WHEELS})"
    tag = "cu" + driver_cuda.replace(".", "")
    return (
        "install a CUDA build no newer than the driver, e.g. "
        f"pip install torch --index-url {TORCH_CUDA_WHEELS}{tag}"
    )


def _torch_vs_driver(inputs: DoctorInputs) -> Check:
    """CUDA compatibility (NVIDIA "CUDA Compatibility" guide): a driver runs CUDA builds up to its own CUDA
    version; within one major version, newer minor builds also run ("minor version compatibility") except for
    features that need a newer driver, such as JIT-compiling PTX."""
    torch_cuda, driver_cuda = inputs.torch.cuda_build, inputs.facts.cuda_driver_version
    name = "torch vs driver"
    if not torch_cuda or not driver_cuda:
        return Check(name, "skip", "skipped: needs both a CUDA build of torch and an NVIDIA driver")
    built, supported = _version_tuple(torch_cuda), _version_tuple(driver_cuda)
    if built <= supported:
        return Check(name, "ok", f"torch's CUDA {torch_cuda} <= driver's CUDA {driver_cuda}")
    fix = f"upgrade the driver, or {_torch_wheel_hint(driver_cuda)}"
    if built[0] > supported[0]:
        return Check(
            name, "fail", f"torch needs CUDA {torch_cuda}, the driver supports only {driver_cuda}", fix
        )
    return Check(
        name,
        "warn",
        f"torch's CUDA {torch_cuda} is newer than the driver's {driver_cuda}: it runs through minor-version "
        "compatibility, but kernels that need PTX JIT can fail",
        fix,
    )


def check_visibility(inputs: DoctorInputs, use: Use) -> list[Check]:
    facts, torch = inputs.facts, inputs.torch
    if not facts.gpus:
        return [_no_gpu_skip("GPU visible to torch", inputs)]
    if not torch.imported:
        return [
            Check("GPU visible to torch", "skip", f"skipped: torch not imported ({use} does not need it)")
        ]
    if not torch.installed or torch.error or torch.cuda_build is None:
        return [Check("GPU visible to torch", "skip", "skipped: no usable CUDA build of torch")]
    if not torch.cuda_available:
        return [
            Check(
                "GPU visible to torch",
                "fail" if _needs_gpu(use) else "warn",
                f"NVML sees {len(facts.gpus)} GPU(s) but torch.cuda.is_available() is False",
                "check CUDA_VISIBLE_DEVICES, the container runtime (--gpus all) and the torch build",
            )
        ]
    restricted = (
        f" (CUDA_VISIBLE_DEVICES={inputs.cuda_visible_devices})" if inputs.cuda_visible_devices else ""
    )
    status: Status = "ok" if torch.device_count == len(facts.gpus) or restricted else "warn"
    return [
        Check(
            "GPU visible to torch",
            status,
            f"torch sees {torch.device_count} of {len(facts.gpus)}{restricted}",
        )
    ]


def check_capability(inputs: DoctorInputs, use: Use) -> list[Check]:
    if not inputs.facts.gpus:
        return [_no_gpu_skip("bf16 / fp8", inputs)]
    checks = []
    for gpu in inputs.facts.gpus:
        if gpu.compute_capability is None:
            checks.append(
                Check(f"GPU {gpu.index} bf16 / fp8", "skip", "skipped: compute capability not reported")
            )
            continue
        capability = _version_tuple(gpu.compute_capability)
        bf16, fp8 = capability >= BF16_MIN_CAPABILITY, capability >= FP8_MIN_CAPABILITY
        detail = (
            f"{gpu.name}, compute capability {gpu.compute_capability}: bf16 {'yes' if bf16 else 'no'}, "
            f"fp8 {'yes' if fp8 else 'no'}"
        )
        if not bf16 and use == "train":
            checks.append(
                Check(
                    f"GPU {gpu.index} bf16 / fp8",
                    "warn",
                    detail,
                    "train with fp16 AMP (loss scaling) or fp32",
                )
            )
        else:
            checks.append(Check(f"GPU {gpu.index} bf16 / fp8", "ok", detail))
    return checks


def check_identity(inputs: DoctorInputs, use: Use) -> list[Check]:
    """The card NVML names, looked up in the catalog, and its memory total against the catalog's."""
    checks = []
    for gpu in inputs.facts.gpus:
        spec = catalog_entry(gpu)
        name = f"GPU {gpu.index} identity"
        if spec is None:
            checks.append(Check(name, "info", f"'{gpu.name}' is not in the catalog: no spec to compare with"))
            continue
        expected = spec.usable_bytes
        detail = f"{gpu.name} = catalog '{spec.name}', {format_gib(gpu.memory_total_bytes)} total"
        if not spec.matches_memory_total(gpu.memory_total_bytes):
            checks.append(
                Check(
                    name,
                    "warn",
                    f"{detail}, but the catalog expects {format_gib(expected)} ({spec.usable_rule})",
                    "a different variant than advertised, a MIG slice, or ECC toggled: check what you rented",
                )
            )
        else:
            checks.append(Check(name, "ok", detail))
    return checks


def catalog_entry(gpu: GpuFacts) -> GpuSpec | None:
    """The catalog row for the name NVML reports, or None when the catalog does not know it."""
    try:
        return find_gpu(gpu.name)
    except RentwiseError:
        return None


def check_memory(inputs: DoctorInputs, use: Use) -> list[Check]:
    if not inputs.facts.gpus or inputs.sample is None:
        return [_no_gpu_skip("free GPU memory", inputs)]
    checks = []
    for reading in inputs.sample.gpus:
        name = f"GPU {reading.index} memory"
        free = reading.memory_total_bytes - reading.memory_used_bytes
        detail = f"{format_gib(free)} free of {format_gib(reading.memory_total_bytes)}"
        others = [p for p in reading.processes if p.pid not in inputs.own_pids]
        if others:
            held = ", ".join(
                f"PID {p.pid} ({format_gib(p.used_memory_bytes)})" if p.used_memory_bytes else f"PID {p.pid}"
                for p in others
            )
            checks.append(
                Check(name, "warn", f"{detail}; held by {held}", "stop those processes, or pick another GPU")
            )
        elif reading.memory_used_bytes > FOREIGN_MEMORY_BYTES:
            checks.append(
                Check(
                    name,
                    "warn",
                    f"{detail}; {format_gib(reading.memory_used_bytes)} used by processes not visible here",
                    "the card is shared with another tenant or job: ask the provider for a dedicated GPU",
                )
            )
        else:
            checks.append(Check(name, "ok", detail))
    return checks


def check_ecc(inputs: DoctorInputs, use: Use) -> list[Check]:
    if not inputs.facts.gpus:
        return [_no_gpu_skip("ECC / retired memory", inputs)]
    checks = []
    for gpu in inputs.facts.gpus:
        name = f"GPU {gpu.index} ECC"
        if gpu.ecc_enabled is None:
            checks.append(Check(name, "skip", "skipped: this card reports no ECC (GeForce cards have none)"))
        elif gpu.ecc_uncorrected_volatile or gpu.retired_pages_pending or gpu.remapped_rows_failed:
            checks.append(
                Check(
                    name,
                    "fail",
                    f"uncorrected ECC errors {gpu.ecc_uncorrected_volatile or 0}, retired pages pending "
                    f"{bool(gpu.retired_pages_pending)}, row remapping failed "
                    f"{bool(gpu.remapped_rows_failed)}",
                    "this card's memory is failing: ask the provider for another machine",
                )
            )
        else:
            state = "on" if gpu.ecc_enabled else "off"
            checks.append(Check(name, "ok", f"ECC {state}, no uncorrected errors, no pending retirements"))
    return checks


def check_persistence(inputs: DoctorInputs, use: Use) -> list[Check]:
    if not inputs.facts.gpus:
        return [_no_gpu_skip("persistence mode", inputs)]
    off = [g.index for g in inputs.facts.gpus if g.persistence_mode is False]
    if not off:
        return [Check("persistence mode", "ok", "on (or not reported)")]
    return [
        Check(
            "persistence mode",
            "warn" if _needs_gpu(use) else "info",
            f"off on GPU {', '.join(map(str, off))}: the driver tears down state between jobs, so each start "
            "pays the initialisation again and clock/power settings reset",
            "sudo nvidia-smi -pm 1 (or ask the provider)",
        )
    ]


def check_pcie(inputs: DoctorInputs, use: Use) -> list[Check]:
    if not inputs.facts.gpus:
        return [_no_gpu_skip("PCIe link", inputs)]
    checks = []
    for gpu in inputs.facts.gpus:
        name = f"GPU {gpu.index} PCIe"
        if gpu.pcie_width is None or gpu.pcie_max_width is None:
            checks.append(Check(name, "skip", "skipped: link state not reported"))
            continue
        detail = f"Gen{gpu.pcie_gen} x{gpu.pcie_width} (card max Gen{gpu.pcie_max_gen} x{gpu.pcie_max_width})"
        if gpu.pcie_width < gpu.pcie_max_width:
            checks.append(
                Check(
                    name,
                    "warn",
                    f"{detail}: fewer lanes than the card supports, host<->GPU copies are slower",
                    "ask the provider (slot or riser problem); `rentwise bench` measures the real bandwidth",
                )
            )
        elif (gpu.pcie_gen or 0) < (gpu.pcie_max_gen or 0):
            # Idle GPUs lower the link generation to save power and raise it under load (NVIDIA PCIe ASPM).
            checks.append(
                Check(name, "info", f"{detail}: idle GPUs drop the link speed; `rentwise bench` measures it")
            )
        else:
            checks.append(Check(name, "ok", detail))
    return checks


def check_topology(inputs: DoctorInputs, use: Use) -> list[Check]:
    facts = inputs.facts
    if len(facts.gpus) < 2:
        reason = (
            "one GPU: no GPU-to-GPU links to check" if facts.gpus else (facts.unavailable or "no GPU found")
        )
        return [Check("NVLink / P2P", "skip", f"skipped: {reason}")]
    links = ", ".join(f"{a}-{b} {link}" for a, b, link in facts.topology)
    spec = catalog_entry(facts.gpus[0])
    sold_with_nvlink = spec is not None and bool(spec.nvlink_gbps) and "pcie" not in spec.name.lower()
    over_pcie = [pair for pair in facts.topology if pair[2] != "NVLink"]
    if sold_with_nvlink and over_pcie:
        return [
            Check(
                "NVLink / P2P",
                "warn",
                f"{links}: {spec.name if spec else ''} is an NVLink part but {len(over_pcie)} pair(s) "
                "talk over PCIe",
                "if you paid for NVLink, ask the provider; `rentwise bench` measures GPU-to-GPU bandwidth",
            )
        ]
    return [Check("NVLink / P2P", "ok", links or "no pairs reported")]


def check_nccl(inputs: DoctorInputs, use: Use) -> list[Check]:
    if len(inputs.facts.gpus) < 2:
        return [Check("NCCL", "skip", "skipped: fewer than two GPUs, NCCL is not needed")]
    torch = inputs.torch
    if not torch.imported:
        return [Check("NCCL", "skip", f"skipped: torch not imported ({use} does not need it)")]
    if torch.nccl_available:
        return [Check("NCCL", "ok", f"NCCL {torch.nccl_version} available to torch.distributed")]
    return [
        Check(
            "NCCL",
            "fail" if use == "train" else "warn",
            "torch.distributed has no NCCL backend: multi-GPU training cannot run",
            "install a CUDA build of torch from pytorch.org (it bundles NCCL)",
        )
    ]


def check_disk(inputs: DoctorInputs, use: Use, need_bytes: int | None) -> list[Check]:
    if inputs.disk_free_bytes is None:
        return [Check("disk", "skip", f"skipped: cannot read free space at {inputs.disk_path}")]
    gpu_bytes = sum(g.memory_total_bytes for g in inputs.facts.gpus)
    # Everything a training checkpoint holds (weights, optimizer, RNG) lives in GPU memory during training, so
    # one checkpoint is at most the GPUs' total memory; keeping two (the previous one until the new one is
    # verified) needs twice that.
    need = need_bytes if need_bytes is not None else 2 * gpu_bytes
    detail = f"{format_gib(inputs.disk_free_bytes)} free at {inputs.disk_path}"
    if use != "train" or need == 0:
        return [Check("disk", "ok" if use == "train" else "info", detail)]
    if inputs.disk_free_bytes >= need:
        return [Check("disk", "ok", f"{detail} (need {format_gib(need)})")]
    one_checkpoint = need // 2 if need_bytes is None else need
    status: Status = "fail" if inputs.disk_free_bytes < one_checkpoint else "warn"
    return [
        Check(
            "disk",
            status,
            f"{detail}, below {format_gib(need)} for two checkpoints (2 x total GPU memory, an upper bound)",
            "mount a bigger volume for the output folder, keep fewer checkpoints, or pass --need-disk",
        )
    ]


def check_ram(inputs: DoctorInputs, use: Use) -> list[Check]:
    if inputs.ram_total_bytes is None or inputs.ram_available_bytes is None:
        return [Check("host RAM", "skip", "skipped: psutil is not installed (pip install 'rentwise[gpu]')")]
    detail = f"{format_gib(inputs.ram_available_bytes)} available of {format_gib(inputs.ram_total_bytes)}"
    largest = max((g.memory_total_bytes for g in inputs.facts.gpus), default=0)
    # transformers materialises a checkpoint's state dict in host RAM before moving it to the GPU unless
    # device_map / low_cpu_mem_usage is used, so a model that fills a GPU needs that much free RAM to load.
    if _needs_gpu(use) and largest and inputs.ram_available_bytes < largest:
        return [
            Check(
                "host RAM",
                "warn",
                f"{detail}: less than one GPU's memory ({format_gib(largest)}); loading a model that fills "
                "the GPU passes through host RAM",
                "load with device_map='auto' (streams weights to the GPU) or rent more RAM",
            )
        ]
    return [Check("host RAM", "ok" if _needs_gpu(use) else "info", detail)]


def check_packages(inputs: DoctorInputs, use: Use) -> list[Check]:
    required = {
        "train": {"transformers", "peft", "accelerate"},
        "inference": {"transformers"},
        "plan": set(),
    }[use]
    checks = []
    for package in inputs.packages:
        name = f"package {package.name}"
        if package.imports is None:
            unused = f"{use} does not need it"
            detail = (
                f"{package.version} (not imported: {unused})"
                if package.version
                else f"not installed ({unused})"
            )
            checks.append(Check(name, "info", detail))
            continue
        if package.imports:
            checks.append(Check(name, "ok", f"{package.version}"))
            continue
        problem = (
            f"{package.version} does not import: {package.error}" if package.version else "not installed"
        )
        if package.name in required:
            checks.append(Check(name, "fail", problem, "pip install 'rentwise[train]'"))
        elif package.name == "bitsandbytes":
            checks.append(Check(name, "info", f"{problem} (needed only for QLoRA and 8-bit optimizers)"))
        elif package.name == "flash-attn":
            checks.append(
                Check(name, "info", f"{problem} (optional: PyTorch's SDPA attention is used without it)")
            )
        else:
            checks.append(Check(name, "info", problem))
    return checks


CHECKS: tuple[Callable[[DoctorInputs, Use], list[Check]], ...] = (
    check_driver,
    check_torch,
    check_visibility,
    check_identity,
    check_capability,
    check_memory,
    check_ecc,
    check_persistence,
    check_pcie,
    check_topology,
    check_nccl,
    check_ram,
    check_packages,
)


def diagnose(inputs: DoctorInputs, use: Use, need_disk_bytes: int | None = None) -> DoctorReport:
    """Run every check for `use`."""

    def disk(inputs: DoctorInputs, use: Use) -> list[Check]:
        return check_disk(inputs, use, need_disk_bytes)

    rules = (*CHECKS[:-1], disk, CHECKS[-1])  # disk before the package list
    checks = [Check("python", "info", f"Python {inputs.python_version}")]
    checks.extend(check for rule in rules for check in rule(inputs, use))
    return DoctorReport(use=use, checks=tuple(checks))
