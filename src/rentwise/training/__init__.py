"""Preemption-safe fine-tuning (`rentwise train`): config, data, model preparation, the loop, checkpoints.

Everything here except `checkpoints` and `preemption` needs the `train` extra (torch, transformers, peft,
accelerate); import the submodules directly so `import rentwise.training` stays light.
"""
