"""Gather what `doctor` judges: GPU facts (through a `GpuSource`), torch, key packages, disk and host RAM.

This is the edge: for `train` and `inference` it imports torch and the packages it checks (seconds); for
`plan`, which needs none of them, it only reads their installed versions from package metadata. The judging
in `doctor.py` is pure.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rentwise.machine.readings import GpuSource, MachineFacts, Sample

Use = Literal["train", "inference", "plan"]
"""What the machine is for; decides what doctor imports here and what counts as wrong in `doctor.py`."""

# The packages `rentwise train` and QLoRA use, by import name -> distribution name.
KEY_PACKAGES: dict[str, str] = {
    "transformers": "transformers",
    "peft": "peft",
    "accelerate": "accelerate",
    "bitsandbytes": "bitsandbytes",
    "flash_attn": "flash-attn",
}


@dataclass(frozen=True)
class TorchInfo:
    """torch as this Python sees it."""

    installed: bool
    version: str | None = None
    cuda_build: str | None = None
    """torch.version.cuda: the CUDA toolkit torch was built with (None for a CPU build)."""
    cuda_available: bool = False
    device_count: int = 0
    nccl_available: bool | None = None
    nccl_version: str | None = None
    error: str | None = None
    imported: bool = True
    """False when only the installed version was read (`--for plan`): the CUDA and NCCL fields are unknown."""


@dataclass(frozen=True)
class PackageInfo:
    name: str
    version: str | None
    imports: bool | None
    """Whether `import` succeeds; None when it was not tried (`--for plan`)."""
    error: str | None = None


@dataclass(frozen=True)
class DoctorInputs:
    """Everything doctor looks at, gathered once."""

    facts: MachineFacts
    sample: Sample | None
    torch: TorchInfo
    packages: tuple[PackageInfo, ...]
    disk_path: str
    disk_free_bytes: int | None
    ram_total_bytes: int | None
    ram_available_bytes: int | None
    python_version: str
    own_pids: tuple[int, ...] = ()
    cuda_visible_devices: str | None = None


def gather_inputs(source: GpuSource, output_dir: Path, use: Use = "train") -> DoctorInputs:
    """Read the machine once. For train and inference this imports torch and the key packages (seconds);
    for plan it reads only their versions, since planning uses none of them."""
    facts = source.facts()
    disk_path, disk_free = disk_free_bytes(output_dir)
    ram_total, ram_available = host_ram_bytes()
    imports = use != "plan"
    return DoctorInputs(
        facts=facts,
        sample=source.sample(0.0) if facts.gpus else None,
        torch=probe_torch() if imports else torch_version_only(),
        packages=tuple(
            probe_package(name, dist) if imports else package_version_only(dist)
            for name, dist in KEY_PACKAGES.items()
        ),
        disk_path=str(disk_path),
        disk_free_bytes=disk_free,
        ram_total_bytes=ram_total,
        ram_available_bytes=ram_available,
        python_version=platform.python_version(),
        own_pids=(os.getpid(),),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )


def probe_torch() -> TorchInfo:
    """Import torch and ask it about CUDA and NCCL."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch
    except Exception as error:  # an ImportError, or a broken install raising anything at import
        installed = importlib.util.find_spec("torch") is not None
        return TorchInfo(installed=installed, error=f"{type(error).__name__}: {error}" if installed else None)
    cuda_available = bool(torch.cuda.is_available())
    nccl_available = nccl_version = None
    if cuda_available:
        import torch.distributed as dist

        nccl_available = bool(dist.is_available() and dist.is_nccl_available())
        if nccl_available:
            version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
            nccl_version = (
                ".".join(str(part) for part in version) if isinstance(version, tuple) else str(version)
            )
    return TorchInfo(
        installed=True,
        version=str(torch.__version__),
        cuda_build=torch.version.cuda,
        cuda_available=cuda_available,
        device_count=torch.cuda.device_count() if cuda_available else 0,
        nccl_available=nccl_available,
        nccl_version=nccl_version,
    )


def torch_version_only() -> TorchInfo:
    """torch's installed version from its metadata, without importing it (~2 s saved)."""
    version = _installed_version("torch")
    return TorchInfo(installed=version is not None, version=version, imported=False)


def package_version_only(distribution: str) -> PackageInfo:
    """A package's installed version from its metadata, without importing it."""
    return PackageInfo(distribution, _installed_version(distribution), imports=None)


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def probe_package(import_name: str, distribution: str) -> PackageInfo:
    """Version from the package metadata, and whether `import` succeeds."""
    try:
        version: str | None = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return PackageInfo(distribution, None, imports=False)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module(import_name)
    except Exception as error:  # flash-attn without CUDA, bitsandbytes without its library, ...
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return PackageInfo(
            distribution, version, imports=False, error=f"{type(error).__name__}: {first_line}"
        )
    return PackageInfo(distribution, version, imports=True)


def disk_free_bytes(path: Path) -> tuple[Path, int | None]:
    """Free bytes on the filesystem that holds `path` (or its nearest existing parent)."""
    probe = path.expanduser().absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return probe, shutil.disk_usage(probe).free
    except OSError:
        return probe, None


def host_ram_bytes() -> tuple[int | None, int | None]:
    """(total, available) host RAM through psutil, or (None, None) without it."""
    try:
        import psutil
    except ImportError:
        return None, None
    memory = psutil.virtual_memory()
    return int(memory.total), int(memory.available)
