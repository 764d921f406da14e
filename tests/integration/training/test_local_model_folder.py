"""A local Hugging Face model folder with its own tokenizer (built here with `tokenizers`, no downloads):
chat rows use the tokenizer's chat template with loss on assistant turns, and LoRA training from the folder
ends in an adapter that plain peft loads on top of that folder."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from rentwise.training.data import IGNORE_INDEX, HfTokenizer

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("local-model")
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<unk>", "<pad>", "</s>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator([f"what is {i} plus {i}? it is {2 * i}." for i in range(200)], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=len(fast), max_position_embeddings=256, bos_token_id=None,
        eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
    )  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def test_chat_template_masks_everything_but_assistant_turns(model_folder: Path) -> None:
    tokenizer = HfTokenizer(model_folder)
    messages = [
        {"role": "user", "content": "what is 2 plus 2?"},
        {"role": "assistant", "content": "it is 4."},
        {"role": "user", "content": "and 3 plus 3?"},
        {"role": "assistant", "content": "it is 6."},
    ]
    result = tokenizer.encode_chat(messages)
    assert result is not None
    ids, labels = result
    trained = [i for i, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX]
    decoded = tokenizer._tok.decode(trained)
    assert decoded == "it is 4.<|im_end|>\nit is 6.<|im_end|>\n"


def test_lora_from_a_local_folder_loads_back_with_peft(
    run_cli: Callable[..., Any], tmp_path: Path, model_folder: Path
) -> None:
    with open(tmp_path / "chat.jsonl", "w") as handle:
        for i in range(16):
            turns = [
                {"role": "user", "content": f"what is {i} plus {i}?"},
                {"role": "assistant", "content": f"it is {2 * i}."},
            ]
            handle.write(json.dumps({"messages": turns}) + "\n")
    config = {
        "model": {"source": str(model_folder)},
        "data": {"path": "chat.jsonl", "format": "chat", "max_length": 64},
        "method": {"kind": "lora", "lora_r": 4},
        "micro_batch": 4,
        "max_steps": 3,
        "output_dir": "out",
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    result = run_cli("train", str(tmp_path / "run.yaml"), "--no-progress")
    assert result.exit_code == 0, result.stderr
    final = tmp_path / "out" / "final"
    adapter = json.loads((final / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(model_folder)
    assert (final / "tokenizer.json").is_file()
    assert not (tmp_path / "out" / "base").exists()  # a base on disk is never copied

    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    model = AutoPeftModelForCausalLM.from_pretrained(final)
    tokens = AutoTokenizer.from_pretrained(final)("what is 1 plus 1?", return_tensors="pt")
    assert model(**tokens).logits.shape[-1] == len(AutoTokenizer.from_pretrained(final))
