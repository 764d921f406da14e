"""The GPU spec catalog: every reference row present, lookups, usable memory, overrides, no torch."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from rentwise.errors import ConfigError, NotFoundError, RentwiseError
from rentwise.hardware.catalog import (
    GpuSpec,
    dense_tflops,
    find_gpu,
    load_gpus,
    normalize_name,
)
from rentwise.units import MIB

REFERENCE_CSV = Path("/work/shared/data/gpu_specs.csv")


@pytest.fixture(autouse=True)
def _no_user_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the user config folder at an empty temp dir so a developer's own gpus.toml cannot leak in."""
    monkeypatch.setenv("RENTWISE_CONFIG_DIR", str(tmp_path / "config"))


def _reference_rows() -> list[dict[str, str]]:
    if not REFERENCE_CSV.exists():
        pytest.skip("reference data not present on this machine")
    with REFERENCE_CSV.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_every_reference_row_is_in_the_catalog_with_its_numbers() -> None:
    rows = _reference_rows()
    gpus = {gpu.name: gpu for gpu in load_gpus()}
    assert len(gpus) == len(rows) == 33
    for row in rows:
        gpu = gpus[row["name"]]
        assert gpu.memory_gib == float(row["memory_gb"])
        assert gpu.source == row["source"]
        assert gpu.as_of
        for column, attribute in (
            ("memory_bandwidth_gbps", "memory_bandwidth_gbps"),
            ("fp32_tflops", "fp32_tflops"),
            ("tf32_tflops_dense", "tf32_tflops"),
            ("fp16_bf16_tflops_dense", "fp16_tflops"),
            ("fp8_tflops_dense", "fp8_tflops"),
            ("tdp_w", "tdp_w"),
        ):
            expected = float(row[column]) if row[column] else None
            assert getattr(gpu, attribute) == expected, (row["name"], attribute)
        assert gpu.supports_bf16 == (row["supports_bf16"] == "yes")
        assert gpu.bf16_tflops == (gpu.fp16_tflops if gpu.supports_bf16 else None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4090", "RTX 4090"),
        ("rtx4090", "RTX 4090"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("A100-80G", "A100 80GB SXM4"),
        ("A100 80GB", "A100 80GB SXM4"),
        ("a100_sxm4_80gb", "A100 80GB SXM4"),
        ("A100", "A100 40GB SXM4"),
        ("H100", "H100 SXM5"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM5"),
        ("h100 pcie", "H100 PCIe"),
        ("Tesla T4", "T4"),
        ("l40s", "L40S"),
        ("H200", "H200 SXM"),
    ],
)
def test_find_gpu_is_case_space_dash_insensitive_and_knows_aliases(text: str, expected: str) -> None:
    assert find_gpu(text).name == expected


def test_aliases_are_unambiguous() -> None:
    seen: dict[str, str] = {}
    for gpu in load_gpus():
        for key in {normalize_name(n) for n in (gpu.name, *gpu.aliases)}:
            assert key not in seen, f"{key!r} names both {seen[key]} and {gpu.name}"
            seen[key] = gpu.name


def test_unknown_gpu_suggests_close_names() -> None:
    with pytest.raises(NotFoundError) as caught:
        find_gpu("H100-80")
    assert caught.value.message.startswith("no GPU named 'H100-80' in the catalog (did you mean ")
    assert "'H100'" in caught.value.message
    assert caught.value.hint == "run `rentwise gpus` to list known GPUs"


def test_unknown_gpu_without_close_names() -> None:
    with pytest.raises(NotFoundError, match=r"^no GPU named 'zzzz' in the catalog$"):
        find_gpu("zzzz")


@pytest.mark.parametrize(
    ("name", "mib"),
    [("A100 80GB SXM4", 81920), ("H100", 81559), ("RTX 4090", 24564), ("T4", 15360), ("L4", 23034)],
)
def test_usable_bytes_uses_the_nvidia_smi_total_when_known(name: str, mib: int) -> None:
    assert find_gpu(name).usable_bytes == mib * MIB


def test_usable_bytes_rule_for_ecc_gddr_cards_without_a_known_total() -> None:
    l40 = find_gpu("L40")
    assert l40.smi_total_mib is None and l40.ecc_reserves_memory
    assert l40.usable_bytes == 48 * 1024 * MIB * 15 // 16


def test_usable_bytes_rule_for_other_cards_bounds_every_known_total() -> None:
    # The 1/64 rule must not promise more than any card with a measured total actually has.
    for gpu in load_gpus():
        if gpu.smi_total_mib is not None and not gpu.ecc_reserves_memory:
            rule = GpuSpec(**{**gpu.__dict__, "smi_total_mib": None})
            assert rule.usable_bytes <= gpu.usable_bytes, gpu.name


def test_usable_never_exceeds_nameplate() -> None:
    for gpu in load_gpus():
        assert 0 < gpu.usable_bytes <= gpu.memory_bytes, gpu.name


def test_interconnect_fields_agree_with_the_text() -> None:
    for gpu in load_gpus():
        text = gpu.interconnect.lower()
        if "nvlink" not in text or "no nvlink" in text:
            assert gpu.nvlink_gbps == 0, gpu.name
        elif gpu.nvlink_gbps is not None:
            assert f"{gpu.nvlink_gbps:g}" in gpu.interconnect or gpu.nvlink_gbps == 1800, gpu.name
    assert find_gpu("H100 SXM5").nvlink_gbps == 900
    assert find_gpu("B200").nvlink_gbps == 1800  # "1.8 TB/s"
    assert find_gpu("RTX 3090").nvlink_gbps is None  # bridge supported, speed not in the source
    assert find_gpu("A10G").pcie_gbps == 64  # "PCIe Gen4 x16" with no figure: Gen4 x16 = 64


def test_dense_tflops() -> None:
    assert dense_tflops(find_gpu("A100 80GB"), "bf16") == 312
    assert dense_tflops(find_gpu("H100"), "fp8") == 1979
    with pytest.raises(RentwiseError, match=r"^T4 has no bf16 support$"):
        dense_tflops(find_gpu("T4"), "bf16")
    with pytest.raises(RentwiseError, match=r"^the catalog has no dense bf16 peak for A10G$"):
        dense_tflops(find_gpu("A10G"), "bf16")


def test_override_file_changes_fields_and_adds_gpus(tmp_path: Path) -> None:
    override = tmp_path / "mine.toml"
    override.write_text(
        '[[gpu]]\nname = "a10g"\nbf16_tflops = 70.0\n\n'
        '[[gpu]]\nname = "RTX 2080 Ti 22GB"\naliases = ["2080ti-22g"]\nvendor = "NVIDIA"\nmemory_gib = 22\n'
        'architecture = "Turing"\ncompute_capability = "7.5"\nsupports_bf16 = false\n'
        'source = "my own card"\nas_of = "2026-12-01"\n'
    )
    gpus = load_gpus([override])
    a10g = find_gpu("A10G", gpus)
    assert a10g.bf16_tflops == 70.0 and a10g.name == "A10G" and a10g.origin == str(override)
    assert a10g.memory_bandwidth_gbps == 600  # untouched fields keep the bundled value
    assert find_gpu("2080TI-22G", gpus).memory_gib == 22
    assert find_gpu("A10G").bf16_tflops is None  # the bundled catalog is not mutated


def test_user_config_dir_file_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "cfg"
    config.mkdir()
    (config / "gpus.toml").write_text('[[gpu]]\nname = "T4"\nnotes = "ours runs hot"\n')
    monkeypatch.setenv("RENTWISE_CONFIG_DIR", str(config))
    assert find_gpu("T4").notes == "ours runs hot"


def test_bad_override_file_names_file_entry_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[gpu]]\nname = "T4"\nmemory_gib = "lots"\nbandwith_gbps = 1\n\n[[gpu]]\nname = "New"\n')
    with pytest.raises(ConfigError) as caught:
        load_gpus([bad])
    assert caught.value.message == (
        f"{bad}: gpu #1 'T4': field 'memory_gib' must be a number, got 'lots'; "
        f"{bad}: gpu #1 'T4': unknown field 'bandwith_gbps' (did you mean 'memory_bandwidth_gbps'?); "
        f"{bad}: gpu #2 'New': a new GPU needs field(s) 'vendor', 'memory_gib', 'architecture', "
        "'compute_capability', 'supports_bf16', 'source', 'as_of'"
    )


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[[gpu]\nname=")
    with pytest.raises(ConfigError, match=rf"^{broken}: not valid TOML"):
        load_gpus([broken])
    with pytest.raises(NotFoundError, match=r"does not exist"):
        load_gpus([tmp_path / "nope.toml"])


def test_loading_is_cached_and_fast() -> None:
    import time

    load_gpus()
    start = time.perf_counter()
    for _ in range(100):
        load_gpus()
    assert (time.perf_counter() - start) / 100 < 0.005


def test_catalog_does_not_import_torch() -> None:
    code = (
        "import sys; from rentwise.hardware.catalog import find_gpu; find_gpu('4090'); "
        "import rentwise.cli.gpus; print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_matches_memory_total() -> None:
    h100 = find_gpu("H100")
    assert h100.matches_memory_total(81559 * MIB)
    assert not h100.matches_memory_total(40 * 1024 * MIB)
    pcie = find_gpu("H100 PCIe")  # no known nvidia-smi total: anything from the rule's bound to the nameplate
    assert pcie.matches_memory_total(81559 * MIB) and pcie.matches_memory_total(pcie.usable_bytes)
    assert not pcie.matches_memory_total(94 * 1024 * MIB)  # an H100 NVL is another card
