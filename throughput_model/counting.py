"""Per-operator accounting of one training step: FLOPs, bytes moved and op counts by class.

Why a dispatch mode of our own: ``torch.utils.flop_counter.FlopCounterMode`` counts
only matmul/conv/attention FLOPs, so element-wise and normalisation work (which
dominates small and memory-bound models) would count as zero. :class:`StepAccountant`
sees every aten op below autograd, gives it a class (:data:`OP_CLASSES`), takes
its FLOPs from PyTorch's own ``flop_registry`` and its bytes from the tensors it
reads and writes (view ops move nothing and are skipped).

The same mode, given a clock, times each op on real tensors: the profiler that
builds the corpus and the feature extractor that runs on meta tensors therefore
classify ops by one and the same rule.

Fused regions: on a real device PyTorch runs ``scaled_dot_product_attention`` and
RNNs as fused kernels, while on the meta device they decompose into dozens of
matmuls and element-wise ops. :class:`FusedRegions` (a torch-function mode) marks
everything inside such a call, and the autograd nodes it created, with the
region's class, so its time and its counts land in one class ("attention", "rnn")
whichever way the device ran it; the class's own coefficients absorb the difference.
"""
from __future__ import annotations

import copy
import functools
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

try:  # PyTorch's own FLOP formulas (matmul, conv, attention); absent: FLOPs cannot be counted.
    from torch.utils.flop_counter import flop_registry as _FLOP_REGISTRY
except ImportError:  # pragma: no cover - every supported torch has it
    _FLOP_REGISTRY = {}

OP_CLASSES: tuple[str, ...] = (
    "gemm", "conv", "conv_depthwise", "attention", "lstm", "rnn", "norm", "pool", "reduction", "movement",
    "embedding", "elementwise", "math", "random", "optimizer",
)
"""Operator classes. Each gets its own bytes, op-count and large-allocation features (and FLOPs
for :data:`COMPUTE_CLASSES`) and its own learned coefficients. ``attention``, ``lstm`` and
``rnn`` (GRU and plain RNN cells) are fused regions: LSTMs apart because CPUs and GPUs alike
run them as one fused kernel, while a CPU runs GRUs step by step; ``math`` is element-wise work that is not simple arithmetic (division, roots,
exponentials, activations with transcendentals); ``random`` draws random numbers (dropout);
``embedding`` is table lookups (``nn.Embedding``, ``nn.EmbeddingBag``) and their dense or sparse
gradients; ``optimizer`` is every op of ``optimizer.step()``."""

COMPUTE_CLASSES = ("gemm", "conv", "conv_depthwise", "attention", "lstm", "rnn")
"""Classes with FLOPs (PyTorch's FLOP formulas cover only these); an op of these without a
formula is reported."""
FUSED_CLASSES = ("attention", "lstm", "rnn")
SHAPE_CLASSES = ("conv", "conv_depthwise")
"""Classes decided by an op's arguments, not its name."""
LOWERED_CLASSES = ("conv_depthwise",)
"""Classes whose ops a CPU may run GEMM-lowered (im2col, then a GEMM): they also count ``lowered``."""

DIRECT_DEPTHWISE_FORWARD_WIDTH_UNROLL = {"AVX512": 6, "AVX2": 4}
"""Outputs along the width that oneDNN's direct depthwise forward kernel (``jit_dw``, x86) computes
at once, by the CPU capability torch reports (3 below AVX2: SSE4.1's). The kernel takes a
convolution only when its padding on either side of the width is no wider than that
(``jit_uni_dw_conv_fwd_kernel::init_conf``): a "same"-padded kernel of up to 13 taps on AVX-512,
up to 9 on AVX2; wider ones run GEMM-lowered (``gemm:jit``: im2col into a column buffer of kernel
taps x outputs, then one small GEMM per channel). Read off ``ONEDNN_VERBOSE=1`` with torch 2.13: a
3x3 (MobileNet) depthwise convolution runs direct throughout, a 15-tap 1-D one (QuartzNet)
lowered, at a fraction of the direct kernel's speed per FLOP that FLOPs and bytes alone cannot
tell apart; a 13-tap one direct on an AVX-512 host and lowered on an AVX2 one."""
DIRECT_DEPTHWISE_WEIGHT_GRAD_MAX_TAPS = 3
"""Widest kernel (taps along one dimension) whose weight gradient oneDNN's direct depthwise kernel
takes, whatever the CPU; wider ones run GEMM-lowered. The gradient of the input always runs direct."""

ALLOC_LARGE_BYTES = 4 * 1024 * 1024
"""Outputs at least this large that an op allocates (not in place) are counted as ``alloc``:
on a CPU a fresh large buffer costs page faults as well as bandwidth."""

PHASES = ("forward", "backward", "optimizer")

_GEMM = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "_addmm_activation", "mv", "addmv", "dot", "vdot",
         "matmul", "linear", "_scaled_mm", "addr", "outer", "einsum"}
_MOVEMENT = {"cat", "stack", "copy", "clone", "_to_copy", "index", "index_put", "_index_put_impl", "gather", "scatter",
             "scatter_add", "constant_pad_nd", "repeat", "flip", "roll", "slice_backward", "select_backward",
             "as_strided_scatter", "slice_scatter", "select_scatter", "masked_select", "take", "reflection_pad1d",
             "reflection_pad2d", "replication_pad1d", "replication_pad2d", "_unsafe_index", "index_copy",
             "unfold_backward", "col2im", "im2col", "contiguous", "index_select", "index_add"}
_EMBEDDING_LOOKUPS = {"embedding", "_embedding_bag", "_embedding_bag_forward_only", "embedding_bag"}
"""Table lookups: they read the rows their indices name, never the whole table."""
_EMBEDDING_SPARSE_GRADIENTS = {"embedding_sparse_backward", "_embedding_bag_sparse_backward"}
_EMBEDDING = _EMBEDDING_LOOKUPS | _EMBEDDING_SPARSE_GRADIENTS | {
    "embedding_dense_backward", "embedding_backward", "_embedding_bag_backward", "_embedding_bag_dense_backward",
    "_embedding_bag_per_sample_weights_backward", "embedding_renorm"}
_REDUCTION = {"sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "var", "std", "var_mean",
              "std_mean", "prod", "logsumexp", "cumsum", "linalg_vector_norm", "norm", "_softmax",
              "_log_softmax", "_safe_softmax", "_softmax_backward_data", "_log_softmax_backward_data",
              "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward",
              "mse_loss", "mse_loss_backward", "binary_cross_entropy", "binary_cross_entropy_backward",
              "binary_cross_entropy_with_logits", "all", "any", "topk", "sort"}
_MATH = {"sqrt", "rsqrt", "div", "reciprocal", "exp", "expm1", "exp2", "log", "log1p", "log2", "log10", "tanh",
         "tanh_backward", "sigmoid", "sigmoid_backward", "gelu", "gelu_backward", "erf", "erfc", "erfinv", "silu",
         "silu_backward", "softplus", "softplus_backward", "pow", "sin", "cos", "tan", "atan", "atan2", "elu",
         "elu_backward", "mish", "mish_backward", "logit", "logit_backward", "addcdiv", "remainder", "fmod",
         "lgamma", "digamma", "_log_softmax_backward", "glu", "glu_backward"}
_RANDOM = {"bernoulli", "rand", "rand_like", "randn", "randn_like", "normal", "uniform", "randint", "randint_like",
           "randperm", "exponential", "multinomial", "native_dropout", "random", "geometric", "cauchy",
           "log_normal"}
_PROJECTIONS = {"mm", "addmm", "linear", "_addmm_activation"}
"""Inside an attention region, these 2-D matmuls are projections and stay in ``gemm``."""
_EMPTY = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_local_scalar_dense",
          "lift_fresh", "scalar_tensor", "detach", "alias"}
"""Ops that allocate or alias without touching memory: counted as ops with zero bytes."""
_VIEW_LIKE = {"_unsafe_view", "_reshape_alias", "lift_fresh", "alias", "detach"}
"""Ops without a view annotation in their schema that nevertheless move no data."""


def op_name(func: Any) -> str:
    """The aten op's base name: ``aten.addmm.default`` -> ``addmm``."""
    packet = getattr(func, "overloadpacket", None)
    return getattr(packet, "__name__", str(func))


def is_view(func: Any) -> bool:
    """True for ops that only alias their input (view, transpose, expand, split...): no data moves."""
    if op_name(func) in _VIEW_LIKE:
        return True
    schema = getattr(func, "_schema", None)
    if schema is None:
        return False
    return any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


def _conv_groups(name: str, args: tuple) -> int:
    """The ``groups`` argument of aten.convolution / convolution_backward (positional)."""
    index = {"convolution": 8, "_convolution": 8, "convolution_backward": 9}.get(name)
    if index is not None and len(args) > index and isinstance(args[index], int):
        return args[index]
    return 1


def _is_depthwise(name: str, args: tuple) -> bool:
    """A grouped convolution with one input channel per group: no GEMM inside, a few FLOPs per
    byte, so it runs at a small fraction of a dense convolution's rate on every device."""
    weight = args[2] if name == "convolution_backward" else args[1] if len(args) > 1 else None
    return _conv_groups(name, args) > 1 and isinstance(weight, torch.Tensor) and weight.dim() > 2 \
        and weight.shape[1] == 1


def classify(func: Any, args: tuple) -> str:
    """The operator class of one aten op, outside fused regions and the optimizer."""
    name = op_name(func)
    if "convolution" in name or name.startswith(("conv", "_slow_conv", "mkldnn_conv", "thnn_conv")):
        return "conv_depthwise" if _is_depthwise(name, args) else "conv"
    return classify_name(name)


def classify_name(name: str) -> str:
    """The class of an op that its name alone decides (everything but convolutions and regions)."""
    base = name.rstrip("_")
    if name in _GEMM:
        return "gemm"
    if "norm" in name and base not in ("linalg_vector_norm", "norm"):
        return "norm"
    if "pool" in name:
        return "pool"
    if base in _RANDOM:
        return "random"
    if base in _REDUCTION:
        return "reduction"
    if base in _EMBEDDING:
        return "embedding"
    if base in _MOVEMENT:
        return "movement"
    if base in _MATH:
        return "math"
    return "elementwise"


def timed_key(phase: str, cls: str, name: str) -> str:
    """How the profiler files an op's time: ``phase/class/op``, so that the time can be given to
    the classes of a later version of :func:`classify_name` without profiling again."""
    return f"{phase}/{cls}/{name}"


def class_of_timed_key(key: str) -> str:
    """The class, under the current rules, of the time the profiler filed under ``key``."""
    phase, cls, name = key.split("/", 2)
    if phase == "optimizer":
        return "optimizer"
    if cls in FUSED_CLASSES or cls in SHAPE_CLASSES:
        return cls
    return classify_name(name)


def tensor_bytes(value: Any) -> int:
    """Bytes a tensor spans: its elements, but never more than its storage (expanded tensors); a
    sparse tensor's values and indices."""
    if not isinstance(value, torch.Tensor):
        return 0
    if value.is_sparse:
        return tensor_bytes(value._values()) + tensor_bytes(value._indices())
    dense = value.numel() * value.element_size()
    try:
        return min(dense, value.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):  # sparse, nested or storage-less tensors
        return dense


@dataclass
class ClassTally:
    """Totals of one operator class."""

    flops: float = 0.0
    bytes: float = 0.0
    ops: float = 0
    """Ops as they decompose on the device counted (a probed RNN region scales them up)."""
    alloc: float = 0.0
    """Bytes of outputs of at least :data:`ALLOC_LARGE_BYTES` that ops allocated (not in place)."""
    lowered: float = 0.0
    """Bytes GEMM-lowered ops write to and read back from their im2col column buffers
    (:data:`LOWERED_CLASSES` only)."""
    seconds: float = 0.0
    """Wall time inside the ops (only when the accountant was given a clock)."""


@dataclass
class StepTally:
    """Everything counted over one training step."""

    classes: dict[str, ClassTally] = field(default_factory=lambda: {c: ClassTally() for c in OP_CLASSES})
    phase_flops: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    phase_bytes: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    forward_output_bytes: float = 0.0
    """Bytes written by forward ops: an upper bound of the activations kept for backward."""
    op_seconds: dict[str, float] = field(default_factory=dict)
    """Seconds by :func:`timed_key` (only when the accountant was given a clock)."""
    ops_without_formula: int = 0
    """Ops of a compute class whose FLOPs PyTorch has no formula for (counted as zero)."""
    unformulated: set[str] = field(default_factory=set)

    @property
    def ops(self) -> float:
        return sum(t.ops for t in self.classes.values())


_REGION_KEY = "adloader_region"
_region_ids = itertools.count(1)


class FusedRegions(TorchFunctionMode):
    """Marks the ops of fused calls (attention, RNNs) and the autograd nodes they create.

    Inside a call, :attr:`current` is ``(class, region_id, scale)``; afterwards each autograd
    node the call created carries the same triple in its ``metadata``, so its backward ops are
    attributed to the region too. ``scale`` multiplies everything counted inside.

    RNNs on the meta device decompose into ~20 Python-implemented ops per time step, which
    takes seconds for long sequences. There the call runs on two short probes of the sequence
    (``probe_steps // 2`` and ``probe_steps`` steps) whose counts are extrapolated linearly to
    the full length (every step costs the same; the first differs, and the two-point
    extrapolation keeps that exact), and the output is stretched back to full length by
    uncounted ops. On real tensors the call always runs in full."""

    FUSED: dict[Callable[..., Any], str] = {
        F.scaled_dot_product_attention: "attention",
        F.multi_head_attention_forward: "attention",
        torch.lstm: "lstm", torch.gru: "rnn", torch.rnn_tanh: "rnn", torch.rnn_relu: "rnn",
    }

    def __init__(self, probe_steps: int = 4) -> None:
        super().__init__()
        self.current: tuple[str, int, float] | None = None
        self.probe_steps = max(2, probe_steps)

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        kind = self.FUSED.get(func)
        if kind is None or self.current is not None:
            return func(*args, **kwargs)
        inputs = tree_flatten((args, kwargs))[0]
        steps = _rnn_probe(kind, args, kwargs, self.probe_steps)
        if steps is None:
            return self._region(kind, 1.0, lambda: func(*args, **kwargs), inputs)
        time_dim, total = steps
        short, long = self.probe_steps // 2, self.probe_steps
        extra = (total - long) / (long - short)  # count(T) = count(long) + extra * (count(long) - count(short))
        first = self._region(kind, -extra, lambda: func(args[0].narrow(time_dim, 0, short), *args[1:]), inputs)
        second = self._region(kind, 1.0 + extra, lambda: func(args[0].narrow(time_dim, 0, long), *args[1:]), inputs)
        return self._region(kind, 0.0, lambda: _stretch(second, first, time_dim, total), inputs)

    def _region(self, kind: str, scale: float, call: Callable[[], Any], inputs: list[Any]) -> Any:
        region = (kind, next(_region_ids), scale)
        self.current = region
        try:
            out = call()
        finally:
            self.current = None
        _tag_nodes(out, inputs, region)
        return out


def _rnn_probe(kind: str, args: tuple, kwargs: dict, probe_steps: int) -> tuple[int, int] | None:
    """(time dimension, steps) when an RNN call on meta tensors may be counted on probes of its
    sequence; None to run it in full (real tensors, packed sequences, short sequences)."""
    if kind not in ("lstm", "rnn") or kwargs or len(args) != 9 or not isinstance(args[0], torch.Tensor):
        return None
    packed = isinstance(args[1], torch.Tensor) and not args[1].is_floating_point()
    if packed or args[0].device.type != "meta" or args[0].dim() != 3:
        return None
    time_dim = 1 if args[8] else 0
    total = int(args[0].shape[time_dim])
    return (time_dim, total) if total > probe_steps else None


def _stretch(outputs: tuple, other_probe: tuple, time_dim: int, total: int) -> tuple:
    """The probe's output sequence stretched to the full length (shape-correct, differentiable),
    with the other probe's output joined in at zero weight so that its backward runs too."""
    sequence = outputs[0]
    shape = list(sequence.shape)
    shape[time_dim] = total
    joined = sequence.mean(time_dim, keepdim=True) + 0.0 * other_probe[0].mean(time_dim, keepdim=True)
    return (joined.expand(shape), *outputs[1:])


def _tag_nodes(outputs: Any, inputs: Iterable[Any], region: tuple[str, int, float]) -> None:
    """Tag every autograd node between the region's outputs and its inputs (or nodes already
    tagged by an inner region)."""
    stop = {id(t.grad_fn) for t in inputs if isinstance(t, torch.Tensor) and t.grad_fn is not None}
    stack = [t.grad_fn for t in tree_flatten(outputs)[0] if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen or id(node) in stop or "AccumulateGrad" in node.name():
            continue
        seen.add(id(node))
        if _REGION_KEY in node.metadata:
            continue
        node.metadata[_REGION_KEY] = region
        stack.extend(next_node for next_node, _ in node.next_functions)


class StepAccountant(TorchDispatchMode):
    """Counts (and, with ``clock``, times) every aten op of a training step by class.

    Use inside :class:`FusedRegions` and set :attr:`phase` before each phase::

        with FusedRegions() as regions, StepAccountant(regions) as acct:
            acct.phase = "forward"; loss = ...
            acct.phase = "backward"; loss.backward()
            acct.phase = "optimizer"; opt.step()
    """

    def __init__(self, regions: FusedRegions | None = None, clock: Callable[[], float] | None = None) -> None:
        super().__init__()
        self.regions = regions
        self.clock = clock
        self.phase = "forward"
        self.tally = StepTally()
        self.sparse_sizes: dict[int, int] = {}
        """Bytes of the sparse tensors made during the step, by ``id`` (see :func:`bytes_moved`)."""
        self._sparse_alive: list[torch.Tensor] = []
        """Keeps those tensors alive for the step, so that no other tensor reuses their ``id``."""

    def _region(self) -> tuple[str, int, float] | None:
        if self.regions is not None and self.regions.current is not None:
            return self.regions.current
        node = torch._C._current_autograd_node()
        if node is not None:
            return node.metadata.get(_REGION_KEY)
        return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if self.clock is None:
            out = func(*args, **kwargs)
            elapsed = 0.0
        else:
            start = self.clock()
            out = func(*args, **kwargs)
            elapsed = self.clock() - start
        if is_view(func) or getattr(func, "namespace", "aten") == "profiler":
            return out
        self._account(func, args, kwargs, out, elapsed)
        return out

    def _account(self, func: Any, args: tuple, kwargs: dict, out: Any, elapsed: float) -> None:
        name = op_name(func)
        region = None if self.phase == "optimizer" else self._region()
        if region is not None and region[0] == "attention" and name in _PROJECTIONS:
            region = None  # nn.MultiheadAttention's in/out projections are plain matmuls
        if self.phase == "optimizer":
            cls = "optimizer"
        elif region is not None:
            cls = region[0]
        else:
            cls = classify(func, args)
        scale = 1.0 if region is None else region[2]
        tally = self.tally.classes[cls]
        tally.ops += scale
        tally.seconds += elapsed
        if self.clock is not None:
            key = timed_key(self.phase, cls, name)
            self.tally.op_seconds[key] = self.tally.op_seconds.get(key, 0.0) + elapsed
        flops = 0.0
        formula = _FLOP_REGISTRY.get(getattr(func, "overloadpacket", None))
        if name == "convolution_backward" and _conv_groups(name, args) > 1 and not args[7]:
            flops = scale * _grouped_conv_backward_flops(args)
        elif formula is not None:
            flops = scale * float(formula(*args, **kwargs, out_val=out))
        elif cls in COMPUTE_CLASSES and name in _GEMM | {"convolution", "convolution_backward"}:
            self.tally.ops_without_formula += 1
            self.tally.unformulated.add(name)
        outputs = [] if name in _EMPTY else [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        read, written = ([], []) if name in _EMPTY else bytes_moved(name, args, kwargs, outputs, self.sparse_sizes)
        for tensor, nbytes in zip(outputs, written):
            if tensor.is_sparse:  # a sparse result holds as many rows as what made it
                self.sparse_sizes[id(tensor)] = nbytes
                self._sparse_alive.append(tensor)
        if cls in LOWERED_CLASSES:
            tally.lowered += scale * lowered_bytes(name, args, out)
        if not _writes_in_place(func):
            tally.alloc += scale * sum(b for b in written if b >= ALLOC_LARGE_BYTES)
        moved = scale * (sum(read) + sum(written))
        tally.flops += flops
        tally.bytes += moved
        self.tally.phase_flops[self.phase] += flops
        self.tally.phase_bytes[self.phase] += moved
        if self.phase == "forward":
            self.tally.forward_output_bytes += scale * sum(written)


def bytes_moved(name: str, args: tuple, kwargs: dict, outputs: list[torch.Tensor],
                sparse_sizes: Mapping[int, int] | None = None) -> tuple[list[int], list[int]]:
    """Bytes one op reads and writes, per operand: every tensor it takes and returns, except where
    that overstates what the op touches. A table lookup reads the rows its indices name, not the
    table; a sparse embedding gradient holds one row (and its index) per looked-up index; an op
    with a sparse operand touches only the rows that operand holds. ``sparse_sizes`` gives the
    bytes of sparse tensors by ``id`` where the tensor itself cannot say (on the meta device a
    sparse gradient's row count is unknown)."""
    sizes = sparse_sizes or {}

    def size(t: torch.Tensor) -> int:
        return sizes.get(id(t), tensor_bytes(t)) if t.is_sparse else tensor_bytes(t)

    inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    if name in _EMBEDDING_LOOKUPS and len(inputs) >= 2:
        table, indices = inputs[0], inputs[1]
        rows = indices.numel() * table[0].numel() * table.element_size() if table.dim() else 0
        return [rows] + [size(t) for t in inputs[1:]], [size(t) for t in outputs]
    if _is_sparse_embedding_gradient(name, args) and len(inputs) >= 2:
        grad, indices = inputs[0], inputs[1]
        return [size(t) for t in inputs], \
            [indices.numel() * (grad.shape[-1] * grad.element_size() + indices.element_size())]
    sparse = [t for t in inputs + outputs if t.is_sparse]
    if sparse:
        touched = max(size(t) for t in sparse)
        return [size(t) if t.is_sparse else min(size(t), touched) for t in inputs], \
            [touched if t.is_sparse else min(size(t), touched) for t in outputs]
    return [size(t) for t in inputs], [size(t) for t in outputs]


def lowered_bytes(name: str, args: tuple, out: Any) -> float:
    """Column-buffer traffic (im2col writes it, the GEMM reads it back) of a depthwise convolution's
    GEMM-lowered parts: the forward pass padded wider than this CPU's
    :data:`DIRECT_DEPTHWISE_FORWARD_WIDTH_UNROLL`, the weight gradient wider than
    :data:`DIRECT_DEPTHWISE_WEIGHT_GRAD_MAX_TAPS`. Zero for direct ones."""
    forward = name in ("convolution", "_convolution") and len(args) > 6 and not args[6]
    if forward:
        weight, output = args[1], out
    elif name == "convolution_backward" and len(args) > 10 and not args[7] and args[10][1]:
        weight, output = args[2], args[0]
    else:
        return 0.0
    if not isinstance(weight, torch.Tensor) or not isinstance(output, torch.Tensor) or weight.dim() < 3:
        return 0.0
    if forward:
        direct = _width(args[4]) <= min(direct_depthwise_forward_max_padding(), output.shape[-1])
    else:
        direct = max(weight.shape[2:]) <= DIRECT_DEPTHWISE_WEIGHT_GRAD_MAX_TAPS
    if direct:
        return 0.0
    column = output.shape[0] * output.shape[1] * math.prod(output.shape[2:]) * math.prod(weight.shape[2:])
    return 2.0 * column * output.element_size()


@functools.cache
def direct_depthwise_forward_max_padding(capability: str | None = None) -> int:
    """The widest padding along the width that oneDNN's direct depthwise forward kernel takes on
    a CPU of ``capability`` (``torch.backends.cpu.get_cpu_capability()``, this host's, by default):
    :data:`DIRECT_DEPTHWISE_FORWARD_WIDTH_UNROLL`."""
    return DIRECT_DEPTHWISE_FORWARD_WIDTH_UNROLL.get(capability or torch.backends.cpu.get_cpu_capability(), 3)


def _width(padding: Any) -> int:
    """A convolution's padding along its last dimension (an int, or a sequence of them)."""
    return int(padding[-1]) if isinstance(padding, (list, tuple)) and padding else int(padding or 0)


def _is_sparse_embedding_gradient(name: str, args: tuple) -> bool:
    """The backward of a lookup with ``sparse=True`` (its ``sparse`` flag is positional)."""
    if name in _EMBEDDING_SPARSE_GRADIENTS:
        return True
    index = {"_embedding_bag_backward": 9, "embedding_backward": 5}.get(name)
    return index is not None and len(args) > index and args[index] is True


def _grouped_conv_backward_flops(args: tuple) -> float:
    """FLOPs of a grouped (non-transposed) convolution's backward. PyTorch's formula ignores
    ``groups`` for the weight gradient and counts it ``groups`` times too high (a depthwise
    convolution's by the channel count); each requested gradient costs what the forward does."""
    grad_output, weight, output_mask = args[0], args[2], args[10]
    forward = 2.0 * grad_output.shape[0] * math.prod(grad_output.shape[2:]) * math.prod(weight.shape)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def _writes_in_place(func: Any) -> bool:
    """True for in-place and ``out=`` ops: their outputs are buffers that already exist."""
    schema = getattr(func, "_schema", None)
    return schema is not None and any(r.alias_info is not None and r.alias_info.is_write for r in schema.returns)


def cpu_clock() -> float:
    """The clock the profiler times ops with: this thread's CPU time. Profiling runs torch at one
    thread, so every op runs on the calling thread, and time another process takes the core
    (a shared machine) is not counted."""
    return time.thread_time()


def per_class(tally: StepTally, attribute: str) -> dict[str, float]:
    """One attribute (flops, bytes, ops, seconds) of every class, as a dict."""
    return {c: float(getattr(t, attribute)) for c, t in tally.classes.items()}



@dataclass
class AccountedStep:
    """The tally of one step and, if a phase failed, which one and why."""

    tally: StepTally
    failed_phase: str | None = None
    error: str | None = None


def account_step(
    forward: Callable[[], torch.Tensor],
    optimizer_step: Callable[[], Any] | None,
    clock: Callable[[], float] | None = None,
    probe_steps: int = 4,
) -> AccountedStep:
    """Run one training step (``forward()`` returns the loss; then backward; then
    ``optimizer_step()``) under the accountant. A phase that raises stops the step: what the
    phases before it counted is kept, nothing of the failed one (what ran of it before the failure
    is an unknown fraction of it, which a caller estimating the phase would count twice), and
    the failure is returned, never raised. ``probe_steps``: see :class:`FusedRegions`."""
    regions = FusedRegions(probe_steps)
    accountant = StepAccountant(regions, clock)
    completed = StepTally()
    with regions, accountant:
        try:
            accountant.phase = "forward"
            loss = forward()
            completed = copy.deepcopy(accountant.tally)
            accountant.phase = "backward"
            loss.backward()
            if optimizer_step is not None:
                completed = copy.deepcopy(accountant.tally)
                accountant.phase = "optimizer"
                optimizer_step()
        except Exception as exc:  # any model code may fail on meta tensors; the caller says so
            return AccountedStep(completed, accountant.phase, f"{type(exc).__name__}: {exc}"[:300])
    return AccountedStep(accountant.tally)


__all__ = [
    "OP_CLASSES", "COMPUTE_CLASSES", "PHASES", "ClassTally", "StepTally", "FusedRegions", "StepAccountant",
    "classify", "classify_name", "timed_key", "class_of_timed_key", "is_view", "op_name", "tensor_bytes",
    "cpu_clock", "per_class", "FUSED_CLASSES", "SHAPE_CLASSES", "LOWERED_CLASSES", "lowered_bytes", "ALLOC_LARGE_BYTES", "bytes_moved",
    "AccountedStep", "account_step",
]
