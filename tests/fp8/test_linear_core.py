"""The one FP8 linear core (infir/fp8/linear.py) compiled against the same core run eagerly, and the model
layers around it (infir/model/fp8_linears.py: weight refresh, main_grad, the SwiGLU epilogue)."""
import importlib

import pytest
import torch
import torch._inductor.config

from infir.fp8 import Fp8SwiGLUOutput, LinearSpec, WeightCache, fp8_linear, get_recipe, tensors_of
from infir.fp8 import linear as eager_linear
from infir.model.fp8_linears import Fp8Projection


def traced_linear(x, w, wq, b, recipe):
    return fp8_linear(x, w, wq, b, LinearSpec.of(recipe, wq.granularity))


class Bare(Fp8Projection, torch.nn.Module):
    """An FP8 projection outside megatron: the weight and the call into the core."""

    def __init__(self, weight, recipe="fp8_blockwise_ue8m0", swiglu_epilogue=False):
        torch.nn.Module.__init__(self)
        recipe = get_recipe(recipe)
        if swiglu_epilogue:
            recipe = recipe.with_swiglu_input(True)
        self._init_fp8(recipe, swiglu_epilogue)
        self.weight = torch.nn.Parameter(weight)

    def forward(self, x):
        return self.fp8_matmul(x, self.weight, None)

RECIPES = ["fp8_blockwise_ue8m0", "fp8_blockwise_fp32", "fp8_tensorwise", "moss"]


def _run(fn, x, w, b, dy):
    x = x.clone().requires_grad_(True)
    w = w.clone().requires_grad_(True)
    b = b.clone().requires_grad_(True)
    y = fn(x, w, b)
    y.backward(dy)
    return y.detach(), x.grad, w.grad, b.grad


def _inputs(device, m=256, k=384, n=256, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 4).to(device, torch.bfloat16)
    w = (torch.randn(n, k, generator=g) * 0.05).to(device)
    b = torch.randn(n, generator=g).to(device)
    dy = (torch.randn(m, n, generator=g) * 1e-3).to(device, torch.bfloat16)
    return x, w, b, dy


def _assert_same(ref, out):
    """FP8 GEMM results bit-equal; the bias gradient (an FP32 sum over tokens) up to summation order."""
    for name, r, o in zip(("y", "dx", "dw"), ref, out):
        assert o.dtype == r.dtype, name
        assert torch.equal(o, r), (name, int((o != r).sum()), float((o.float() - r.float()).abs().max()))
    torch.testing.assert_close(out[3], ref[3], rtol=1e-5, atol=1e-6)


def _compare(recipe_name, device, backend):
    recipe = get_recipe(recipe_name)
    x, w, b, dy = _inputs(device)
    ref = _run(lambda x, w, b: eager_linear(x, w, b, recipe, weight_cache=WeightCache()), x, w, b, dy)
    cache = WeightCache()

    def traced(x, w, b):
        return compiled(x, w, cache.get(w, recipe), b)

    compiled = torch.compile(lambda x, w, wq, b: traced_linear(x, w, wq, b, recipe), backend=backend, fullgraph=True)
    out = _run(traced, x, w, b, dy)
    return ref, out


@pytest.mark.parametrize("recipe", RECIPES)
def test_traced_graph_equals_eager_function(recipe):
    """One graph (fullgraph=True), and the same numbers as the core run eagerly: fprop, dgrad, wgrad, bias grad."""
    torch._dynamo.reset()
    ref, out = _compare(recipe, "cpu", "aot_eager")
    _assert_same(ref, out)


@pytest.mark.parametrize("recipe", ["fp8_blockwise_ue8m0", "moss"])
def test_traced_inductor_equals_eager_function_cpu(recipe):
    """Through inductor too (the custom ops' fake layouts must match what they return). Inductor skips
    the BF16 rounding of `bias.to(y.dtype)` unless told to emulate it; eager rounds."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(emulate_precision_casts=True):
        ref, out = _compare(recipe, "cpu", "inductor")
    _assert_same(ref, out)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES)
def test_traced_inductor_equals_eager_function_gpu(recipe):
    """On CUDA both sides run the Triton quantizers and scaled_mm: the same bits, compiled or not
    (with the bias rounding emulated, as in the CPU test)."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(emulate_precision_casts=True):
        ref, out = _compare(recipe, "cuda", "inductor")
    _assert_same(ref, out)


def test_weight_transpose_runs_in_the_backward_graph():
    """dgrad's W^T is made inside the backward GEMM op: the forward graph neither transposes W nor
    saves a [K, N] copy of it for backward (the partitioner would hold one per layer all forward)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = {}

    def keep(name):
        def compiler(gm, example_inputs):
            graphs[name] = gm
            return make_boxed_func(gm.forward)
        return compiler

    torch._dynamo.reset()
    recipe = get_recipe("fp8_blockwise_ue8m0")
    x, w, b, dy = _inputs("cpu", n=128)  # W^T [384, 128] unlike any other saved shape (X^T is [384, 256])
    cache = WeightCache()
    fn = torch.compile(lambda x, w, wq, b: traced_linear(x, w, wq, b, recipe),
                       backend=aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw")), fullgraph=True)
    x = x.clone().requires_grad_(True)
    w = w.clone().requires_grad_(True)
    fn(x, w, cache.get(w, recipe), b).backward(dy)

    def mm_calls(gm):
        return [n for n in gm.graph.nodes if n.op == "call_function" and "fp8_mm" in str(n.target)]

    transposed = lambda n: bool(n.args[7]) if len(n.args) > 7 else bool(n.kwargs.get("b_transposed", False))
    assert [transposed(n) for n in mm_calls(graphs["fw"])] == [False]  # fprop only
    assert sorted(transposed(n) for n in mm_calls(graphs["bw"])) == [False, True]  # wgrad, dgrad
    n, k = w.shape
    saved = [a.meta["val"] for a in next(iter(reversed(graphs["fw"].graph.nodes))).args[0] if hasattr(a, "meta")]
    assert not any(t.shape == (k, n) and t.dtype == cache.q.data.dtype for t in saved if isinstance(t, torch.Tensor))


def test_compiled_fp8_linear_sees_weight_updates_with_or_without_the_refresh_hook():
    """With attach_weight_refresh the layer reads its cache unchecked; without it, the layer checks the
    cache itself (outside the graph). Either way an in-place weight update between calls reaches the output."""
    from infir.model.fp8_linears import attach_weight_refresh

    x = torch.randn(16, 256, dtype=torch.bfloat16)
    for hooked in (False, True):
        torch._dynamo.reset()
        layer = Bare(torch.randn(128, 256) * 0.05)
        if hooked:
            attach_weight_refresh(layer)
        layer(x)  # an eager call first: the cache holds a copy that the updates below make stale
        compiled = torch.compile(layer, backend="aot_eager")
        with torch.no_grad():
            for scale in (1.0, 2.0):
                layer.weight.mul_(scale)
                ref = eager_linear(x, layer.weight, None, layer.recipe, weight_cache=WeightCache())
                assert torch.equal(compiled(x), ref), (hooked, scale)


class _Layers(torch.nn.Module):
    """A few FP8 linears of Qwen-like odd shapes (K-blocks not a multiple of 4), summed."""

    def __init__(self, device, shapes=((384, 256), (256, 640), (896, 384))):
        super().__init__()
        self.layers = torch.nn.ModuleList(Bare(torch.randn(n, k, device=device) * 0.05) for n, k in shapes)

    def forward(self):
        return None


def _refresh_of(model):
    from infir.model.fp8_linears import WeightRefresh, attach_weight_refresh

    attach_weight_refresh(model)
    return next(h for h in model._forward_pre_hooks.values() if isinstance(h, WeightRefresh))


def _caches_equal_a_fresh_quantization(model):
    for m in model.layers:
        assert m.weight_cache.fresh(m.weight, m.recipe)
        want = WeightCache().get(m.weight, m.recipe)
        for a, b in zip(tensors_of(m.weight_cache.q), tensors_of(want)):
            assert (a is None) == (b is None)
            if a is not None:
                assert torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a,
                                   b.view(torch.uint8) if b.element_size() == 1 else b)


def test_weight_refresh_on_cpu_requantizes_eagerly():
    """Off the GPU the refresh re-quantizes each changed weight eagerly and records no graph."""
    model = _Layers("cpu")
    refresh = _refresh_of(model)
    for scale in (None, 2.0):
        if scale:
            with torch.no_grad():
                for m in model.layers:
                    m.weight.mul_(scale)
        model()
        _caches_equal_a_fresh_quantization(model)
    assert refresh.graph is None


def test_weight_refresh_records_a_graph_only_for_gpu_block_weights_cached_at_their_shape():
    """The graph is taken only where every weight is a CUDA tensor whose recipe refreshes by graph and whose
    cache already holds a copy of its shape: a first fill, a weight of a new shape (its cache is reallocated
    by the eager refresh), an eager-refresh recipe or a CPU weight keep the eager refresh."""
    from types import SimpleNamespace as NS

    from infir.model.fp8_linears import WeightRefresh

    def linear(shape=(256, 128), cached=(256, 128), refresh="graph", cuda=True):
        return NS(weight=NS(is_cuda=cuda, shape=torch.Size(shape)), recipe=NS(weight_refresh=refresh),
                  weight_cache=NS(q=None if cached is None else NS(data=NS(shape=torch.Size(cached)))))

    assert WeightRefresh([linear(), linear((512, 256), (512, 256))])._graphable()
    for odd in (linear(cached=None), linear(shape=(384, 128)), linear(refresh="eager"), linear(cuda=False)):
        assert not WeightRefresh([linear(), odd])._graphable()
    assert not WeightRefresh([])._graphable()


@pytest.mark.gpu
def test_weight_refresh_replays_one_cuda_graph_per_step_gpu():
    """After the first (eager) fill, the refresh records every weight's re-quantization as one CUDA
    graph and replays it after each update: the caches, at the addresses the layers' graphs read, equal
    a fresh quantization bit for bit. A weight moved to new storage makes it record again (at the next step
    that makes every weight stale; a lone stale weight is re-quantized eagerly)."""
    model = _Layers("cuda")
    refresh = _refresh_of(model)
    model()
    assert refresh.graph is None  # the first fill is eager (and warms the quantizers up)
    addresses = [m.weight_cache.q.data.data_ptr() for m in model.layers]
    graphs = []
    for step in range(3):
        with torch.no_grad():
            for m in model.layers:  # as an optimizer step does: in place, every weight
                m.weight.add_(torch.randn_like(m.weight) * 0.01)
        model()
        _caches_equal_a_fresh_quantization(model)
        graphs.append(refresh.graph)
        model()  # a second micro-batch: nothing stale, nothing replayed
    assert graphs[0] is not None and graphs[1] is graphs[0] and graphs[2] is graphs[0]
    assert [m.weight_cache.q.data.data_ptr() for m in model.layers] == addresses
    first = model.layers[0]
    first.weight.data = first.weight.data.clone() * 3  # new storage: the recorded graph would read the old one
    model()  # only this weight is stale: re-quantized eagerly, no replay
    _caches_equal_a_fresh_quantization(model)
    assert refresh.graph is graphs[0]
    with torch.no_grad():
        for m in model.layers:
            m.weight.mul_(0.5)
    model()  # every weight stale, one at a new address: recorded again
    _caches_equal_a_fresh_quantization(model)
    assert refresh.graph is not graphs[0]


def test_weight_cache_prepares_scaled_mm_scale_layouts_once_per_weight_version():
    """The compiled path's GEMMs take the weight's (and W^T's) scales in scaled_mm's layout from the
    weight cache: made when the weight is quantized, equal to the per-call layout, and remade only
    after the weight changes."""
    from infir.fp8.gemm import _pad_cols, scaled_mm_scale

    recipe = get_recipe("fp8_blockwise_ue8m0")
    w = torch.randn(256, 384) * 0.05  # 2 x 3 blocks; scaled_mm takes the K-block count padded to 4, for W and W^T
    cache = WeightCache()
    q = cache.get(w, recipe)
    sb, sbt = q.layout_cache["scaled_mm"], q.layout_cache["scaled_mm_t"]
    assert torch.equal(sb, _pad_cols(q.scale, 4).t()) and sb.shape == (4, 2)
    assert torch.equal(sbt, _pad_cols(q.t().scale, 4).t()) and sbt.shape == (4, 3)
    assert scaled_mm_scale(q) is sb and cache.get(w, recipe) is q
    first = sb.clone()
    w.mul_(2)
    q2 = cache.get(w, recipe)  # remade, into the same tensors (the addresses CUDA graphs replay)
    assert q2.layout_cache["scaled_mm"] is sb and torch.equal(sb[:2], first[:2] * 2)
    with pytest.raises(ValueError, match="no transposed scale layout"):
        scaled_mm_scale(quantize_token(torch.randn(16, 128)), transposed=True)


def quantize_token(x):
    from infir.fp8 import quantize

    return quantize(x, "token", "ue8m0")


def _main_grad_runs(device, recipe_name, mode, steps=3, swiglu=False, eager_unfused=False):
    """main_grad after `steps` fwd+bwd of one layer whose weights carry megatron's FP32 main_grad and the
    refresh hook: eager, and compiled (under `mode`, "reduce-overhead" being CUDA graphs). Also each run's
    weight.grad and dX. swiglu: the layer is an MLP, a gated FC1 applying SwiGLU as its epilogue, which
    hands y to FC2 in FP8, and FC2; main_grad is then both weights' (flattened, joined). eager_unfused:
    the eager run takes SwiGLU's unfused kernels (the fused ones' reference)."""
    core = importlib.import_module("infir.fp8.linear")
    from infir.model.fp8_linears import attach_weight_refresh

    x, w, _, dy = _inputs(device)
    weights = [w]
    if swiglu:  # FC2 [N, N/2]: the MLP's output has dy's shape
        g = torch.Generator(device="cpu").manual_seed(1)
        weights.append((torch.randn(w.shape[0], w.shape[0] // 2, generator=g) * 0.05).to(device))
    c0 = [torch.randn(wi.shape, device=device) for wi in weights]  # what earlier micro-batches left in main_grad

    def linear(i):
        layer = Bare(weights[i].clone(), recipe_name, swiglu_epilogue=swiglu and i == 0)
        if swiglu:  # both projections of the MLP run the recipe with SwiGLU's input in FP8
            layer.recipe = layer.recipe.with_swiglu_input(True)
        layer.weight.main_grad = c0[i].clone()
        return layer

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linears = torch.nn.ModuleList(linear(i) for i in range(len(weights)))

        def forward(self, x):
            for layer in self.linears:
                x = layer(x)
            return x

    class Model(torch.nn.Module):  # the refresh hook sits on the eager model, around compiled layers
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def forward(self, x):
            return self.layer(x)

    out = {}
    for name in ("eager", "compiled"):
        torch._dynamo.reset()
        layer = Layer()
        fn = Model(layer)
        attach_weight_refresh(fn)
        if name == "compiled":
            fn.layer = torch.compile(layer, backend="inductor", mode=mode, fullgraph=True)  # no graph break
        unfused = eager_unfused and name == "eager"
        saved = core.fused_forward_quantize_ok, core.fused_backward_quantize_ok
        if unfused:
            core.fused_forward_quantize_ok = core.fused_backward_quantize_ok = lambda *a: False
        try:
            for _ in range(steps):
                torch.compiler.cudagraph_mark_step_begin()
                xi = x.clone().requires_grad_(True)
                fn(xi).backward(dy)
                grad, dx = layer.linears[0].weight.grad, xi.grad.clone()
                for lin in layer.linears:
                    lin.weight.grad = None  # as megatron's grad hook leaves it
        finally:
            core.fused_forward_quantize_ok, core.fused_backward_quantize_ok = saved
        main = [lin.weight.main_grad.clone() for lin in layer.linears]
        out[name] = (main[0] if len(main) == 1 else torch.cat([m.flatten() for m in main]), grad, dx)
    return out, steps


@pytest.mark.parametrize("recipe", ["fp8_blockwise_ue8m0", "moss"])
def test_traced_wgrad_adds_into_main_grad_cpu(recipe):
    """The wgrad GEMM adds into the weight's main_grad itself, eager or compiled (megatron's hook is told
    to skip the placeholder both give autograd): main_grad after three micro-batches is the same either way."""
    with torch._inductor.config.patch(emulate_precision_casts=True):
        out, _ = _main_grad_runs("cpu", recipe, None)
    (ref, ref_grad, ref_dx), (got, got_grad, got_dx) = out["eager"], out["compiled"]
    assert torch.equal(got, ref), float((got - ref).abs().max())
    assert torch.equal(got_dx, ref_dx)
    # the unwritten placeholder, eager too: the refresh hook marked the weight for megatron's grad hook,
    # which needs a .grad under overlap_grad_reduce and drops it
    assert got_grad is not None and got_grad.shape == got.shape
    assert ref_grad is not None and ref_grad.shape == ref.shape


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_traced_wgrad_adds_into_main_grad_gpu(mode):
    """The same on CUDA, and under CUDA graphs: a replayed graph must add into the real main_grad,
    not into a copy cudagraph trees made of it (three micro-batches: warm-up, record, replay)."""
    with torch._inductor.config.patch(emulate_precision_casts=True):
        out, _ = _main_grad_runs("cuda", "fp8_blockwise_ue8m0", mode)
    (ref, _, ref_dx), (got, _, got_dx) = out["eager"], out["compiled"]
    assert torch.equal(got, ref), float((got - ref).abs().max())
    assert torch.equal(got_dx, ref_dx)


@pytest.mark.parametrize("recipe", RECIPES)
def test_swiglu_epilogue_compiled_equals_eager_cpu(recipe):
    """FC1 with SwiGLU as its epilogue hands y to FC2 in FP8 (an Fp8SwiGLUOutput) and its backward
    quantizes dh for FC1's GEMMs itself; compiled as one graph, dX and both main_grads are the eager ones
    bit for bit."""
    fc1 = Bare(torch.randn(256, 384) * 0.05, recipe, swiglu_epilogue=True)
    assert isinstance(fc1(torch.randn(128, 384, dtype=torch.bfloat16)), Fp8SwiGLUOutput)
    with torch._inductor.config.patch(emulate_precision_casts=True):
        out, _ = _main_grad_runs("cpu", recipe, None, swiglu=True)
    (ref, _, ref_dx), (got, _, got_dx) = out["eager"], out["compiled"]
    assert torch.equal(got, ref), float((got - ref).abs().max())
    assert torch.equal(got_dx, ref_dx)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_traced_swiglu_epilogue_fused_matches_the_reference_gpu(mode, monkeypatch):
    """On CUDA the compiled FC1 runs quant_both.cu's fused SwiGLU forward + quantizer of FC2's input
    and fused SwiGLU backward + quantizer (asserted below), traced as one graph (fullgraph). Against the
    eager run without the fused kernels (SwiGLU's Triton kernels off on both sides), dX and main_grad agree
    to the rare FP8 byte the fused kernel's fast sigmoid may flip (test_swiglu.py), also replayed as a
    CUDA graph."""
    from infir.fp8 import swiglu as sw
    from infir.fp8.kernels import cuda_build
    from infir.fp8.kernels import swiglu as ks

    monkeypatch.setattr(cuda_build, "_LOADED", {})  # a library lookup while tracing would now stat files: a graph break
    calls = {"swiglu_fp8_bwd_quant": 0, "swiglu_fp8_fwd_quant": 0}
    for name in calls:
        fused = getattr(ks, name)
        monkeypatch.setattr(ks, name, lambda *a, name=name, fused=fused: (calls.__setitem__(name, calls[name] + 1),
                                                                          fused(*a))[1])
    monkeypatch.setattr(sw, "_use_kernels", lambda h: False)
    with torch._inductor.config.patch(emulate_precision_casts=True):
        out, _ = _main_grad_runs("cuda", "fp8_blockwise_ue8m0", mode, swiglu=True, eager_unfused=True)
    assert all(calls.values()), f"the compiled layer did not take both fused kernels: {calls}"
    (ref, _, ref_dx), (got, _, got_dx) = out["eager"], out["compiled"]
    assert (got_dx == ref_dx).float().mean() >= 0.99, float((got_dx != ref_dx).float().mean())
    torch.testing.assert_close(got_dx.float(), ref_dx.float(), rtol=2e-2, atol=1e-3 * ref_dx.abs().max().item())
    torch.testing.assert_close(got, ref, rtol=2e-2, atol=1e-3 * ref.abs().max().item())


def test_adopted_weights_back_linears_and_keep_the_scales_saved_for_backward():
    """WeightCache.adopt (the FP8 parameter gather's weights): the cache serves the given FP8 bytes and scales,
    and a later layer re-adopting its weight (in its forward pre-hook, while an earlier layer's backward is
    pending) does not bump the version of the scale buffer the layers share (K = 512: 4 scale columns, so
    scaled_mm's layout of a scale is the scale itself)."""
    recipe = get_recipe("fp8_blockwise_ue8m0")
    weights = [torch.randn(256, 512), torch.randn(256, 512)]
    whole = [WeightCache().get(w, recipe) for w in weights]
    n = whole[0].scale.numel()
    scales = torch.ones(2 * n)  # both weights' scales in one buffer, as the gather keeps them
    caches = [WeightCache(), WeightCache()]
    for i, (w, q) in enumerate(zip(weights, whole)):
        scales[i * n:(i + 1) * n].copy_(q.scale.view(-1))
        caches[i].adopt(w, recipe, q.data.clone(), scales[i * n:(i + 1) * n].view_as(q.scale))
    x = torch.randn(128, 512, requires_grad=True)
    spec = LinearSpec.of(recipe, "block")
    y = fp8_linear(x, weights[0], caches[0].q, None, spec)
    assert torch.equal(y, fp8_linear(x, weights[0], whole[0], None, spec))
    b = caches[1].q
    caches[1].adopt(weights[1], recipe, b.data, b.scale)  # the next step's, for the later layer
    y.sum().backward()
    assert caches[1].fresh(weights[1], recipe) and caches[1].q is b


@pytest.mark.parametrize("shape", [(256, 512), (384, 640)])  # 4 scale columns (a layout is the scale) and 5 (padded)
def test_layout_copies_bring_an_adopted_weights_scale_layouts_up_to_date(shape):
    """After the FP8 parameter gather writes a step's block scales in place, the pairs of block_layout_copies
    make scaled_mm's layouts of the adopted weight equal to those made afresh from the new scales, and a later
    adopt of the same tensors keeps them (it does not rebuild them from the scale on the host)."""
    from infir.fp8.gemm import block_layout_copies, scaled_mm_scale
    from infir.fp8.quantize import QTensor

    recipe = get_recipe("fp8_blockwise_ue8m0")
    w = torch.randn(*shape)
    q = WeightCache().get(w, recipe)
    cache = WeightCache()
    cache.adopt(w, recipe, q.data, q.scale.clone())
    adopted = cache.q
    scale = adopted.scale
    scale.copy_(torch.rand_like(scale) + 0.5)  # the next step's scales
    for dst, src in block_layout_copies(adopted):
        dst.copy_(src)
    cache.adopt(w, recipe, q.data, scale)
    assert cache.q is adopted
    fresh = QTensor(q.data, scale.clone(), "block", recipe.weight.scale_format, recipe.weight.fmt)
    for transposed in (False, True):
        assert torch.equal(scaled_mm_scale(adopted, transposed), scaled_mm_scale(fresh, transposed)), transposed
    assert len(block_layout_copies(adopted)) == (1 if shape[1] == 512 else 2)


def test_block_layout_refresh_updates_every_adopted_weights_layouts_at_once():
    """BlockLayoutRefresh: the layouts of several adopted weights whose scales are views of one vector (the FP8
    parameter gather's) are moved into one buffer and, after new scales are written into the vector, equal
    those made afresh from them; a layout that is the scale itself (4 scale columns) stays the scale."""
    from infir.fp8.gemm import scaled_mm_scale
    from infir.fp8.quantize import QTensor
    from infir.fp8.weight_cache import BlockLayoutRefresh

    recipe = get_recipe("fp8_blockwise_ue8m0")
    shapes = [(256, 512), (384, 640), (130, 300)]
    qs = [WeightCache().get(torch.randn(*shape), recipe) for shape in shapes]
    scales = torch.cat([q.scale.reshape(-1) for q in qs])
    caches, at = [], 0
    for shape, q in zip(shapes, qs):
        cache = WeightCache()
        cache.adopt(torch.zeros(shape), recipe, q.data, scales[at:at + q.scale.numel()].view(q.scale.shape))
        caches.append(cache)
        at += q.scale.numel()
    adopted = [c.q for c in caches]
    refresh = BlockLayoutRefresh(adopted, scales)
    assert scaled_mm_scale(adopted[0]).untyped_storage().data_ptr() == scales.untyped_storage().data_ptr()
    scales.copy_(torch.rand_like(scales) + 0.5)  # the next step's scales
    refresh()
    for q in adopted:
        fresh = QTensor(q.data, q.scale.clone(), "block", recipe.weight.scale_format, recipe.weight.fmt)
        for transposed in (False, True):
            assert torch.equal(scaled_mm_scale(q, transposed), scaled_mm_scale(fresh, transposed)), (q.data.shape, transposed)


def test_weight_refresh_replays_its_graph_only_where_every_weight_is_stale(monkeypatch):
    """The graph re-quantizes every weight from its parameter; a weight already fresh (its FP8 bytes adopted from
    the FP8 parameter gather, whose parameter holds only this rank's share up to date) must not be overwritten:
    the stale ones are then re-quantized eagerly, one by one."""
    from infir.model.fp8_linears import WeightRefresh

    model = _Layers("cpu")
    refresh = _refresh_of(model)
    model()  # the first fill
    replays = []
    monkeypatch.setattr(WeightRefresh, "_graphable", lambda self: True)
    monkeypatch.setattr(WeightRefresh, "_replay", lambda self: replays.append(len(self.linears)))
    kept = model.layers[0].weight_cache.q.data.clone()
    with torch.no_grad():
        for m in model.layers[1:]:
            m.weight.mul_(2.0)
        model.layers[0].weight.data.mul_(3.0)  # bytes the cache holds that the parameter no longer gives
    model.layers[0].weight_cache.mark_fresh(model.layers[0].weight, model.layers[0].recipe)
    model()
    assert replays == []
    assert torch.equal(model.layers[0].weight_cache.q.data.view(torch.uint8), kept.view(torch.uint8))
    for m in model.layers[1:]:
        want = WeightCache().get(m.weight, m.recipe)
        assert torch.equal(m.weight_cache.q.data.view(torch.uint8), want.data.view(torch.uint8))
    with torch.no_grad():
        for m in model.layers:  # an optimizer step: every weight stale, one replay
            m.weight.mul_(0.5)
    model()
    assert replays == [len(model.layers)]
