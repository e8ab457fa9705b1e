"""Kernel matching against the installed onnxruntime's own registry, and provider resolution."""
from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from onnx_bisect.coverage.inventory import take_inventory
from onnx_bisect.coverage.kernels import check_kernel, describe_provider
from onnx_bisect.coverage.providers import resolve_providers
from onnx_bisect.coverage.records import KernelVerdict, RegistryState
from onnx_bisect.coverage.validate import validate_model
from onnx_bisect.errors import UsageError

CPU = describe_provider("CPUExecutionProvider")


def one_node(op: str, in_types, out_type, opset: int = 17, domain: str = "", **attrs):
    """The inventory record of a one-node model ``op(inputs) -> y`` with the given element types."""
    names = [f"x{i}" for i in range(len(in_types))]
    node = helper.make_node(op, names, ["y"], name="n", domain=domain, **attrs)
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, [2, 2]) for n, t in zip(names, in_types)],
                              [helper.make_tensor_value_info("y", out_type, None)])
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 10
    _, inferred = validate_model(model)
    return take_inventory(inferred, original=model).nodes[0]


@pytest.mark.parametrize("op, types, out, opset, verdict", [
    ("Add", [T.FLOAT, T.FLOAT], T.FLOAT, 17, KernelVerdict.SUPPORTED),
    ("Trilu", [T.INT8], T.INT8, 17, KernelVerdict.NO_KERNEL_FOR_TYPES),
    ("Mul", [T.BFLOAT16, T.BFLOAT16], T.BFLOAT16, 17, KernelVerdict.NO_KERNEL_FOR_TYPES),
    ("MatMul", [T.FLOAT16, T.FLOAT16], T.FLOAT16, 17, KernelVerdict.FLOAT32_VIA_CAST),
    # Relu's function body needs opset 18: at 17 ONNX Runtime casts, at 20 it would inline
    ("Relu", [T.FLOAT16], T.FLOAT16, 17, KernelVerdict.FLOAT32_VIA_CAST),
    ("Gelu", [T.FLOAT16], T.FLOAT16, 20, KernelVerdict.EXPANDED),
    ("Add", [T.FLOAT, T.FLOAT], T.FLOAT, 6, KernelVerdict.NO_KERNEL_FOR_VERSION),
    ("LayerNormalization", [T.FLOAT16, T.FLOAT16], T.FLOAT16, 17, KernelVerdict.SUPPORTED),
])
def test_cpu_registry_verdicts(op, types, out, opset, verdict):
    node = one_node(op, types, out, opset)
    check = check_kernel(node, CPU)
    assert check.verdict is verdict, check


def test_type_constraint_is_bound_to_the_actual_dtype():
    node = one_node("Trilu", [T.INT8], T.INT8)
    assert dict(node.type_bindings) == {"T": ("tensor(int8)",)}
    assert "T=int8" in check_kernel(node, CPU).detail


def test_custom_domain_has_no_schema_and_no_kernel():
    node = one_node("Fancy", [T.FLOAT], T.FLOAT, domain="com.example")
    assert node.signature.since_version is None
    assert check_kernel(node, CPU).verdict is KernelVerdict.NO_KERNEL


def test_provider_states_come_from_the_build():
    assert CPU.state is RegistryState.KERNELS and CPU.kernel_count > 1000
    assert describe_provider("CUDAExecutionProvider").state is RegistryState.NOT_IN_BUILD
    assert describe_provider("AzureExecutionProvider").state is RegistryState.NO_STATIC_REGISTRY
    cuda = check_kernel(one_node("Add", [T.FLOAT, T.FLOAT], T.FLOAT), describe_provider("CUDAExecutionProvider"))
    assert cuda.verdict is KernelVerdict.NOT_ASSESSED and "not available in this build" in cuda.detail


def test_resolve_providers_appends_the_cpu_fallback_and_rejects_unknown_names():
    infos = resolve_providers(("CUDAExecutionProvider",))
    assert [p.name for p in infos] == ["CUDAExecutionProvider", "CPUExecutionProvider"] and infos[1].implicit
    with pytest.raises(UsageError, match="Did you mean 'CUDAExecutionProvider'"):
        resolve_providers(("CUDAExecutionProviderr",))


def test_inventory_reads_since_version_from_the_model_opset():
    assert one_node("Add", [T.FLOAT, T.FLOAT], T.FLOAT, opset=13).signature.since_version == 13
    assert one_node("Add", [T.FLOAT, T.FLOAT], T.FLOAT, opset=17).signature.since_version == 14
    assert isinstance(onnx.defs.onnx_opset_version(), int)
