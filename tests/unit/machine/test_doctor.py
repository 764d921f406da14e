"""doctor: every check's verdict for each use, from hand-built inputs; one real run on this machine."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rentwise.machine.doctor import Check, diagnose
from rentwise.machine.probe import DoctorInputs, PackageInfo, TorchInfo
from rentwise.machine.readings import GpuProcess, MachineFacts, Sample, read_trace

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "machine"
GIB = 2**30
PACKAGES = (
    *(
        PackageInfo(name, "1.0", imports=True)
        for name in ("transformers", "peft", "accelerate", "bitsandbytes")
    ),
    PackageInfo("flash-attn", None, imports=False),
)
CUDA_TORCH = TorchInfo(
    installed=True, version="2.13.0+cu124", cuda_build="12.4", cuda_available=True, device_count=1
)


def healthy(gpus: int = 1) -> DoctorInputs:
    """One (or two) H100 from the synthetic traces, a matching CUDA torch, room on disk and in RAM."""
    name = "healthy-training" if gpus == 1 else "gpu-lost"
    facts, samples = read_trace(FIXTURES / f"synthetic-{name}.jsonl")
    idle = tuple(dataclasses.replace(r, processes=(), memory_used_bytes=GIB // 2) for r in samples[0].gpus)
    first = dataclasses.replace(samples[0], gpus=idle)  # an idle card: what doctor sees before a job starts
    return DoctorInputs(
        facts=facts,
        sample=first,
        torch=dataclasses.replace(
            CUDA_TORCH, device_count=gpus, nccl_available=gpus > 1, nccl_version="2.21.5"
        ),
        packages=PACKAGES,
        disk_path="/data",
        disk_free_bytes=2000 * GIB,
        ram_total_bytes=240 * GIB,
        ram_available_bytes=200 * GIB,
        python_version="3.11.7",
        own_pids=(1,),
    )


def no_gpu() -> DoctorInputs:
    return dataclasses.replace(
        healthy(),
        facts=MachineFacts(
            source="none", unavailable="no NVIDIA driver/NVML (libnvidia-ml.so not found): why"
        ),
        sample=None,
        torch=TorchInfo(installed=True, version="2.13.0+cpu", cuda_build=None),
    )


def with_gpu(inputs: DoctorInputs, **changes: Any) -> DoctorInputs:
    gpu = dataclasses.replace(inputs.facts.gpus[0], **changes)
    return dataclasses.replace(
        inputs, facts=dataclasses.replace(inputs.facts, gpus=(gpu, *inputs.facts.gpus[1:]))
    )


def check(inputs: DoctorInputs, name: str, use: str = "train") -> Check:
    report = diagnose(inputs, use)  # type: ignore[arg-type]
    return next(c for c in report.checks if c.name == name)


def test_healthy_gpu_machine_is_ready_for_everything() -> None:
    for use in ("train", "inference", "plan"):
        report = diagnose(healthy(), use)  # type: ignore[arg-type]
        assert not report.failed and not report.warned, [
            c for c in report.checks if c.status in ("fail", "warn")
        ]
    names = [c.name for c in diagnose(healthy(), "train").checks]
    assert names[:4] == ["python", "NVIDIA driver", "torch", "torch vs driver"]
    assert "GPU 0 identity" in names and "disk" in names and names[-1] == "package flash-attn"
    assert check(healthy(), "GPU 0 identity").detail.startswith("NVIDIA H100 80GB HBM3 = catalog 'H100 SXM5'")


def test_no_gpu_is_fine_for_planning_and_says_why_it_skipped() -> None:
    report = diagnose(no_gpu(), "plan")
    assert not report.failed
    driver = check(no_gpu(), "NVIDIA driver", "plan")
    assert driver.status == "skip"
    assert (
        driver.detail
        == "skipped: no NVIDIA driver/NVML (libnvidia-ml.so not found): why (planning needs no GPU)"
    )
    assert check(no_gpu(), "free GPU memory", "plan").detail == "skipped: no NVIDIA driver/NVML"
    assert check(no_gpu(), "NCCL", "plan").status == "skip"


def test_no_gpu_fails_training() -> None:
    report = diagnose(no_gpu(), "train")
    assert report.failed
    assert check(no_gpu(), "NVIDIA driver").status == "fail"
    assert check(no_gpu(), "NVIDIA driver").fix is not None


def test_cpu_torch_on_a_gpu_machine() -> None:
    inputs = dataclasses.replace(
        healthy(), torch=TorchInfo(installed=True, version="2.13.0+cpu", cuda_build=None)
    )
    torch = check(inputs, "torch")
    assert torch.status == "fail"
    assert torch.fix == (
        "install a CUDA build no newer than the driver, e.g. "
        "pip install torch --index-url https://download.pytorch.org/whl/cu124"
    )
    assert check(inputs, "GPU visible to torch").status == "skip"


@pytest.mark.parametrize(
    ("torch_cuda", "driver_cuda", "status"),
    [("12.4", "12.4", "ok"), ("11.8", "12.4", "ok"), ("12.8", "12.4", "warn"), ("13.0", "12.4", "fail")],
)
def test_torch_cuda_build_against_the_driver(torch_cuda: str, driver_cuda: str, status: str) -> None:
    inputs = healthy()
    inputs = dataclasses.replace(
        inputs,
        torch=dataclasses.replace(inputs.torch, cuda_build=torch_cuda),
        facts=dataclasses.replace(inputs.facts, cuda_driver_version=driver_cuda),
    )
    assert check(inputs, "torch vs driver").status == status


def test_gpu_invisible_to_torch() -> None:
    inputs = dataclasses.replace(healthy(), torch=dataclasses.replace(CUDA_TORCH, cuda_available=False))
    assert check(inputs, "GPU visible to torch").status == "fail"
    assert check(inputs, "GPU visible to torch", "plan").status == "warn"


def test_bf16_missing_on_an_old_card_warns_for_training() -> None:
    inputs = with_gpu(healthy(), compute_capability="7.5", name="Tesla T4")
    capability = check(inputs, "GPU 0 bf16 / fp8")
    assert capability.status == "warn"
    assert capability.detail == "Tesla T4, compute capability 7.5: bf16 no, fp8 no"
    assert check(inputs, "GPU 0 bf16 / fp8", "inference").status == "ok"


def test_other_processes_holding_memory_are_named() -> None:
    inputs = healthy()
    reading = dataclasses.replace(
        inputs.sample.gpus[0],  # type: ignore[union-attr]
        processes=(GpuProcess(4321, 12 * GIB), GpuProcess(1, GIB)),
    )
    inputs = dataclasses.replace(inputs, sample=Sample(0.0, (reading,)))
    memory = check(inputs, "GPU 0 memory")
    assert memory.status == "warn"
    assert memory.detail.endswith("; held by PID 4321 (12.00 GiB)")  # our own PID 1 is not listed


def test_memory_used_by_invisible_processes() -> None:
    inputs = healthy()
    reading = dataclasses.replace(inputs.sample.gpus[0], memory_used_bytes=20 * GIB)  # type: ignore[union-attr]
    inputs = dataclasses.replace(inputs, sample=Sample(0.0, (reading,)))
    assert check(inputs, "GPU 0 memory").detail.endswith("; 20.00 GiB used by processes not visible here")


def test_ecc_errors_fail_and_missing_ecc_skips() -> None:
    assert check(with_gpu(healthy(), ecc_uncorrected_volatile=3), "GPU 0 ECC").status == "fail"
    assert check(with_gpu(healthy(), retired_pages_pending=True), "GPU 0 ECC").status == "fail"
    assert check(with_gpu(healthy(), remapped_rows_failed=True), "GPU 0 ECC").status == "fail"
    assert check(with_gpu(healthy(), ecc_enabled=None), "GPU 0 ECC").status == "skip"


def test_persistence_and_pcie() -> None:
    assert check(with_gpu(healthy(), persistence_mode=False), "persistence mode").status == "warn"
    narrow = check(with_gpu(healthy(), pcie_width=8), "GPU 0 PCIe")
    assert narrow.status == "warn" and narrow.detail.startswith("Gen5 x8 (card max Gen5 x16)")
    assert check(with_gpu(healthy(), pcie_gen=1), "GPU 0 PCIe").status == "info"  # idle link power saving


def test_identity_mismatch_warns() -> None:
    inputs = with_gpu(healthy(), memory_total_bytes=40 * GIB)
    assert check(inputs, "GPU 0 identity").status == "warn"
    unknown = with_gpu(healthy(), name="NVIDIA Mystery 9000")
    assert check(unknown, "GPU 0 identity").status == "info"


def test_two_gpus_topology_and_nccl() -> None:
    two = healthy(gpus=2)
    assert check(two, "NVLink / P2P").status == "ok"
    over_pcie = dataclasses.replace(
        two, facts=dataclasses.replace(two.facts, topology=((0, 1, "same PCIe switch"),))
    )
    link = check(over_pcie, "NVLink / P2P")
    assert link.status == "warn" and "H100 SXM5 is an NVLink part but 1 pair(s) talk over PCIe" in link.detail
    no_nccl = dataclasses.replace(two, torch=dataclasses.replace(two.torch, nccl_available=False))
    assert check(no_nccl, "NCCL").status == "fail"
    assert check(no_nccl, "NCCL", "inference").status == "warn"
    assert check(healthy(), "NCCL").status == "skip"


def test_disk_and_ram() -> None:
    gpu_bytes = healthy().facts.gpus[0].memory_total_bytes
    tight = dataclasses.replace(healthy(), disk_free_bytes=gpu_bytes + GIB)  # one checkpoint fits, two do not
    assert check(tight, "disk").status == "warn"
    full = dataclasses.replace(healthy(), disk_free_bytes=10 * GIB)
    assert check(full, "disk").status == "fail"
    assert check(full, "disk", "plan").status == "info"
    assert diagnose(full, "train", need_disk_bytes=5 * GIB).failed is False
    small_ram = dataclasses.replace(healthy(), ram_available_bytes=16 * GIB)
    assert check(small_ram, "host RAM").status == "warn"


def test_missing_training_packages_fail_only_training() -> None:
    packages = (PackageInfo("transformers", None, imports=False), *PACKAGES[1:])
    inputs = dataclasses.replace(healthy(), packages=packages)
    assert check(inputs, "package transformers").status == "fail"
    assert check(inputs, "package transformers", "plan").status == "info"
    broken = (PackageInfo("bitsandbytes", "0.45.0", imports=False, error="RuntimeError: no libcudart"),)
    detail = check(dataclasses.replace(healthy(), packages=broken), "package bitsandbytes").detail
    assert (
        detail
        == "0.45.0 does not import: RuntimeError: no libcudart (needed only for QLoRA and 8-bit optimizers)"
    )


def test_doctor_on_this_machine(run_cli: Callable[..., Any]) -> None:
    """The real probe, whatever this machine is: plan never fails; without a GPU, training does."""
    plan = run_cli("doctor", "--for", "plan")
    assert plan.exit_code == 0
    assert plan.stdout.splitlines()[0] == "rentwise doctor --for plan"
    assert plan.stdout.rstrip().endswith("ready for plan")
    from rentwise.machine.nvml import nvml_unavailable_reason

    if nvml_unavailable_reason() is not None:
        assert "– NVIDIA driver: skipped: " in plan.stdout
        train = run_cli("doctor", "--json")
        assert train.exit_code == 1
        import json

        document = json.loads(train.stdout)
        assert document["use"] == "train" and document["failed"] is True
        assert {"name": "NVIDIA driver", "status": "fail"}.items() <= document["checks"][1].items()


def test_plan_reads_versions_without_importing() -> None:
    """--for plan must not import torch or the training packages (that took ~5 s): a fresh interpreter."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from rentwise.cli.main import main\n"
        "code = main(['doctor', '--for', 'plan'])\n"
        "heavy = sorted({'torch', 'transformers', 'peft', 'accelerate', 'bitsandbytes'} & set(sys.modules))\n"
        "print('exit', code, 'imported', heavy, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stderr.splitlines()[-1] == "exit 0 imported []"


def test_plan_without_imports_says_what_it_did_not_check() -> None:
    from rentwise.machine.probe import package_version_only, torch_version_only

    inputs = dataclasses.replace(
        healthy(gpus=2),
        torch=TorchInfo(installed=True, version="2.13.0+cu124", imported=False),
        packages=(PackageInfo("peft", "0.13.0", imports=None), PackageInfo("flash-attn", None, imports=None)),
    )
    report = diagnose(inputs, "plan")
    assert not report.failed and not report.warned
    details = {c.name: (c.status, c.detail) for c in report.checks}
    assert details["torch"] == ("info", "torch 2.13.0+cu124 installed (not imported: plan does not need it)")
    assert details["GPU visible to torch"] == ("skip", "skipped: torch not imported (plan does not need it)")
    assert details["NCCL"] == ("skip", "skipped: torch not imported (plan does not need it)")
    assert details["package peft"] == ("info", "0.13.0 (not imported: plan does not need it)")
    assert details["package flash-attn"] == ("info", "not installed (plan does not need it)")
    assert package_version_only("no-such-dist-rentwise").version is None
    assert torch_version_only().imported is False
