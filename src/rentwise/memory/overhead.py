"""Framework overhead outside the model's tensors: each a named constant with its source.

These are per GPU and do not scale with the model. They are what makes a "13.9 GB" job fail on a 14 GB card.
"""

from __future__ import annotations

from rentwise.units import MIB

# CUDA context + loaded kernel images, outside PyTorch's allocator (so in nvidia-smi's figure only).
# Measured: 1343 MiB on V100 with CUDA 11 eager module loading (HF perf_train_gpu_one docs, row 1 of
# shared/data/gpu_memory_measurements.csv). Since CUDA 11.7 / PyTorch 1.13, CUDA_MODULE_LOADING=LAZY is the
# default and the context is ~300-600 MiB (PyTorch CUDA semantics notes on lazy loading; the shared data
# README quotes 0.3-1.3 GiB). We use the middle of the lazy-loading range.
CUDA_CONTEXT_BYTES = 500 * MIB

# cuBLAS workspace, allocated through PyTorch's caching allocator (so it counts in memory_allocated).
# PyTorch's default CUBLAS_WORKSPACE_CONFIG is ":4096:8" (8 x 4 MiB) on Hopper and newer and
# ":4096:2:16:8" (8.125 MiB) before it (aten/src/ATen/cuda/CublasHandlePool.cpp, getChosenWorkspaceSize).
# We take the larger one so that a plan never under-counts.
CUBLAS_WORKSPACE_BYTES = 32 * MIB
# Handles are per thread (CublasHandlePool keeps thread-local handles) and autograd runs CUDA backward on its
# own device thread, so a training step holds two workspaces: forward's and backward's.
TRAINING_CUBLAS_WORKSPACES = 2

# Caching-allocator slack: reserved minus allocated at the peak. Requests are rounded up to 512 bytes and
# served from 2 MiB (small) or 20 MiB+ (large) segments that are split and cached
# (c10/cuda/CUDACachingAllocator.cpp), so reserved runs a few percent above allocated in steady training.
# 5% is the rule we use until the allocator simulation of `--trace` replaces it with a computed figure.
ALLOCATOR_SLACK_FRACTION = 0.05
