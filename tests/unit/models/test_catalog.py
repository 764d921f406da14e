"""The bundled catalog and `load_shape`: names, ids, aliases, paths, the hub, and every error path."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from rentwise.errors import ConfigError, NotFoundError
from rentwise.models.catalog import list_models, load_shape

REQUIRED = [
    "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.2-1b",
    "llama-3.2-3b", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b",
    "qwen2.5-32b", "qwen2.5-72b", "qwen3-0.6b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b",
    "qwen3-30b-a3b", "mistral-7b-v0.3", "mixtral-8x7b", "gemma-2-2b", "gemma-2-9b", "gemma-2-27b",
    "phi-3-mini", "phi-3.5-mini", "phi-3-medium", "glm-4-9b", "yi-1.5-6b", "yi-1.5-9b", "yi-1.5-34b",
    "internlm2.5-7b", "baichuan2-7b", "baichuan2-13b", "deepseek-llm-7b", "deepseek-r1-distill-qwen-7b",
    "deepseek-r1-distill-llama-8b",
]  # fmt: skip
CONFIGS = Path(__file__).parents[3] / "src" / "rentwise" / "models" / "configs"
UNKNOWN_HINT = "run `rentwise models` to list bundled models, or pass a path to a config.json"


def test_catalog_bundles_every_required_model() -> None:
    names = {entry.name for entry in list_models()}
    assert not set(REQUIRED) - names
    assert len(names) >= 30


def test_every_bundled_config_states_where_it_came_from() -> None:
    for entry in list_models():
        assert entry.hf_id.count("/") == 1, entry.name
        assert "https://huggingface.co/" in entry.source, entry.name
        if entry.notes.startswith("Written from memory"):
            assert entry.source.startswith("from memory of "), entry.name  # provenance stated, not implied
        assert entry.as_of, entry.name
        assert entry.notes, entry.name


# The counts the brief and the model cards quote; each bundled config must reproduce them exactly.
@pytest.mark.parametrize(
    ("name", "published"),
    [("llama-2-7b", 6_738_415_616), ("llama-3.1-8b", 8_030_261_248), ("mistral-7b-v0.1", 7_241_732_096),
     ("qwen2.5-7b", 7_615_616_512), ("llama-3.2-1b", 1_235_814_400)],
)  # fmt: skip
def test_published_counts_from_the_brief(name: str, published: int) -> None:
    assert load_shape(name).num_params == published


def test_every_published_params_field_is_reproduced() -> None:
    pinned = [entry for entry in list_models() if entry.published_params is not None]
    assert len(pinned) >= 15
    for entry in pinned:
        assert entry.shape.num_params == entry.published_params, entry.name


def test_list_is_sorted_by_family_then_size_and_filters() -> None:
    entries = list_models()
    keys = [(entry.family, entry.shape.num_params) for entry in entries]
    assert keys == sorted(keys)
    assert [entry.name for entry in list_models("gemma")] == ["gemma-2-2b", "gemma-2-9b", "gemma-2-27b"]
    assert [entry.name for entry in list_models("Qwen/Qwen3-8")] == ["qwen3-8b"]


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ("llama-3.1-8b", "llama-3.1-8b"),
        ("LLAMA-3.1-8B", "llama-3.1-8b"),
        ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
        ("meta-llama/llama-3.1-8b-instruct", "llama-3.1-8b"),
        ("mistral-7b", "mistral-7b-v0.3"),
        (" qwen3-30b-a3b ", "qwen3-30b-a3b"),
    ],
)
def test_lookup_by_name_hf_id_or_alias(spec: str, name: str) -> None:
    assert load_shape(spec).name == name


def test_lookup_by_path_and_by_folder(tmp_path: Path) -> None:
    config = json.loads((CONFIGS / "qwen2.5-7b.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    by_file = load_shape(str(tmp_path / "config.json"))
    by_folder = load_shape(str(tmp_path))
    assert by_file.num_params == by_folder.num_params == 7_615_616_512
    assert by_file.source == str(tmp_path / "config.json")


def test_bundled_lookups_are_cached() -> None:
    assert load_shape("llama-3.1-8b") is load_shape("Meta-Llama/Llama-3.1-8B")


def test_unknown_name_suggests_close_ones() -> None:
    with pytest.raises(NotFoundError) as caught:
        load_shape("llama-3.1-8")
    assert caught.value.message == (
        "no model named 'llama-3.1-8' in the catalog "
        "(did you mean 'llama-3.1-8b' or 'llama-3.1-70b' or 'llama-3.2-3b'?)"
    )
    assert caught.value.hint == UNKNOWN_HINT
    assert caught.value.exit_code == 2


def test_unknown_name_without_a_close_one() -> None:
    with pytest.raises(NotFoundError, match=r"^no model named 'zzz' in the catalog$"):
        load_shape("zzz")


def test_folder_without_config_json(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match=rf"^folder '{tmp_path}' has no config.json$"):
        load_shape(str(tmp_path))


def test_missing_path_is_not_mistaken_for_a_model_name(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match=rf"^no file at '{tmp_path}/nope.json'$"):
        load_shape(str(tmp_path / "nope.json"))


def test_malformed_json_names_the_file_and_position(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama",\n "hidden_size": }')
    with pytest.raises(ConfigError) as caught:
        load_shape(str(path))
    assert caught.value.message == f"'{path}' is not valid JSON: Expecting value at line 2 column 17"
    assert caught.value.exit_code == 2


def test_json_that_is_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"must hold a JSON object, got list$"):
        load_shape(str(path))


def test_incomplete_config_file_lists_every_missing_field(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "qwen2", "hidden_size": 896}))
    with pytest.raises(ConfigError) as caught:
        load_shape(str(path))
    assert caught.value.message == (
        f"cannot read model config '{path}': 'num_hidden_layers' must be a positive integer, got nothing; "
        "'num_attention_heads' must be a positive integer, got nothing; "
        "'vocab_size' must be a positive integer, got nothing"
    )


def fake_hub(monkeypatch: pytest.MonkeyPatch, download: object) -> None:
    module = types.ModuleType("huggingface_hub")
    module.hf_hub_download = download  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "huggingface_hub", module)


def test_hub_id_is_fetched_with_huggingface_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text((CONFIGS / "qwen3-8b.json").read_text())
    calls: list[tuple[str, str]] = []

    def download(repo_id: str, filename: str) -> str:
        calls.append((repo_id, filename))
        return str(path)

    fake_hub(monkeypatch, download)
    shape = load_shape("someone/qwen3-8b-finetune")
    assert calls == [("someone/qwen3-8b-finetune", "config.json")]
    assert (shape.name, shape.hf_id, shape.num_params) == (
        "someone/qwen3-8b-finetune",
        "someone/qwen3-8b-finetune",
        load_shape("qwen3-8b").num_params,
    )


def test_hub_failure_is_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    def download(repo_id: str, filename: str) -> str:
        raise OSError("We couldn't connect to 'https://huggingface.co'\nmore detail")

    fake_hub(monkeypatch, download)
    with pytest.raises(NotFoundError) as caught:
        load_shape("someone/private-model")
    assert caught.value.message == (
        "cannot fetch config.json of 'someone/private-model' from the Hugging Face Hub: "
        "We couldn't connect to 'https://huggingface.co'"
    )
    assert caught.value.hint is not None and "pip install 'rentwise[hub]'" in caught.value.hint


def test_hub_id_without_huggingface_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # makes the import fail
    with pytest.raises(NotFoundError) as caught:
        load_shape("someone/model")
    assert caught.value.message == (
        "'someone/model' is not a bundled model and huggingface_hub is not installed to fetch it"
    )
    assert caught.value.hint == (
        "download the model's config.json and pass its path, or pip install 'rentwise[hub]' "
        "(and check the id and your network or HF_TOKEN)"
    )


def test_catalog_import_and_lookup_do_not_import_torch() -> None:
    code = (
        "import sys; from rentwise.models.catalog import load_shape, list_models; "
        "load_shape('qwen3-30b-a3b'); list_models(); "
        "print(sorted(m for m in ('torch', 'transformers', 'peft', 'huggingface_hub') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# Qwen model cards state "Number of Parameters" and "Number of Parameters (Non-Embedding)" rounded to 0.1B
# or 0.01B (Qwen truncates rather than rounds: 3.353B active is printed 3.3B), so 0.05B is the tolerance.
@pytest.mark.parametrize(
    ("name", "total_billions", "non_embedding_billions"),
    [("qwen3-0.6b", 0.6, 0.44), ("qwen3-1.7b", 1.7, 1.4), ("qwen3-4b", 4.0, 3.6), ("qwen3-8b", 8.2, 6.95),
     ("qwen3-14b", 14.8, 13.2), ("qwen3-32b", 32.8, 31.2), ("qwen3-30b-a3b", 30.5, 29.9),
     ("qwen2.5-0.5b", 0.49, 0.36), ("qwen2.5-1.5b", 1.54, 1.31), ("qwen2.5-3b", 3.09, 2.77),
     ("qwen2.5-7b", 7.61, 6.53)],
)  # fmt: skip
def test_qwen_model_card_counts(name: str, total_billions: float, non_embedding_billions: float) -> None:
    shape = load_shape(name)
    non_embedding = shape.num_params - shape.embedding_params - shape.lm_head_params
    assert shape.num_params / 1e9 == pytest.approx(total_billions, abs=0.05)
    assert non_embedding / 1e9 == pytest.approx(non_embedding_billions, abs=0.05)
