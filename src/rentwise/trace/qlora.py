"""Emulated bitsandbytes 4-bit (NF4) linear layers: exact storage and the transient dequantised weight.

bitsandbytes kernels cannot run on fake CPU tensors, so `NF4Linear` reproduces what `bnb.nn.Linear4bit`
holds and allocates, after bitsandbytes/functional.py `quantize_4bit` / `dequantize_4bit` and
bitsandbytes/autograd/_functions.py `MatMul4Bit` / `matmul_4bit`:

- weight: two 4-bit codes per byte, a uint8 tensor of ceil(out*in/2) bytes (`Params4bit`);
- absmax: one per 64-weight block (blocksize=64), fp32; with double quantisation (`compress_statistics`) it is
  stored as uint8, plus per 256-absmax block an fp32 scale (`state2.absmax`), the fp32 mean `offset`, and the
  256-entry fp32 dynamic code (one per device, cached in `name2qmap`);
- the 16-entry fp32 NF4 code (`get_4bit_type`, one per layer);
- forward/backward: `dequantize_4bit` materialises fp32 absmax (double quant) and the full weight in the
  compute dtype, used by one GEMM and freed; `MatMul4Bit` saves only the packed weight for backward;
- single-token inference uses `gemv_4bit`, which never materialises the weight.

Only nn.Linear modules are quantised (transformers' `replace_with_bnb_linear`): MoE expert tensors stay in
the compute dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from rentwise.trace.tracker import active_categorise

BLOCKSIZE = 64  # bnb.nn.Linear4bit default quant blocksize
NESTED_BLOCKSIZE = 256  # quantize_4bit(compress_statistics=True) -> quantize_blockwise(absmax, blocksize=256)
NF4_CODE_ENTRIES = 16
DYNAMIC_CODE_ENTRIES = 256  # create_dynamic_map(): 8-bit dynamic quantisation map


class NF4Weight(nn.Module):
    """A frozen weight stored as bitsandbytes NF4 would store it (built on the meta device), with its GEMM."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        compute_dtype: torch.dtype,
        double_quant: bool,
        dynamic_code: torch.Tensor,
    ) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.compute_dtype = compute_dtype
        self.double_quant = double_quant
        numel = in_features * out_features
        blocks = -(-numel // BLOCKSIZE)
        meta = torch.device("meta")
        self.weight = nn.Parameter(
            torch.empty((numel + 1) // 2, 1, dtype=torch.uint8, device=meta), requires_grad=False
        )
        bias_param = nn.Parameter(torch.empty(out_features, dtype=compute_dtype, device=meta), False)
        self.bias = bias_param if bias else None
        self.register_buffer("code", torch.empty(NF4_CODE_ENTRIES, dtype=torch.float32, device=meta))
        if double_quant:
            self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8, device=meta))
            nested = -(-blocks // NESTED_BLOCKSIZE)
            self.register_buffer("nested_absmax", torch.empty(nested, dtype=torch.float32, device=meta))
            self.register_buffer("offset", torch.empty((), dtype=torch.float32, device=meta))
            self.register_buffer("nested_code", dynamic_code)
        else:
            self.register_buffer("absmax", torch.empty(blocks, dtype=torch.float32, device=meta))

    @property
    def blocks(self) -> int:
        return -(-(self.in_features * self.out_features) // BLOCKSIZE)

    def dequantised_absmax(self) -> torch.Tensor | None:
        """dequantize_blockwise(absmax, state2) + offset: fp32, one per block (double quant only)."""
        if not self.double_quant:
            return None
        return torch.empty(self.blocks, dtype=torch.float32, device=self.weight.device)

    def dequantise(self) -> torch.Tensor:
        """dequantize_4bit: the full weight in the compute dtype (its fp32 absmax lives meanwhile)."""
        with active_categorise("temporaries"):
            absmax = self.dequantised_absmax()
            weight = torch.empty(
                (self.out_features, self.in_features), dtype=self.compute_dtype, device=self.weight.device
            )
            del absmax
        return weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Linear4bit.forward: cast input and bias to the compute dtype, matmul_4bit, cast back.
        input_dtype = x.dtype
        x = x.to(self.compute_dtype)
        bias = None if self.bias is None else self.bias.to(self.compute_dtype)
        if x.numel() == x.shape[-1] and not x.requires_grad and self.in_features % BLOCKSIZE == 0:
            with active_categorise("temporaries"):
                absmax = self.dequantised_absmax()
            out = torch.empty((*x.shape[:-1], self.out_features), dtype=self.compute_dtype, device=x.device)
            del absmax
            if bias is not None:
                out += bias
        else:
            out = _MatMul4Bit.apply(x, self, bias)  # type: ignore[no-untyped-call]
        result: torch.Tensor = out.to(input_dtype)
        return result


class NF4Linear(NF4Weight, nn.Linear):  # type: ignore[misc]
    """`NF4Weight` that is an nn.Linear, so peft wraps it with a LoRA layer as it wraps bnb's Linear4bit."""


class _MatMul4Bit(torch.autograd.Function):
    """MatMul4Bit: dequantise, one GEMM, free; backward dequantises again for grad_input."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: NF4Weight, bias: torch.Tensor | None) -> torch.Tensor:
        weight = layer.dequantise()
        out = nn.functional.linear(x, weight, bias)
        del weight
        ctx.layer = layer
        ctx.bias_dtype = None if bias is None else bias.dtype
        return out

    @staticmethod
    def backward(
        ctx: Any, grad_output: torch.Tensor
    ) -> tuple[torch.Tensor | None, None, torch.Tensor | None]:
        layer: NF4Weight = ctx.layer
        grad_bias = grad_output.sum(0, dtype=ctx.bias_dtype) if ctx.needs_input_grad[2] else None
        grad_x = None
        if ctx.needs_input_grad[0]:
            weight = layer.dequantise().to(grad_output.dtype)
            grad_x = torch.matmul(grad_output, weight)
            del weight
        return grad_x, None, grad_bias


def replace_linears_with_nf4(
    model: nn.Module, targets: Sequence[str], compute_dtype: torch.dtype, double_quant: bool
) -> int:
    """Swap every nn.Linear except the output head for an `NF4Linear`, as transformers' bnb quantizer does.

    `targets` is unused on purpose: bitsandbytes quantises all linear layers (`llm_int8_skip_modules`
    keeps only the output embedding), whatever LoRA later targets. transformers' `replace_with_bnb_linear`
    swaps only `type(module) is nn.Linear`, so MoE experts (3-D parameters in transformers 5) and routers
    stay in the compute dtype, as they do here. Returns how many layers were swapped.
    """
    del targets
    get_output = getattr(model, "get_output_embeddings", None)
    output = get_output() if callable(get_output) else None
    dynamic_code = torch.empty(DYNAMIC_CODE_ENTRIES, dtype=torch.float32, device="meta")
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not nn.Linear or child is output:
                continue
            quantised = NF4Linear(
                child.in_features, child.out_features, child.bias is not None, compute_dtype, double_quant,
                dynamic_code,
            )  # fmt: skip
            setattr(parent, name, quantised)
            swapped += 1
    return swapped
