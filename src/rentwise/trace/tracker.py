"""Count every tensor storage as it is created and freed, with the category, phase and module that made it.

The idea is PyTorch's own `torch.distributed._tools.mem_tracker.MemTracker`: a `TorchDispatchMode` sees every
op output, and a weak reference to each output's `UntypedStorage` tells us when the storage dies (storage
PyObjects are preserved while the C++ storage lives, so the callback fires exactly at the free). We own this
small tracker instead of patching MemTracker, which fails on frozen parameters (LoRA/QLoRA bases).

Works identically on real CPU tensors and on `FakeTensor`s, which is what makes the real-vs-fake byte-exact
test possible. It counts storage bytes (`storage.nbytes()`), i.e. what `torch.cuda.memory_allocated` would
count before the allocator's 512-byte rounding (the rounding is `allocator.py`'s job).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

Category = Literal[
    "weights",
    "quant_constants",
    "adapter",
    "gradients",
    "optimizer",
    "activations",
    "logits",
    "kv_cache",
    "temporaries",
    "workspace",
    "host",  # lives in host memory on a GPU run (e.g. AdamW's `step` scalars): not counted
]

# Category -> MemoryBreakdown field.
CATEGORY_FIELDS: dict[str, str] = {
    "weights": "weights_bytes",
    "quant_constants": "quant_constants_bytes",
    "adapter": "adapter_bytes",
    "gradients": "gradients_bytes",
    "optimizer": "optimizer_bytes",
    "activations": "activations_bytes",
    "logits": "logits_bytes",
    "kv_cache": "kv_cache_bytes",
    "temporaries": "temporaries_bytes",
    "workspace": "workspace_bytes",
}

# Bytes an op allocates inside its kernel, invisible to the dispatcher, given (op, args, kwargs, phase):
# (transient bytes freed when the op returns, persistent bytes kept for the rest of the run).
WorkspaceModel = Callable[[Any, tuple[Any, ...], dict[str, Any], str], tuple[int, int]]


_ACTIVE: list[MemoryTracker] = []


_ORIGINAL_RESIZE = torch.UntypedStorage.resize_


def _resize_and_notify(storage: torch.UntypedStorage, size: int) -> Any:
    """`UntypedStorage.resize_`, reported to the active trackers (resizes bypass the dispatcher)."""
    result = _ORIGINAL_RESIZE(storage, size)
    for tracker in _ACTIVE:
        tracker.on_storage_resize(storage, size)
    return result


@contextmanager
def active_categorise(category: str) -> Iterator[None]:
    """Attribute storages created in the block to `category` in the innermost active tracker, if any."""
    if not _ACTIVE:
        yield
        return
    with _ACTIVE[-1].categorise(category):
        yield


def storage_tensors(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The tensors owning storage behind `tensor`: itself, or a wrapper subclass's inner tensors (a
    DTensor's local shard), as MemTracker flattens them."""
    if not is_traceable_wrapper_subclass(tensor):
        return [tensor]
    attrs, _ = tensor.__tensor_flatten__()
    inner = (getattr(tensor, attr) for attr in attrs)
    return [t for value in inner if isinstance(value, torch.Tensor) for t in storage_tensors(value)]


@dataclass
class StorageRecord:
    """One storage's size and attribution. Mutable: a storage is re-tagged when its role becomes known."""

    nbytes: int
    category: str
    phase: str
    module: str


@dataclass(frozen=True)
class PeakSnapshot:
    """Live storages at the allocation peak, summed by category and by module."""

    peak_bytes: int
    peak_phase: str
    peak_module: str
    by_category: dict[str, int]
    by_module: dict[str, int]
    phase_peaks: tuple[tuple[str, int], ...]
    final_bytes: int = 0


@dataclass(frozen=True)
class AllocEvent:
    """One allocation (nbytes > 0) or free (nbytes < 0) of storage `key`, in program order."""

    key: int
    nbytes: int
    phase: str


class MemoryTracker(TorchDispatchMode):
    """Record storage allocations and frees of every op run while the mode is active."""

    def __init__(self, workspace_model: WorkspaceModel | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.records: list[StorageRecord] = []
        self._event_keys: list[int] = []
        self._event_bytes: list[int] = []  # > 0 allocation, < 0 free (a resize is a free then an allocation)
        self._event_phases: list[str] = []
        self._live_bytes: dict[int, int] = {}  # key -> current storage size
        self._live: dict[int, int] = {}  # storage _cdata -> key
        self._refs: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self._workspace_model = workspace_model
        self.phase = "setup"
        self.module_stack: list[str] = []
        self.backward_module = ""
        self._override: tuple[str, str] | None = None
        self.is_logits_module: Callable[[str], bool] = lambda name: False

    def __enter__(self) -> MemoryTracker:
        _ACTIVE.append(self)
        if len(_ACTIVE) == 1:
            torch.UntypedStorage.resize_ = _resize_and_notify  # type: ignore[method-assign,assignment]
        super().__enter__()  # type: ignore[no-untyped-call]
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)  # type: ignore[no-untyped-call]
        _ACTIVE.remove(self)
        if not _ACTIVE:
            torch.UntypedStorage.resize_ = _ORIGINAL_RESIZE  # type: ignore[method-assign]

    # --- attribution ----------------------------------------------------------------------------------
    @contextmanager
    def categorise(self, category: str, module: str = "") -> Iterator[None]:
        """Attribute every storage created inside the block to `category` (and `module`)."""
        previous = self._override
        self._override = (category, module)
        try:
            yield
        finally:
            self._override = previous

    def _attribution(self) -> tuple[str, str]:
        if self._override is not None:
            category, module = self._override
            return category, module or self._current_module()
        module = self._current_module()
        if self.phase == "setup":
            return "weights", module
        if self.phase == "optimizer_step":
            return "temporaries", module
        if self.phase == "backward" and not self.module_stack:
            # A backward op (not a checkpoint recompute): its outputs are gradients in flight.
            return ("logits" if self.is_logits_module(module) else "temporaries"), module
        # Forward, prefill, decode, or a gradient-checkpoint recompute inside backward.
        return ("logits" if self.is_logits_module(module) else "activations"), module

    def _current_module(self) -> str:
        if self.module_stack:
            return self.module_stack[-1]
        return self.backward_module if self.phase == "backward" else ""

    def retag(self, tensor: torch.Tensor, category: str, module: str | None = None) -> None:
        """Give the storage behind `tensor` a new category (its whole life is re-attributed)."""
        for inner in storage_tensors(tensor):
            key = self._live.get(inner.untyped_storage()._cdata)
            if key is None:
                continue
            self.records[key].category = category
            if module is not None:
                self.records[key].module = module

    # --- counting -------------------------------------------------------------------------------------
    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        transient, persistent = (
            self._workspace_model(func, args, kwargs, self.phase) if self._workspace_model else (0, 0)
        )
        if persistent > 0:
            with self.categorise("workspace", "(cuBLAS workspace)"):
                self._allocate(persistent, None)  # never freed: cuBLAS keeps it per handle and stream
        workspace_key = self._allocate(transient, "temporaries") if transient > 0 else None
        out = func(*args, **kwargs)
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.track(leaf)
        if workspace_key is not None:
            self._free(workspace_key)
        return out

    def track(self, tensor: torch.Tensor) -> None:
        """Count the storage(s) behind `tensor` that have not been seen yet."""
        for inner in storage_tensors(tensor):
            self._track_storage(inner)

    def _track_storage(self, tensor: torch.Tensor) -> None:
        if tensor.is_sparse or tensor.device.type == "meta":
            return
        storage = tensor.untyped_storage()
        cdata = storage._cdata
        if cdata in self._live:
            return
        nbytes = storage.nbytes()
        if nbytes == 0:
            return
        key = self._allocate(nbytes, None)
        self._live[cdata] = key

        def on_free(_: object, cdata: int = cdata, key: int = key) -> None:
            self._live.pop(cdata, None)
            self._refs.pop(key, None)
            self._free(key)

        self._refs[key] = weakref.ref(storage, on_free)

    def _allocate(self, nbytes: int, category: str | None) -> int:
        attributed_category, module = self._attribution()
        key = len(self.records)
        self.records.append(StorageRecord(nbytes, category or attributed_category, self.phase, module))
        self._record_event(key, nbytes)
        return key

    def _record_event(self, key: int, delta: int) -> None:
        self._event_keys.append(key)
        self._event_bytes.append(delta)
        self._event_phases.append(self.phase)
        self._live_bytes[key] = self._live_bytes.get(key, 0) + delta

    def _free(self, key: int) -> None:
        size = self._live_bytes.pop(key, 0)
        if size:
            self._record_event(key, -size)
            self._live_bytes.pop(key, None)

    def on_storage_resize(self, storage: torch.UntypedStorage, nbytes: int) -> None:
        """A tracked storage changes size in place (FSDP frees/re-allocates unsharded parameters this way)."""
        key = self._live.get(storage._cdata)
        if key is None:
            return
        old = self._live_bytes.get(key, 0)
        if old:
            self._record_event(key, -old)
        if nbytes:
            self._record_event(key, nbytes)
            record = self.records[key]
            record.nbytes = max(record.nbytes, nbytes)
            # FSDP's unsharded parameters are re-allocated this way: all-gather buffers (temporaries).
            record.category = (
                "temporaries" if record.category in ("activations", "weights") else record.category
            )

    # --- results --------------------------------------------------------------------------------------
    def events(self) -> list[AllocEvent]:
        """Allocations and frees in order, with final categories; host-memory storages are left out."""
        out: list[AllocEvent] = []
        for key, delta, phase in zip(self._event_keys, self._event_bytes, self._event_phases, strict=True):
            if self.records[key].category != "host":
                out.append(AllocEvent(key, delta, phase))
        return out

    def step_events(self) -> list[AllocEvent]:
        """`events()` with setup compacted: the storages alive when the step starts are allocated first (in
        creation order), as if the model had been built directly in its final (e.g. sharded) form."""
        events = self.events()
        live: dict[int, AllocEvent] = {}
        first_step = len(events)
        for index, event in enumerate(events):
            if event.phase != "setup":
                first_step = index
                break
            if event.nbytes > 0:
                live[event.key] = event
            else:
                live.pop(event.key, None)
        return [live[key] for key in sorted(live)] + events[first_step:]

    def peak(self) -> PeakSnapshot:
        """Find the allocation peak (device storages only) and what was live at that instant."""
        live = peak = 0
        peak_index = -1
        phase_peaks: dict[str, int] = {}
        events = self.events()
        for index, event in enumerate(events):
            live += event.nbytes
            if event.phase == "setup":
                continue  # building/sharding the model is not part of the step (real runs shard on meta)
            phase_peaks[event.phase] = max(phase_peaks.get(event.phase, 0), live)
            if live > peak:
                peak, peak_index = live, index
        live_bytes: dict[int, int] = {}
        for event in events[: peak_index + 1]:
            live_bytes[event.key] = live_bytes.get(event.key, 0) + event.nbytes
        by_category: dict[str, int] = {}
        by_module: dict[str, int] = {}
        for key, size in live_bytes.items():
            if size:
                record = self.records[key]
                by_category[record.category] = by_category.get(record.category, 0) + size
                by_module[record.module] = by_module.get(record.module, 0) + size
        peak_record = self.records[events[peak_index].key] if peak_index >= 0 else None
        return PeakSnapshot(
            peak_bytes=peak,
            peak_phase=events[peak_index].phase if peak_index >= 0 else "setup",
            peak_module=peak_record.module if peak_record else "",
            by_category=by_category,
            by_module=by_module,
            phase_peaks=tuple(phase_peaks.items()),
            final_bytes=live,
        )


@dataclass
class ModuleAttribution:
    """Forward/backward hooks that keep `tracker.module_stack` and `tracker.backward_module` current."""

    tracker: MemoryTracker
    names: dict[int, str] = field(default_factory=dict)
    sharded_units: set[int] = field(default_factory=set)
    """ids of FSDP-wrapped modules (see shard.py)."""
    _handles: list[Any] = field(default_factory=list)

    def attach(self, root: torch.nn.Module) -> None:
        self.names = {id(m): name for name, m in root.named_modules(remove_duplicate=False)}
        for module in root.modules():
            self._handles.append(module.register_forward_pre_hook(self._enter))
            self._handles.append(module.register_forward_hook(self._leave, always_call=True))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _enter(self, module: torch.nn.Module, args: Any) -> None:
        name = self.names.get(id(module), type(module).__name__)
        self.tracker.module_stack.append(name)
        if id(module) in self.sharded_units:
            # FSDP's pre-forward hook (which runs first) has all-gathered this unit's parameters into
            # unsharded storages that it frees and re-allocates every use: all-gather buffers.
            for param in module.parameters():
                if not is_traceable_wrapper_subclass(param):  # still-sharded DTensors of nested units
                    self.tracker.retag(param, "temporaries", name)

    def _leave(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        name = self.tracker.module_stack.pop() if self.tracker.module_stack else ""
        if torch.is_grad_enabled():
            self.label_graph(output, name)

    def label_graph(self, output: Any, name: str) -> None:
        """Tag autograd nodes not yet labelled that `output` reaches with `name` (for backward attribution).

        Inner modules finish first, so their nodes are labelled before the enclosing module walks the graph.
        """
        stack = [t.grad_fn for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.grad_fn]
        tracker = self.tracker
        while stack:
            node = stack.pop()
            if node is None:
                continue
            metadata: dict[str, str] = node.metadata  # type: ignore[assignment]
            if "rentwise_module" in metadata:
                continue
            metadata["rentwise_module"] = name

            def enter_backward(grad_outputs: Any, name: str = name) -> None:
                tracker.backward_module = name

            node.register_prehook(enter_backward)
            stack.extend(next_node for next_node, _ in node.next_functions if next_node is not None)
