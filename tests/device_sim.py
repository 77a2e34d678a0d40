"""A simulated accelerator for the test suite on the CPU: `FASTDECODE_TEST_DEVICE=sim` (tests/conftest.py).

A GPU refuses what the CPU allows: an operation on a tensor of the GPU and a tensor of the host ("Expected all tensors
to be on the same device"), a host generator for the device's sampling, a device tensor handed to numpy. The device's
suite runs failed mostly for these (docs/gpu.md: 100 of the second run's 135 failures were a tensor or module a test
or the library made on the CPU beside a model on the GPU), and a GPU is lent only now and then. This module makes the
CPU refuse them too, so that a rehearsal of the device's suite (tools/gpu_dry_run.sh) finds them beforehand.

The simulated device is the CPU named `cpu:0` (`DEVICE`; the host stays `cpu`): a tensor made for it (a factory
function given `device="cpu:0"`, `.to("cpu:0")`, a module moved there, or any result of an operation on such tensors)
is a `SimTensor`, a wrapper around an ordinary CPU tensor (`payload`) whose `device` says `cpu:0`; `.cpu()`,
`.to("cpu")`, `.tolist()` and `.item()` bring values back to the host as on a GPU. Each operation on a SimTensor runs
the CPU's kernel on the payload tensors, so values are the CPU's bit for bit, after this check, as CUDA's kernels make
it: a host tensor of one dimension or more beside a device tensor is refused (a host scalar, `dim() == 0`, is allowed,
as CUDA allows it), except as the indices of an indexing operation and in copies between the two. `torch.Generator`
made with `device="cpu:0"` is a `SimGenerator` (a CPU generator whose `device` says `cpu:0`); a host generator given to
an operation on device tensors is refused, and a device one on host tensors.

What it cannot show: anything of the GPU itself (its kernels' rounding, CUDA graphs, streams, torch.compile's GPU
kernels, memory), and code that asks for CUDA by name (`device.type == "cuda"`), which sees a CPU here: those paths
run on the device only. `torch.compile` does not trace SimTensors: under the simulation a compiled function runs
eagerly (`compile_eagerly`), the same operations without inductor's kernels, which is what the CPU tests' `eager`
backend does too.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import return_and_correct_aliasing

DEVICE = torch.device("cpu", 0)
HOST = torch.device("cpu")
_aten = torch.ops.aten
_Generator = torch._C.Generator
# operations CUDA runs with host tensors beside device ones: the indices of indexing (moved to the device), copies
_INDEXING = {_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default, _aten._index_put_impl_.default}
_COPIES = {_aten.copy_.default, _aten._to_copy.default, _aten.lift_fresh.default}


# what waits for the device on CUDA (a synchronisation): a value read into Python (`.item()`, `int()`, `bool()`: aten's
# `_local_scalar_dense`), and the operations whose output's size depends on the values, which read it back to size
# the result (`nonzero`, a boolean mask's indexing or an assignment through one, `masked_select`, `unique`,
# `repeat_interleave` without `output_size`); copies to host memory are counted where they are made (`_Mode`,
# `_dispatch`)
_SIZED_BY_VALUES = {_aten.nonzero.default, _aten.masked_select.default, _aten._unique2.default,
                    _aten.unique_consecutive.default, _aten.unique_dim.default}
_counters: list[Counter[str]] = []


def _waited(what: str) -> None:
    for counter in _counters:
        counter[what] += 1


@contextlib.contextmanager
def counting_reads() -> Iterator[Counter[str]]:
    """Count, while the block runs, what would make the host wait for a GPU: each read of a device value (`item`:
    `.item()`, `int()`, `bool()`; `tolist`; `copy`: `.cpu()`, `.to("cpu")`, a copy into a host tensor) and each
    operation that sizes its output by the values (`sized`, e.g. `nonzero`). Copies made with `non_blocking=True`
    count apart (`async copy`): they wait only where the host then reads them (issue #30's "one synchronisation a
    step" counts the rest). Under the simulation only; in every thread."""
    counter: Counter[str] = Counter()
    _counters.append(counter)
    try:
        yield counter
    finally:
        _counters.remove(counter)


ASYNC = "async copy"  # the kind of `counting_reads` that does not wait by itself


def reads_per_forward(generate: Any, short: int = 8, long: int = 40) -> tuple[dict[str, float], int, Any]:
    """What a generation waits for per target forward in steady state: `generate(new_tokens)` (a `Result`, or a
    batch's list of them: its first row's forwards count, a forward serving every row) run for `short` and for `long`
    new tokens under `counting_reads`, the difference divided by the target forwards between the two, so the prefill
    and the first steps cancel out. Returns the reads per forward by kind with `"waits"`, their sum less the
    non-blocking copies; the forwards between the two (0: an end of text came first, nothing is divided); and the
    longer run's result."""
    counted = []
    for new in (short, long):
        with counting_reads() as reads:
            result = generate(new)
        first = result[0] if isinstance(result, list) else result
        counted.append((first.stats.forwards, reads))
    (f0, c0), (f1, c1) = counted
    forwards = f1 - f0
    per = {kind: (c1[kind] - c0[kind]) / max(forwards, 1) for kind in sorted(set(c0) | set(c1))}
    per["waits"] = sum(v for kind, v in per.items() if kind != ASYNC)
    return per, forwards, result


class EmulatedGraph:
    """A "captured" CUDA graph on any device (`emulated_capture`, in place of `models.graphs.capture`): its replay runs
    the body again and writes the results into the captured outputs, as a CUDA graph's replay overwrites its static
    outputs, so a caller that keeps an output without copying it sees it change."""

    def __init__(self, body: Any, arg: Any) -> None:
        self.body, self.arg = body, arg
        self.outputs = body(arg)

    def replay(self) -> None:
        for static, new in zip(self.outputs, self.body(self.arg), strict=True):
            static.copy_(new)


def emulated_capture(body: Any, arg: Any, device: Any) -> tuple[EmulatedGraph, Any]:
    graph = EmulatedGraph(body, arg)
    return graph, graph.outputs


def on_device(device: Any) -> bool:
    """Whether `device` (a torch.device, a string, None) names the simulated device rather than the host."""
    if device is None or isinstance(device, int):
        return False
    d = torch.device(device)
    return d.type == DEVICE.type and d.index == DEVICE.index


class DeviceMixError(RuntimeError):
    """What CUDA raises for a host tensor beside a device one; a RuntimeError, as torch's."""


class SimTensor(torch.Tensor):
    """A tensor on the simulated device: an ordinary CPU tensor (`payload`) in a wrapper whose device is `DEVICE`."""

    payload: torch.Tensor

    @staticmethod
    def __new__(cls, payload: torch.Tensor) -> SimTensor:
        wrapped = torch.Tensor._make_wrapper_subclass(
            cls, payload.size(), strides=payload.stride(), storage_offset=payload.storage_offset(), dtype=payload.dtype,
            layout=payload.layout, device=DEVICE, requires_grad=payload.requires_grad)
        wrapped.payload = payload
        return wrapped

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return f"SimTensor({self.payload!r}, device='{DEVICE}')"

    def numpy(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"can't convert {DEVICE} device type tensor to numpy (a simulated device tensor). Use "
                        "Tensor.cpu() to copy the tensor to host memory first.")

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        return self.numpy()

    def __reduce_ex__(self, protocol: Any) -> Any:  # torch.save: as the tensor it holds (a GPU's loads back too)
        return self.payload.__reduce_ex__(protocol)

    __torch_function__ = torch._C._disabled_torch_function_impl  # the mode below sees Python-level calls

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return _dispatch(func, args, kwargs or {})


def _map(fn: Any, x: Any) -> Any:
    """`fn` on every leaf of nested tuples and lists (an operation's results); faster than torch's pytree, which
    every operation on the device would pay for."""
    if isinstance(x, (tuple, list)):
        return type(x)(_map(fn, v) for v in x)
    return fn(x)


def _tensors(args: Any, kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors among an operation's arguments: aten's are tensors or lists of them (`cat`, `index`'s indices)."""
    found = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            found.extend(t for t in a if isinstance(t, torch.Tensor))
    return found


def _payloads(args: Any) -> Any:
    return type(args)(a.payload if isinstance(a, SimTensor)
                      else type(a)(_unwrap(t) for t in a) if isinstance(a, (list, tuple)) else a for a in args)


def _wrap(x: Any) -> Any:
    return SimTensor(x) if isinstance(x, torch.Tensor) and not isinstance(x, SimTensor) else x


def _unwrap(x: Any) -> Any:
    return x.payload if isinstance(x, SimTensor) else x


def _check_mixed(func: Any, args: Any, kwargs: dict[str, Any]) -> None:
    if func in _COPIES:
        return
    checked = _tensors((args[0], *args[2:]), kwargs) if func in _INDEXING else _tensors(args, kwargs)  # host indices
    host = [t for t in checked if not isinstance(t, SimTensor) and t.dim() > 0]
    if host:
        raise DeviceMixError(
            f"Expected all tensors to be on the same device, but found at least two devices, {DEVICE} and cpu! "
            f"(the simulated device, tests/device_sim.py: {func} was given a host tensor of shape "
            f"{tuple(host[0].shape)} beside tensors of the device)")


_ALIASING: dict[Any, bool] = {}  # by operation: whether it returns views or writes its arguments


def _aliases(func: Any) -> bool:
    found = _ALIASING.get(func)
    if found is None:
        found = _ALIASING[func] = bool(func.is_view or func._schema.is_mutable)
    return found


def _dispatch(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """Run `func` on the payload tensors after CUDA's device check; results on the device, aliasing as the CPU's."""
    _check_mixed(func, args, kwargs)
    if _counters:
        _count_waits(func, args, kwargs)
    if func is _aten._to_copy.default:  # .to() of a dtype (moves between host and device come through the mode)
        device = kwargs.get("device")
        out = func(_unwrap(args[0]), *args[1:], **{k: v for k, v in kwargs.items() if k != "device"})
        return SimTensor(out) if device is None or on_device(device) else out
    out = func(*_payloads(args), **{k: _unwrap(v) for k, v in kwargs.items()})
    if not _aliases(func):
        return _map(_wrap, out)
    first = next((t for t in _tensors(args, kwargs) if isinstance(t, SimTensor)), None)
    if func.is_view and torch.is_inference_mode_enabled() and first is not None and not first.is_inference():
        # a view of a normal tensor is a normal tensor, in inference mode too: its wrapper is made outside it
        with torch.inference_mode(False):
            return return_and_correct_aliasing(func, args, kwargs, _map(_wrap, out))
    return return_and_correct_aliasing(func, args, kwargs, _map(_wrap, out))


def _count_waits(func: Any, args: Any, kwargs: dict[str, Any]) -> None:
    if func is _aten._local_scalar_dense.default:
        _waited("item")
    elif func in _SIZED_BY_VALUES or (func is _aten.repeat_interleave.Tensor and kwargs.get("output_size") is None):
        _waited("sized")
    elif func in _INDEXING and any(isinstance(t, SimTensor) and t.dtype == torch.bool
                                   for t in args[1] if t is not None):
        _waited("sized")  # a boolean mask's indexing, or an assignment through one (`x[mask] = v`): nonzero first
    elif func is _aten.copy_.default and not isinstance(args[0], SimTensor) and isinstance(args[1], SimTensor):
        _waited(ASYNC if (args[2] if len(args) > 2 else kwargs.get("non_blocking", False)) else "copy")


class SimGenerator(_Generator):
    """A CPU generator for the simulated device: its `device` is `DEVICE`."""

    @property
    def device(self) -> torch.device:
        return DEVICE


class _GeneratorMeta(type(_Generator)):
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _Generator)

    def __subclasscheck__(cls, sub: Any) -> bool:
        return issubclass(sub, _Generator)


class _GeneratorFactory(_Generator, metaclass=_GeneratorMeta):
    """`torch.Generator` under the simulation: `torch.Generator(device="cpu:0")` is a SimGenerator; isinstance checks
    against it see every generator."""

    def __new__(cls, device: Any = None) -> Any:
        if on_device(device):
            return SimGenerator("cpu")
        return _Generator() if device is None else _Generator(device)


def _check_generators(args: Any, kwargs: dict[str, Any]) -> None:
    generators = [g for g in (*args, *kwargs.values()) if type(g) is _Generator or type(g) is SimGenerator]
    if not generators:
        return
    tensors = _tensors(args, kwargs)
    device = any(isinstance(t, SimTensor) for t in tensors)
    host = any(not isinstance(t, SimTensor) for t in tensors)
    for g in generators:
        if device and not isinstance(g, SimGenerator):
            raise RuntimeError(f"Expected a '{DEVICE}' device type for generator but found 'cpu' (the simulated "
                               "device, tests/device_sim.py)")
        if host and not device and isinstance(g, SimGenerator):
            raise RuntimeError(f"Expected a 'cpu' device type for generator but found '{DEVICE}' (the simulated "
                               "device, tests/device_sim.py)")


def _parse_to(args: Any, kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(device, dtype, memory format) of a `Tensor.to` call's arguments."""
    device, dtype, _, memory_format = torch._C._nn._parse_to(*args, **{k: v for k, v in kwargs.items() if k != "copy"})
    return device, dtype, memory_format


def _moved(x: torch.Tensor, dtype: Any, memory_format: Any) -> torch.Tensor:
    with torch._C.DisableTorchFunction():
        return x.to(dtype=dtype or x.dtype, memory_format=memory_format or torch.preserve_format, copy=True)


# the Tensor methods the mode answers itself are known by name: torch hands the mode what the attribute holds at call
# time, which a test or tool may have wrapped (tools/diffusion_host_ops.py counts `tolist` calls); the reads call
# torch's own methods, as they were at import
_READS = {name: getattr(torch.Tensor, name) for name in ("tolist", "data_ptr", "untyped_storage")}


class _Mode(TorchFunctionMode):
    """The Python-level calls a SimTensor's dispatch cannot see: factories given the device, moves between host and
    device (the CPU's kernels would treat `cpu:0` as `cpu` and move nothing), what reads a tensor's storage."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        _check_generators(args, kwargs)
        first = args[0] if args else None
        name = getattr(func, "__name__", "")
        if func is torch._has_compatible_shallow_copy_type and any(isinstance(a, SimTensor) for a in args):
            return False  # so that Module.to makes new parameters instead of swapping a SimTensor's data in
        if name == "cpu" and isinstance(first, SimTensor):
            _waited(ASYNC if kwargs.get("non_blocking") else "copy")
            return _moved(first.payload, None, None)
        if name == "to" and isinstance(first, torch.Tensor):
            device, dtype, memory_format = _parse_to(args[1:], kwargs)
            if isinstance(first, SimTensor) and device is not None and not on_device(device):
                _waited(ASYNC if kwargs.get("non_blocking") or (len(args) > 2 and args[2] is True) else "copy")
                return _moved(first.payload, dtype, memory_format)
            if not isinstance(first, SimTensor) and on_device(device):
                return SimTensor(_moved(first, dtype, memory_format))
            return func(*args, **kwargs)
        if name in _READS and isinstance(first, SimTensor):
            if name == "tolist":
                _waited("tolist")
            return _READS[name](first.payload, *args[1:], **kwargs)
        if on_device(kwargs.get("device")) and func is not torch._C._nn._parse_to:
            with torch._C.DisableTorchFunction():
                out = func(*args, **{**kwargs, "device": HOST})
            return _map(_wrap, out)
        return func(*args, **kwargs)


def compile_eagerly(model: Any = None, **kwargs: Any) -> Any:
    """`torch.compile` under the simulation: the function itself (dynamo does not trace SimTensors)."""
    if model is None:
        return lambda fn: fn
    return model


_installed: list[Any] = []


_bootstrap = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]


def _bootstrap_under_the_mode(thread: threading.Thread) -> None:
    """A thread's start under the simulation: torch's function modes are per thread (the server's engine thread)."""
    if not _installed:
        return _bootstrap(thread)
    with _Mode():
        return _bootstrap(thread)


def active() -> bool:
    """Whether the simulation is on (a test it cannot run skips with `pytest.mark.skipif(device_sim.active(), ...)`)."""
    return bool(_installed)


def compiling_tests() -> Any:
    """The mark of a test whose subject is torch.compile itself (traces, compiled versions, a compiler's failure):
    skipped under the simulation, which runs compiled functions eagerly. Made when a test module is imported, after
    the suite's conftest has installed the simulation."""
    import pytest

    return pytest.mark.skipif(active(), reason="torch.compile does not trace the simulated device's tensors "
                              "(tests/device_sim.py runs compiled functions eagerly)")


def install() -> None:
    """Turn the simulation on for this process (the suite's conftest, at import), in the threads it starts too:
    until `uninstall`."""
    if _installed:
        return
    mode = _Mode()
    mode.__enter__()
    _installed.append((mode, torch.Generator, torch.compile))
    torch.Generator = _GeneratorFactory
    torch.compile = compile_eagerly
    threading.Thread._bootstrap_inner = _bootstrap_under_the_mode  # type: ignore[attr-defined]


def uninstall() -> None:
    if not _installed:
        return
    mode, generator, compile_ = _installed.pop()
    torch.Generator = generator
    torch.compile = compile_
    threading.Thread._bootstrap_inner = _bootstrap  # type: ignore[attr-defined]
    mode.__exit__(None, None, None)


@contextlib.contextmanager
def simulated() -> Iterator[None]:
    """The simulation for a block (its own tests); a no-op where the suite already runs under it."""
    if active():
        yield
        return
    install()
    try:
        yield
    finally:
        uninstall()
