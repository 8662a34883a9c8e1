"""Our fix of pypto 0.2.0's pass-verify setup, so a CPU run computes real numbers.

The problem (pypto 0.2.0, ``pypto/frontend/parser/entry.py``)
--------------------------------------------------------------
``JitCallableWrapper._setup_verify_data`` is what a jit call runs, before compiling,
when ``enable_pass_verify`` is on. It allocates fresh host buffers, "copies" the
caller's tensors into them with a device-to-host copy, and hands those buffers to the
verifier with ``pypto_impl.SetVerifyData``. On a build without CANN that copy does
nothing, and the Python objects owning the buffers are dropped as soon as the method
returns. The host interpreter therefore reads zeros (or freed memory), the tensor-graph
check fails, and at the end of the call the cost model copies the interpreter's
buffers back over the caller's tensors, zeroing the caller's inputs.

The fix
-------
On a CPU run the caller's tensors already live in host memory, so there is nothing
to stage. Our replacement registers the caller's own tensors (inputs and outputs, in
the kernel's signature order, exactly as the jit wrapper passes them) as the verify
inputs, together with any goldens set through ``pypto.set_verify_golden_data`` or
:func:`set_goldens`, and keeps every object involved referenced until the next call
(or :func:`release`). The calculator library comes from our cache
(:mod:`kernels.pypto_rt.calculator`) instead of a per-process rebuild.

It replaces that one private method, so it is pinned to pypto 0.2.0: :func:`install`
refuses any other version.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any, Sequence

from kernels.pypto_rt.errors import PyptoError

PINNED_VERSION = "0.2.0"

_installed = False
_held: list[Any] = []  # everything the verifier points into, for the duration of a call
_goldens: list[Any] | None = None  # torch tensors (or None per position) from set_goldens


def installed_version() -> str:
    """pypto's version. 0.2.0 has no ``pypto.__version__``, so ask the distribution metadata."""
    import pypto  # noqa: PLC0415

    version = getattr(pypto, "__version__", None)
    if version:
        return str(version)
    try:
        return metadata.version("pypto")
    except metadata.PackageNotFoundError:
        return "unknown"


def _check_version() -> None:
    version = installed_version()
    if version != PINNED_VERSION:
        raise PyptoError(
            f"kernels.pypto_rt.verify_fix patches a private method of pypto {PINNED_VERSION}, "
            f"but pypto {version} is installed; install pypto=={PINNED_VERSION} or port the fix")


def _device_datas(pto_tensors: Sequence[Any]) -> list[Any]:
    from pypto import pypto_impl  # noqa: PLC0415

    datas = []
    for tensor in pto_tensors:
        if tensor.ori_shape is None:
            raise PyptoError(f"tensor {tensor.name!r} has no ori_shape; cannot register it for verify")
        datas.append(pypto_impl.DeviceTensorData(tensor.dtype, tensor.data_ptr, list(tensor.ori_shape)))
    return datas


def _golden_datas() -> tuple[list[Any], list[Any]]:
    """Golden DeviceTensorData list and the objects that own their memory."""
    import pypto  # noqa: PLC0415
    from pypto import pypto_impl  # noqa: PLC0415
    from pypto.runtime import _pto_verify_datas  # noqa: PLC0415

    if _goldens is None:  # whatever pypto.set_verify_golden_data registered
        return list(_pto_verify_datas.get_data()), [_pto_verify_datas._ori_data]
    datas, owners = [], []
    for golden in _goldens:
        if golden is None:  # pypto's "do not compare this position" placeholder
            datas.append(pypto_impl.DeviceTensorData(pypto.DT_FP16, 0, [0, 0]))
            continue
        pto = pypto.from_torch(golden.contiguous())
        owners.extend([golden, pto])
        datas.append(pypto_impl.DeviceTensorData(pto.dtype, pto.data_ptr, list(pto.ori_shape)))
    return datas, owners


def _setup_verify_data(pto_tensors) -> None:
    """Replacement for ``JitCallableWrapper._setup_verify_data`` (a staticmethod)."""
    global _goldens
    import pypto  # noqa: PLC0415
    from pypto import pypto_impl  # noqa: PLC0415

    from kernels.pypto_rt import calculator  # noqa: PLC0415

    if not pypto.get_verify_options().get("enable_pass_verify"):
        return
    for tensor in pto_tensors:
        device = getattr(tensor, "device", None)
        if device is not None and getattr(device, "type", "cpu") != "cpu":
            raise PyptoError("verify_fix only handles CPU tensors (the SIM run of a CPU-only machine)")
    calculator.ensure_loaded()
    tensor_datas = _device_datas(pto_tensors)
    golden_datas, golden_owners = _golden_datas()
    _goldens = None
    _held[:] = [list(pto_tensors), tensor_datas, golden_datas, golden_owners]
    pypto_impl.SetVerifyData(tensor_datas, [], golden_datas)


def set_goldens(goldens: Sequence[Any] | None) -> None:
    """Goldens for the next jit call: one torch CPU tensor or None per kernel tensor parameter.

    A golden must have its output's dtype and shape. Positions set to None are not compared.
    """
    global _goldens
    _goldens = None if goldens is None else list(goldens)


def release() -> None:
    """Drop the references kept for the last call (call it after the kernel returned)."""
    global _goldens
    _held.clear()
    _goldens = None


def install() -> None:
    """Replace ``JitCallableWrapper._setup_verify_data`` with our fix (idempotent)."""
    global _installed
    if _installed:
        return
    _check_version()
    from pypto.frontend.parser.entry import JitCallableWrapper  # noqa: PLC0415

    if not hasattr(JitCallableWrapper, "_setup_verify_data"):
        raise PyptoError("pypto.frontend.parser.entry.JitCallableWrapper has no _setup_verify_data; "
                         "the verify fix does not fit this pypto build")
    JitCallableWrapper._setup_verify_data = staticmethod(_setup_verify_data)
    _installed = True


def is_installed() -> bool:
    return _installed


install()  # importing this module applies the fix (and checks the pinned version)
