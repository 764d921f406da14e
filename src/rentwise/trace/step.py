"""One step of the job, run under the tracker: training (forward, loss, backward, first optimizer step) or
inference (prefill with the KV cache, then N decode steps).

The step mirrors what a Hugging Face Trainer / accelerate loop does on a GPU: autocast around the forward
only, the model output dropped before backward (only the loss is kept), `optimizer.step()` creating the
states on the first step, then `zero_grad(set_to_none=True)`.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

from rentwise.memory.job import MemoryJob
from rentwise.trace.build import BuiltModel
from rentwise.trace.tracker import MemoryTracker, ModuleAttribution

# bitsandbytes 8-bit blockwise optimizers (bnb.optim.AdamW8bit): uint8 states in blocks of 256 with one fp32
# absmax per block per state; tensors under min_8bit_size=4096 elements keep fp32 states.
BNB_STATE_BLOCKSIZE = 256
BNB_MIN_8BIT_SIZE = 4096


class EmulatedAdamW8bit(torch.optim.Optimizer):
    """The state bnb.optim.AdamW8bit creates on the first step; its fused kernel then updates in place."""

    def __init__(self, params: Any, lr: float = 1e-4) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None or self.state[param]:
                    continue
                state = self.state[param]
                state["step"] = torch.zeros((), dtype=torch.float32)
                if param.numel() < BNB_MIN_8BIT_SIZE:
                    state["state1"] = torch.zeros_like(param, dtype=torch.float32)
                    state["state2"] = torch.zeros_like(param, dtype=torch.float32)
                    continue
                blocks = -(-param.numel() // BNB_STATE_BLOCKSIZE)
                state["state1"] = torch.zeros_like(param, dtype=torch.uint8)
                state["state2"] = torch.zeros_like(param, dtype=torch.uint8)
                state["absmax1"] = torch.zeros(blocks, dtype=torch.float32, device=param.device)
                state["absmax2"] = torch.zeros(blocks, dtype=torch.float32, device=param.device)


def make_optimizer(job: MemoryJob, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The job's optimizer, configured as it runs on CUDA.

    torch.optim defaults to the foreach implementation when all params are on CUDA
    (torch/optim/optimizer.py `_default_to_fused_or_foreach`); on CPU it would pick the for-loop one, so
    foreach is forced here to reproduce the GPU's temporaries.
    """
    lr = 1e-4
    if job.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, foreach=True)
    if job.optimizer == "adamw_fused":
        return torch.optim.AdamW(params, lr=lr, fused=True)
    if job.optimizer == "adamw_8bit":
        return EmulatedAdamW8bit(params, lr=lr)
    if job.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        # relative_step/scale_parameter read tensor values (a Python max over an RMS); a fixed lr does not.
        adafactor: torch.optim.Optimizer = Adafactor(  # type: ignore[no-untyped-call]
            params, lr=lr, scale_parameter=False, relative_step=False
        )
        return adafactor
    momentum = 0.9 if job.optimizer == "sgd_momentum" else 0.0
    return torch.optim.SGD(params, lr=lr, momentum=momentum, foreach=True)


def _autocast(built: BuiltModel, device: str) -> contextlib.AbstractContextManager[Any]:
    # On fake CPU tensors CPU autocast stands in for CUDA autocast: both cast matmul/linear/sdpa inputs to the
    # half dtype; the HF models upcast norms, softmax and the loss explicitly, where the two op lists differ.
    if built.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=built.autocast_dtype)


def _vocab_size(built: BuiltModel) -> int:
    return int(built.model.get_output_embeddings().weight.shape[0])  # type: ignore[operator]


@contextlib.contextmanager
def _phase(
    tracker: MemoryTracker, phase: str, progress: Callable[[str], None] | None, label: str = ""
) -> Iterator[None]:
    tracker.phase = phase
    if progress:
        progress(label + phase)
    yield


def run_training_step(
    built: BuiltModel,
    job: MemoryJob,
    tracker: MemoryTracker,
    attribution: ModuleAttribution,
    progress: Callable[[str], None] | None = None,
    steps: int = 2,
    device: str = "cpu",
) -> None:
    """`steps` x (forward + loss, backward, optimizer step, zero_grad).

    Step 1 creates the optimizer state; step 2 is the steady state a real run repeats (states live through
    forward and backward), so the peak over two steps is what max_memory_allocated shows after any run.
    """
    model = built.model
    trainable = [p for p in model.parameters() if p.requires_grad]
    # Offloaded (FSDP CPUOffloadPolicy / ZeRO-Offload): gradient shards and optimizer states live on the host.
    offloaded = job.offload != "none" and job.data_parallel > 1 and job.sharding in ("fsdp", "zero3")
    names = {id(p): name for name, p in model.named_parameters()}
    optimizer = make_optimizer(job, trainable)
    for param in trainable:
        category = "adapter" if "lora_" in names[id(param)] else "gradients"
        module = names[id(param)].rpartition(".")[0]

        def tag_grad(p: torch.Tensor, category: str = category, module: str = module) -> None:
            if p.grad is not None:
                tracker.retag(p.grad, category, module)

        param.register_post_accumulate_grad_hook(tag_grad)  # type: ignore[no-untyped-call]

    for step in range(1, steps + 1):
        label = f"step {step}/{steps} " if steps > 1 else ""
        with _phase(tracker, "forward", progress, label):
            with tracker.categorise("activations"):
                input_ids = torch.randint(
                    0, _vocab_size(built), (job.micro_batch, job.seq_len), device=device
                )
            with _autocast(built, device):
                output = model(input_ids=input_ids, labels=input_ids, use_cache=False)
            loss = output.loss
            del output, input_ids  # the Trainer keeps only the loss; logits not saved for backward are freed
            attribution.label_graph(loss, "")
        with _phase(tracker, "backward", progress, label):
            loss.backward()
            del loss
            # FSDP sets sharded gradients without AccumulateGrad (no hook fires): tag whatever .grad holds.
            for param in trainable:
                if param.grad is not None:
                    name = names[id(param)]
                    category = "adapter" if "lora_" in name else "gradients"
                    tracker.retag(param.grad, "host" if offloaded else category)
        with _phase(tracker, "optimizer_step", progress, label):
            optimizer.step()
            _tag_optimizer_state(optimizer, tracker, names, job.optimizer == "adamw_fused", offloaded)
            optimizer.zero_grad(set_to_none=True)


def _tag_optimizer_state(
    optimizer: torch.optim.Optimizer,
    tracker: MemoryTracker,
    names: dict[int, str],
    fused: bool,
    offloaded: bool,
) -> None:
    for param, state in optimizer.state.items():
        name = names.get(id(param), "")
        category = "host" if offloaded else "adapter" if "lora_" in name else "optimizer"
        for key, value in state.items():
            if not isinstance(value, torch.Tensor):
                continue
            # Adam's `step` is a host (CPU) scalar on CUDA unless fused/capturable (torch/optim/adam.py
            # _init_group), so it takes no GPU memory.
            is_host_scalar = key == "step" and not fused
            tracker.retag(value, "host" if is_host_scalar else category, name.rpartition(".")[0])


def _cache_of(output: Any) -> Any:
    return output["cache"] if "cache" in output else output["past_key_values"]


def _tag_kv_cache(cache: Any, tracker: MemoryTracker) -> None:
    for layer in getattr(cache, "layers", ()):
        for attr in ("keys", "values"):
            tensor = getattr(layer, attr, None)
            if isinstance(tensor, torch.Tensor):
                tracker.retag(tensor, "kv_cache")


def run_inference(
    built: BuiltModel,
    job: MemoryJob,
    tracker: MemoryTracker,
    progress: Callable[[str], None] | None = None,
    device: str = "cpu",
) -> None:
    """Prefill `prompt_len` tokens, then decode `generate_len` tokens greedily with the KV cache.

    Logits are kept for the last position only, as `generate()` does (`logits_to_keep=1`).
    """
    model = built.model
    # transformers 5 renamed `past_key_values` to `cache` (the old name still works, with a warning).
    cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad(), _autocast(built, device):
        with _phase(tracker, "prefill", progress):
            with tracker.categorise("activations"):
                input_ids = torch.randint(
                    0, _vocab_size(built), (job.micro_batch, job.prompt_len), device=device
                )
            output = model(input_ids=input_ids, use_cache=True, logits_to_keep=1)
            cache = _cache_of(output)
            _tag_kv_cache(cache, tracker)
            next_ids = output.logits[:, -1:].argmax(-1)
            del output, input_ids
        for _ in range(job.generate_len):
            with _phase(tracker, "decode", None):
                output = model(input_ids=next_ids, **{cache_kwarg: cache}, use_cache=True, logits_to_keep=1)
                cache = _cache_of(output)
                _tag_kv_cache(cache, tracker)
                next_ids = output.logits[:, -1:].argmax(-1)
                del output
        if progress and job.generate_len:
            progress(f"decode x{job.generate_len}")
