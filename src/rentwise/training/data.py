"""Training data: read rows, turn them into token ids with loss masks, and sample them by index.

Sampling is a pure function of (seed, epoch, step, rank): each epoch is one seeded permutation of the example
indices, and optimizer step s of that epoch takes examples [s·G, (s+1)·G) of it, G being the global batch.
Resuming at step s therefore skips nothing and reads nothing it does not use (O(1) skip), and changing the
micro-batch / accumulation split (the OOM guard) keeps the examples of every step the same.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from rentwise.errors import ConfigError, MissingExtraError, NotFoundError
from rentwise.training.config import DataConfig

IGNORE_INDEX = -100  # labels with this value carry no loss (the Hugging Face convention)


class Tokenizer(Protocol):
    vocab_size: int
    eos_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]: ...

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> tuple[list[int], list[int]] | None:
        """Ids and labels from the tokenizer's chat template, or None when it has none."""


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255, then end-of-sequence (256) and padding (257): no files, no downloads."""

    vocab_size = 258
    eos_id = 256
    pad_id = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> tuple[list[int], list[int]] | None:
        return None


class HfTokenizer:
    """A local Hugging Face tokenizer folder (never downloaded)."""

    def __init__(self, folder: Path) -> None:
        from transformers import AutoTokenizer

        try:
            self._tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError) as error:
            raise ConfigError(f"could not load a tokenizer from '{folder}': {error}") from error
        self.vocab_size = len(self._tok)
        eos = self._tok.eos_token_id
        if eos is None:
            raise ConfigError(f"tokenizer in '{folder}' has no end-of-sequence token")
        self.eos_id = int(eos)
        pad = self._tok.pad_token_id
        self.pad_id = int(eos if pad is None else pad)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> tuple[list[int], list[int]] | None:
        if not getattr(self._tok, "chat_template", None):
            return None
        ids = self._chat_ids(messages)
        labels = [IGNORE_INDEX] * len(ids)
        for i, message in enumerate(messages):  # train on assistant turns: the tokens each one adds
            if message["role"] != "assistant":
                continue
            before = self._chat_ids(messages[:i], add_generation_prompt=True)
            after = self._chat_ids(messages[: i + 1])
            if after[: len(before)] != before:  # template not prefix-stable: fall back to every token
                return ids, list(ids)
            labels[len(before) : len(after)] = ids[len(before) : len(after)]
        return ids, labels

    def _chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = False) -> list[int]:
        out = self._tok.apply_chat_template(
            list(messages), tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False
        )
        return [int(i) for i in out]  # type: ignore[arg-type]


def load_tokenizer(name: str | None, model_path: Path) -> Tokenizer:
    """`bytes`, a tokenizer folder, or (None) the model folder's own tokenizer."""
    if name == "bytes":
        return ByteTokenizer()
    folder = Path(name) if name else model_path
    if not folder.is_dir():
        raise ConfigError(
            f"model '{model_path}' has no tokenizer folder", hint="set `tokenizer:` to a folder or to 'bytes'"
        )
    return HfTokenizer(folder)


@dataclass(frozen=True)
class Example:
    input_ids: tuple[int, ...]
    labels: tuple[int, ...]


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a jsonl/json/csv/parquet/txt file or a `datasets` folder, as dicts."""
    if not path.exists():
        raise NotFoundError(f"data file '{path}' does not exist")
    if path.is_dir():
        return _read_datasets_folder(path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return [_json_row(path, number, line) for number, line in _lines(path) if line.strip()]
    if suffix == ".json":
        rows = _load_json(path)
        if not isinstance(rows, list):
            raise ConfigError(f"data file '{path}' must hold a JSON list of objects")
        return [_check_row(path, number, row) for number, row in enumerate(rows, 1)]
    if suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as handle:
            return [dict(row) for row in csv.DictReader(handle)]
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as error:
            raise MissingExtraError("reading parquet needs pyarrow", hint="pip install pyarrow") from error
        table_rows: list[dict[str, Any]] = list(pq.read_table(path).to_pylist())
        return table_rows
    if suffix in (".txt", ".text", ".md"):
        return [{"text": line.rstrip("\n")} for _, line in _lines(path) if line.strip()]
    raise ConfigError(
        f"data file '{path}' has an unknown extension '{suffix}'",
        hint="use .jsonl, .json, .csv, .parquet, .txt or a saved `datasets` folder",
    )


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    with open(path, encoding="utf-8") as handle:
        yield from enumerate(handle, 1)


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ConfigError(f"data file '{path}' is not valid JSON: {error}") from error


def _json_row(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except ValueError as error:
        raise ConfigError(f"data file '{path}' row {number} is not valid JSON: {error}") from error
    return _check_row(path, number, row)


def _check_row(path: Path, number: int, row: Any) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise ConfigError(f"data file '{path}' row {number} is not an object")
    return row


def _read_datasets_folder(path: Path) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError as error:
        raise MissingExtraError(
            "reading a saved `datasets` folder needs it", hint="pip install datasets"
        ) from error
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        loaded = loaded["train"] if "train" in loaded else next(iter(loaded.values()))
    return [dict(row) for row in loaded]


def build_examples(
    rows: Sequence[dict[str, Any]], config: DataConfig, tokenizer: Tokenizer, source: Path
) -> list[Example]:
    """Tokenise rows in the configured format, truncate to max_length, and pack when asked."""
    examples = []
    for number, row in enumerate(rows, 1):
        ids, labels = _encode_row(row, config, tokenizer, source, number)
        ids, labels = ids[: config.max_length], labels[: config.max_length]
        if any(
            label != IGNORE_INDEX for label in labels[1:]
        ):  # a row truncated to its prompt teaches nothing
            examples.append(Example(tuple(ids), tuple(labels)))
    if not examples:
        raise ConfigError(f"data file '{source}' gives no trainable examples (empty, or every row truncated)")
    return pack(examples, config.max_length) if config.packing else examples


def _field(row: dict[str, Any], name: str, source: Path, number: int, kind: type = str) -> Any:
    if name not in row or row[name] is None:
        raise ConfigError(
            f"data file '{source}' row {number} has no field '{name}' "
            f"(it has: {', '.join(sorted(row)) or 'none'})",
            hint="set the data.*_field names in the config to match the file",
        )
    value = row[name]
    if not isinstance(value, kind):
        raise ConfigError(f"data file '{source}' row {number} field '{name}' must be a {kind.__name__}")
    return value


def _encode_row(
    row: dict[str, Any], config: DataConfig, tokenizer: Tokenizer, source: Path, number: int
) -> tuple[list[int], list[int]]:
    if config.format == "text":
        ids = [*tokenizer.encode(_field(row, config.text_field, source, number)), tokenizer.eos_id]
        return ids, list(ids)
    if config.format == "instruction":
        prompt = _field(row, config.instruction_field, source, number)
        if row.get(config.input_field):
            prompt = f"{prompt}\n\n{row[config.input_field]}"
        response = _field(row, config.response_field, source, number)
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    else:
        messages = _field(row, config.messages_field, source, number, list)
        for turn, message in enumerate(messages, 1):
            if not (isinstance(message, dict) and {"role", "content"} <= set(message)):
                raise ConfigError(
                    f"data file '{source}' row {number} message {turn} needs 'role' and 'content' fields"
                )
    templated = tokenizer.encode_chat(messages)
    return templated if templated is not None else _plain_chat(messages, tokenizer)


def _plain_chat(messages: Sequence[dict[str, str]], tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """Fallback template when the tokenizer has none: `<|role|>\\ncontent\\n`, loss on assistant turns."""
    ids: list[int] = []
    labels: list[int] = []
    for message in messages:
        header = tokenizer.encode(f"<|{message['role']}|>\n")
        body = [*tokenizer.encode(message["content"]), tokenizer.eos_id]
        trained = message["role"] == "assistant"
        ids += header + body
        labels += [IGNORE_INDEX] * len(header) + (body if trained else [IGNORE_INDEX] * len(body))
    return ids, labels


def pack(examples: Sequence[Example], block: int) -> list[Example]:
    """Concatenate examples and cut into `block`-token pieces; the last partial piece is dropped."""
    ids = [i for e in examples for i in e.input_ids]
    labels = [label for e in examples for label in e.labels]
    return [
        Example(tuple(ids[start : start + block]), tuple(labels[start : start + block]))
        for start in range(0, len(ids) - block + 1, block)
    ]


def split_eval(examples: list[Example], fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    """Hold out `fraction` of the examples (a seeded choice) for evaluation."""
    if fraction <= 0:
        return examples, []
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed)).tolist()
    held = max(1, int(len(examples) * fraction))
    return [examples[i] for i in sorted(order[held:])], [examples[i] for i in sorted(order[:held])]


@dataclass(frozen=True)
class Sampler:
    """Which examples each rank uses at each optimizer step: a pure function of the step (see module doc)."""

    num_examples: int
    global_batch: int
    world_size: int
    seed: int

    @property
    def steps_per_epoch(self) -> int:
        return self.num_examples // self.global_batch

    def epoch_order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_examples, generator=generator).tolist()

    def step_indices(self, step: int, rank: int, order: list[int] | None = None) -> list[int]:
        """Example indices rank `rank` trains on at optimizer step `step` (0-based, across epochs)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        order = order if order is not None else self.epoch_order(epoch)
        per_rank = self.global_batch // self.world_size
        start = within * self.global_batch + rank * per_rank
        return order[start : start + per_rank]


def collate(examples: Sequence[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a micro-batch to its longest example; padding carries no loss and no attention."""
    width = max(len(e.input_ids) for e in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example.input_ids)
        input_ids[row, :n] = torch.tensor(example.input_ids)
        labels[row, :n] = torch.tensor(example.labels)
        attention[row, :n] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention}
