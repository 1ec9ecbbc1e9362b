"""A stated time model of a named GPU: a traced step's seconds on a GPU this machine lacks, for
planning a CUDA run from a machine without one. Nothing is replayed or measured: each figure
is a datasheet's or one of the model's assumptions below, so its answers are modelled, not
replayed.

The model's assumptions (a model, not a measurement):

- an op with a FLOP formula (a convolution, a matrix product, attention) reaches
  :data:`COMPUTE_EFFICIENCY` of its dtype's dense peak (:meth:`GpuModel.peak`);
- every op moves the bytes of its arguments and output at :data:`BANDWIDTH_EFFICIENCY` of the
  memory bandwidth; norms (replayed ops without a FLOP formula) are priced so;
- each op dispatched costs at least :data:`LAUNCH` seconds: eager PyTorch's launch and dispatch
  on the host, which a GPU's kernel overlaps (a replayed op costs the longest of the three);
- every other op (the trace keeps their bytes summed, ``StepWork.bytes``) costs a launch plus
  its bytes at the bandwidth;
- each checkpointed segment costs :data:`SEGMENT` more on the host, and each op that passes
  checkpoint's hooks or a selective policy :data:`HOOK` more;
- float16 and bfloat16 run at the tensor cores' peak; float32 convolutions at TF32's (cuDNN
  allows TF32 for convolutions by default, ``torch.backends.cudnn.allow_tf32``), float32 matrix
  products at float32's (``torch.backends.cuda.matmul.allow_tf32`` is off by default).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry

from volseg.speed.step_time import Replay, StepWork, TensorSpec, spec_bytes, spec_of
from volseg.utils.errors import UserInputError
from volseg.utils.units import GIB

#: share of the dense peak a convolution or matrix product reaches (cuDNN on 3D shapes)
COMPUTE_EFFICIENCY = 0.5
#: share of the memory bandwidth an elementwise op or norm reaches
BANDWIDTH_EFFICIENCY = 0.8
#: least seconds an op costs: eager PyTorch's per-op launch and dispatch on the host
LAUNCH = 10e-6
#: seconds a checkpointed segment adds on the host (checkpoint's Python bookkeeping)
SEGMENT = 5 * LAUNCH
#: seconds each op in a checkpointed segment or seen by a selective policy adds (a Python hook)
HOOK = 0.3 * LAUNCH


@dataclass(frozen=True)
class GpuModel:
    """One GPU's datasheet figures, dense (without structured sparsity): ``memory`` (bytes),
    peaks in FLOP/s for ``fp32`` (CUDA cores), ``tf32``, ``fp16`` and ``bf16`` (tensor cores,
    float32 accumulation), ``bandwidth`` (bytes/s) and ``aliases``: names
    ``torch.cuda.get_device_name`` reports for it that do not hold ``name``."""

    name: str
    memory: int
    fp32: float
    tf32: float
    fp16: float
    bf16: float
    bandwidth: float
    aliases: tuple[str, ...] = ()

    def peak(self, dtype: torch.dtype | None, convolution: bool) -> float:
        """FLOP/s an op of ``dtype`` runs at, dense (a ``convolution`` of float32: TF32)."""
        if dtype == torch.float16:
            return self.fp16
        if dtype == torch.bfloat16:
            return self.bf16
        # float32 and anything else (float64 is not modelled: no step here runs in it)
        return self.tf32 if convolution else self.fp32


def _gpu(
    name: str,
    gib: float,
    fp32: float,
    tf32: float,
    fp16: float,
    bf16: float,
    tbs: float,
    *aliases: str,
) -> GpuModel:
    """A row as a datasheet gives it: memory in GiB (a datasheet's GB of GPU memory are binary:
    an H200's 141 GB show as 143,771 MiB in nvidia-smi), peaks in TFLOPS, bandwidth in TB/s."""
    tflops = (fp32 * 1e12, tf32 * 1e12, fp16 * 1e12, bf16 * 1e12)
    return GpuModel(name, int(gib * GIB), *tflops, tbs * 1e12, aliases)


#: known GPUs, from their vendors' datasheets (dense: the sparse figures halved); a GPU without
#: TF32 (Volta, Turing) has its float32 peak as ``tf32``, one without bfloat16 its float32 peak
#: as ``bf16``. Order matters: a part of a name that several rows hold picks the first.
GPUS: tuple[GpuModel, ...] = (
    # H100 SXM5: fp32 67 TFLOPS, tf32 989 / bf16 and fp16 1979 with sparsity, 3.35 TB/s, 80 GB
    _gpu("H100 SXM", 80, 67, 495, 989, 989, 3.35, "H100 80GB HBM3"),
    # H100 PCIe: fp32 51, tf32 756 / bf16 and fp16 1513 with sparsity, 2.0 TB/s, 80 GB
    _gpu("H100 PCIe", 80, 51, 378, 756, 756, 2.0),
    # H200 SXM: H100 SXM's compute, 4.8 TB/s, 141 GB
    _gpu("H200", 141, 67, 495, 989, 989, 4.8),
    # A100 80GB SXM4: fp32 19.5, tf32 156, bf16 and fp16 312 dense, 2,039 GB/s (PCIe: 1,935)
    _gpu("A100 80GB SXM", 80, 19.5, 156, 312, 312, 2.039, "A100-SXM4-80GB", "A100 80GB PCIe"),
    # A100 40GB (SXM4 and PCIe): the same compute, 1,555 GB/s
    _gpu("A100 40GB", 40, 19.5, 156, 312, 312, 1.555, "A100-SXM4-40GB", "A100-PCIE-40GB"),
    # L40S: fp32 91.6, tf32 183, bf16 and fp16 362 dense, 864 GB/s, 48 GB
    _gpu("L40S", 48, 91.6, 183, 362, 362, 0.864),
    # L4: fp32 30.3, tf32 120 / bf16 and fp16 242 with sparsity, 300 GB/s, 24 GB
    _gpu("L4", 24, 30.3, 60, 121, 121, 0.3),
    # A10: fp32 31.2, tf32 62.5, bf16 and fp16 125 dense, 600 GB/s, 24 GB
    _gpu("A10", 24, 31.2, 62.5, 125, 125, 0.6),
    # RTX 4090 (Ada whitepaper): fp32 82.6, tf32 82.6, fp16 and bf16 with fp32 accumulation
    # 165.2 dense (GeForce: half the fp16-accumulation rate), 1,008 GB/s, 24 GB
    _gpu("RTX 4090", 24, 82.6, 82.6, 165.2, 165.2, 1.008),
    # RTX 3090 (Ampere GA102 whitepaper): fp32 35.6, tf32 35.6, fp16 and bf16 with fp32
    # accumulation 71 dense, 936 GB/s, 24 GB
    _gpu("RTX 3090", 24, 35.6, 35.6, 71, 71, 0.936),
    # V100 SXM2: fp32 15.7, fp16 tensor 125, no TF32 or bfloat16 units, 900 GB/s, 32 GB
    _gpu("V100", 32, 15.7, 15.7, 125, 15.7, 0.9),
    # T4: fp32 8.1, fp16 tensor 65, no TF32 or bfloat16 units, 320 GB/s, 16 GB
    _gpu("T4", 16, 8.1, 8.1, 65, 8.1, 0.32),
)
DEFAULT = GPUS[0]


def _key(name: str) -> str:
    """``name`` lower case without spaces, dashes or underscores (``a100-sxm4`` = ``A100 SXM4``)."""
    return re.sub(r"[\s_-]+", "", name).lower()


def gpu_model(name: str | None) -> tuple[GpuModel, str]:
    """The model of the GPU ``memory.gpu`` names, and a line saying which: the row of that name
    or alias (any case, spaces, dashes and underscores ignored), else the first row in
    :data:`GPUS` holding it as a part (``a100``: the A100 80GB SXM; ``h100``: the H100 SXM), else
    the row whose longest name it holds (a device name as torch reports it, ``Tesla T4``);
    ``None``: the H100 SXM, said to be assumed. An unknown name raises :class:`UserInputError`."""
    if name is None:
        return DEFAULT, f"no memory.gpu: the {DEFAULT.name} model assumed; memory.gpu names another"
    query = _key(str(name))
    names = [(_key(n), gpu) for gpu in GPUS for n in (gpu.name, *gpu.aliases)]
    exact = [gpu for key, gpu in names if key == query]
    part = [gpu for key, gpu in names if query and query in key]
    held = [(key, gpu) for key, gpu in names if key in query]
    if exact or part:
        gpu = (exact or part)[0]
    elif held:
        gpu = max(held, key=lambda row: len(row[0]))[1]  # the most specific name
    else:
        known = ", ".join(gpu.name for gpu in GPUS)
        raise UserInputError(f"memory.gpu={name}: no GPU model of that name; known: {known}")
    return gpu, f"memory.gpu={name}: the {gpu.name} model"


def _meta(value: Any) -> Any:
    """:func:`~volseg.speed.step_time.spec_of`'s ``value`` with each spec a meta tensor (no data)
    and each tuple a list, as the op took it."""
    if isinstance(value, TensorSpec):
        return torch.empty_strided(value.shape, value.stride, dtype=value.dtype, device="meta")
    if isinstance(value, tuple):
        return [_meta(v) for v in value]
    return value


def _dtype(spec: Any) -> torch.dtype | None:
    """The dtype of the first floating-point tensor in ``spec`` (the op's input), or ``None``."""
    if isinstance(spec, TensorSpec):
        return spec.dtype if spec.dtype.is_floating_point else None
    if isinstance(spec, tuple):
        return next((d for d in map(_dtype, spec) if d is not None), None)
    return None


@functools.cache
def op_work(op: Replay) -> tuple[int, int]:
    """A replayed ``op``'s FLOPs (torch's formula; 0 where it has none: a norm) and the bytes of
    its arguments and output (its output computed on meta tensors)."""
    func, args, kwargs = op
    meta_args, meta_kwargs = _meta(args), dict(_meta(kwargs))
    try:
        out = func(*meta_args, **meta_kwargs)
    except (RuntimeError, NotImplementedError):
        # an op without a meta kernel: its arguments' bytes only, no FLOPs
        return 0, spec_bytes(args) + spec_bytes(kwargs)
    formula = flop_registry.get(func.overloadpacket)
    # the formulas are wrapped by flop_counter's shape_wrapper: (*args, out_val=out, **kwargs)
    flops = 0 if formula is None else int(formula(*meta_args, out_val=out, **meta_kwargs))
    return flops, spec_bytes(args) + spec_bytes(kwargs) + spec_bytes(spec_of(out))


def op_seconds(op: Replay, gpu: GpuModel) -> float:
    """One run of a replayed ``op`` on ``gpu`` (seconds): the longest of its FLOPs at its peak,
    its bytes at the bandwidth, and a launch."""
    func, args, _ = op
    flops, nbytes = op_work(op)
    peak = gpu.peak(_dtype(args), "conv" in func.overloadpacket.__name__)
    return max(
        flops / (peak * COMPUTE_EFFICIENCY),
        nbytes / (gpu.bandwidth * BANDWIDTH_EFFICIENCY),
        LAUNCH,
    )


def modelled_seconds(work: StepWork, gpu: GpuModel) -> float:
    """The traced step ``work``'s time on ``gpu`` as the model prices it (seconds): each replayed
    op at :func:`op_seconds`; every other op a launch, their ``work.bytes`` at the bandwidth
    (added: their bytes one by one are not traced, so this is the upper bound of each taking
    its longer, off by at most a launch an op); each segment and hooked op its host cost."""
    replayed = sum(n * op_seconds(op, gpu) for op, n in work.replayed.items())
    others = work.calls - sum(work.replayed.values())  # work.calls counts replayed ops too
    hooked = work.segment_calls + work.selective_calls
    host = others * LAUNCH + work.segments * SEGMENT + hooked * HOOK
    return replayed + host + work.bytes / (gpu.bandwidth * BANDWIDTH_EFFICIENCY)
