"""lpjax.kernels._common: which backend ``impl`` selects for the target GPU, and the abstract GPUs lowering targets."""

from __future__ import annotations

import jax
import pytest

from lpjax.kernels import _common
from lpjax.kernels._common import (
    GPU_TARGETS,
    abstract_gpu,
    is_hopper,
    resolve_interpret,
    select_backend,
    target_device_kind,
)
from tests.kernels.helpers import ON_GPU

HERE = jax.devices()[0].device_kind if ON_GPU else None
"""The target device kind without an abstract GPU: this machine's GPU, or ``None`` on a CPU."""


def _select(impl, interpret=False):
    return select_backend(impl, kernel="k", interpret=interpret)


@pytest.mark.parametrize(
    "kind, hopper",
    [
        ("NVIDIA H100 80GB HBM3", True),
        ("NVIDIA H200", True),
        ("NVIDIA GH200 480GB", True),
        ("NVIDIA H800", True),
        ("NVIDIA H20", True),
        ("NVIDIA A100-SXM4-80GB", False),
        ("NVIDIA L4", False),
        ("NVIDIA B200", False),
        ("NVIDIA GeForce RTX 4090", False),
        ("cpu", False),
        (None, False),
    ],
)
def test_is_hopper(kind, hopper):
    assert is_hopper(kind) is hopper


def test_abstract_gpu_sets_the_target_device():
    assert target_device_kind() == HERE
    for arch, (kind, _) in GPU_TARGETS.items():
        with abstract_gpu(arch):
            assert target_device_kind() == kind
    assert target_device_kind() == HERE
    with pytest.raises(ValueError, match="arch must be one of"):
        abstract_gpu("sm_75")


def test_default_interpret_compiles_for_an_abstract_gpu():
    """interpret=None: interpret mode on this CPU, compiled under an abstract GPU (the lowering is for that GPU);
    an explicit value is kept."""
    assert resolve_interpret(None) == (HERE is None and jax.default_backend() == "cpu")
    for arch in GPU_TARGETS:
        with abstract_gpu(arch):
            assert resolve_interpret(None) is False
            assert resolve_interpret(True) is True
    assert resolve_interpret(False) is False


def test_default_backend_follows_the_target_gpu(monkeypatch):
    monkeypatch.setattr(_common, "TRITON_AVAILABLE", True)
    # Here: on a CPU Triton's kernel (in interpret mode), on a GPU the one that suits it.
    assert _select("pallas", interpret=True) == ("mosaic_gpu" if is_hopper(HERE) else "triton")
    with abstract_gpu("sm_90"):
        assert _select("pallas") == "mosaic_gpu"
        assert _select("triton") == "triton"
    for arch in ("sm_89", "sm_80"):
        with abstract_gpu(arch):
            assert _select("pallas") == "triton"
            assert _select("mosaic_gpu", interpret=True) == "mosaic_gpu"  # the interpreter has no arch
            with pytest.raises(ValueError, match="needs an sm_90 GPU"):
                _select("mosaic_gpu")
    for impl in ("reference", "mosaic_gpu", "triton"):
        assert _select(impl, interpret=True) == impl
    with pytest.raises(ValueError, match="impl must be one of"):
        _select("cuda")


def test_without_triton_mosaic_gpu_is_the_only_pallas_backend(monkeypatch):
    monkeypatch.setattr(_common, "TRITON_AVAILABLE", False)
    assert _select("pallas", interpret=True) == "mosaic_gpu"
    with abstract_gpu("sm_90"):
        assert _select("pallas") == "mosaic_gpu"
    with pytest.raises(ValueError, match="no longer ships Pallas' Triton backend"):
        _select("triton", interpret=True)
