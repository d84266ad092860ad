"""lpjax.nn.matmul_choice: what matmul_impl="auto" resolves to per platform, GPU, dtype and shape, and that the table is
the measurement it names."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.kernels import describe_lowering
from lpjax.kernels import lower_for_cuda
from lpjax.nn import Dense
from lpjax.nn.dense import MATMUL_IMPLS, check_dense_options
from lpjax.nn.matmul_choice import HOPPER, MatmulTable, Measurement, resolve_matmul_impl, shape_distance, table_for
from lpjax.precision import get_policy

H100, H200, A100, L4 = "NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA L4"
SAC, PREFILL, DECODE = (1024, 1024, 1024), (4096, 4096, 4096), (16, 4096, 4096)
RESULTS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "kernels_gpu.json"


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float8_e4m3fn"])
def test_auto_is_xla_off_gpus(platform, dtype):
    for shape in (SAC, PREFILL, DECODE, (3, 17, 6)):
        assert resolve_matmul_impl("auto", dtype, shape, platform=platform) == "xla"


@pytest.mark.parametrize("device_kind", [H100, H200, "NVIDIA GH200 480GB"])
def test_hopper_uses_xla_for_half_and_the_kernel_for_fp8(device_kind):
    """The H100 table: XLA's bf16 dot is faster at every measured shape, the fp8 kernel faster than the reference;
    float16 follows bfloat16's rows, float32 has no kernel. Every Hopper GPU uses the table."""
    for shape in (SAC, PREFILL, DECODE, (64, 2048, 8192), (1024, 17, 1024), (1, 1, 1)):
        for platform in ("gpu", "cuda"):
            resolve = lambda dtype: resolve_matmul_impl(
                "auto", dtype, shape, platform=platform, device_kind=device_kind
            )
            assert resolve(jnp.bfloat16) == resolve("float16") == resolve(np.float32) == "xla"
            assert resolve(jnp.float8_e4m3fn) == "pallas"
        assert resolve_matmul_impl("auto", "float8_e4m3fn", shape, device_kind=device_kind) == "pallas"


@pytest.mark.parametrize("device_kind", [A100, L4, "NVIDIA B200", None])
def test_unmeasured_gpus_keep_xla(device_kind):
    assert table_for(device_kind) is None
    for dtype in ("bfloat16", "float16", "float8_e4m3fn"):
        assert resolve_matmul_impl("auto", dtype, SAC, platform="gpu", device_kind=device_kind) == "xla"


@pytest.mark.parametrize("impl", ["xla", "pallas", "reference"])
def test_an_explicit_matmul_impl_is_kept(impl):
    assert resolve_matmul_impl(impl, "float8_e4m3fn", SAC, platform="gpu", device_kind=H100) == impl
    assert resolve_matmul_impl(impl, "bfloat16", DECODE, platform="cpu") == impl


def test_the_nearest_measured_shape_decides_and_disagreeing_ties_keep_xla():
    table = MatmulTable(
        device="test GPU",
        applies_to="test",
        jax="0",
        date="-",
        source="-",
        measurements=(
            Measurement("bfloat16", (256, 256, 256), {"xla": 1.0, "pallas": 2.0}, "ms"),
            Measurement("bfloat16", (4096, 4096, 4096), {"xla": 2.0, "pallas": 1.0}, "ms"),
        ),
    )
    assert table.choose("bfloat16", (512, 512, 512)) == "xla"  # log2 distance 1.7 vs 5.2
    assert table.choose("bfloat16", (2048, 2048, 4096)) == "pallas"  # 5.9 vs 1.4
    assert table.choose("bfloat16", (1024, 1024, 1024)) == "xla"  # equidistant (3.5): they disagree
    assert table.choose("float16", SAC) is None  # no row, no alias
    assert table.matches("a test GPU") and not table.matches(H100)


def test_shape_distance_is_euclidean_in_log2_and_checks_shapes():
    assert shape_distance((16, 4096, 4096), (16, 4096, 4096)) == 0.0
    assert shape_distance((1, 1, 1), (2, 4, 8)) == pytest.approx(np.sqrt(1 + 4 + 9))
    for bad in ((0, 4, 4), (4, 4)):
        with pytest.raises(ValueError, match="three positive sizes"):
            shape_distance(bad, SAC)


def test_the_hopper_table_is_the_recorded_measurement():
    """Every row is the number benchmarks/results/kernels_gpu.json records for it (H100, jax 0.11.2)."""
    recorded = json.loads(RESULTS.read_text())
    assert recorded["device"] == HOPPER.device and recorded["jax"] == HOPPER.jax
    shapes = {tuple(v): k for k, v in {"sac": SAC, "llm_prefill": PREFILL, "llm_decode": DECODE}.items()}
    for row in HOPPER.measurements:
        if row.dtype == "bfloat16":
            entry = recorded["kernels"]["fp16_matmul[bf16]"][shapes[row.shape]]
            assert row.ms["xla"] == pytest.approx(entry["xla_dot[bf16]"]["ms_per_product"], abs=1e-6)
            assert row.ms["pallas"] == pytest.approx(entry["kernel[mosaic_gpu]"]["ms_per_product"], abs=1e-6)
        else:
            update = recorded["sac_update"]
            assert row.ms["xla"] == pytest.approx(update["fp8 W8A8, XLA reference"]["gpu_ms"], abs=1e-6)
            assert row.ms["pallas"] == pytest.approx(update["fp8 W8A8, Pallas"]["gpu_ms"], abs=1e-6)


def test_auto_is_the_default_and_valid_for_every_matmul_dtype():
    assert MATMUL_IMPLS[0] == "auto" and Dense(4).matmul_impl == "auto"
    for policy in ("fp32", "fp16", "bf16", "fp8"):
        check_dense_options(get_policy(policy), "auto", "relu")
    with pytest.raises(ValueError, match=r"matmul_impl must be one of \('auto', 'xla', 'pallas', 'reference'\)"):
        check_dense_options(get_policy("fp32"), "fastest", "none")


@pytest.mark.parametrize("policy", ["fp32", "bf16", "fp8"])
def test_auto_on_this_cpu_is_xla_bit_for_bit(policy):
    x = jax.random.normal(jax.random.key(0), (6, 256))
    layer = Dense(128, policy, activation="relu")
    params = layer.init(jax.random.key(1), x)
    np.testing.assert_array_equal(
        np.asarray(layer.apply(params, x), np.float32),
        np.asarray(Dense(128, policy, "xla", activation="relu").apply(params, x), np.float32),
    )


@pytest.mark.parametrize(
    "policy, impl, pallas_calls",
    [("bf16", "auto", 0), ("fp8", "auto", 1), ("bf16", "pallas", 1), ("fp8", "xla", 0)],
)
def test_auto_lowers_for_an_abstract_h100_as_the_table_says(policy, impl, pallas_calls):
    """Lowered ahead of time for an H100 (no GPU here), "auto" resolves there: XLA's dot for bf16, the Mosaic GPU
    fp8 kernel for fp8 (the explicit impls are the control)."""
    x = jnp.ones((64, 256), jnp.float32)
    layer = Dense(256, policy, impl)
    p = layer.init(jax.random.key(0), x)["params"]
    apply = lambda kernel, bias, x: layer.apply({"params": {"kernel": kernel, "bias": bias}}, x)
    calls = describe_lowering(lower_for_cuda(apply, p["kernel"], p["bias"], x))
    assert calls["mosaic_gpu_calls"] == pallas_calls and calls["triton_calls"] == 0
