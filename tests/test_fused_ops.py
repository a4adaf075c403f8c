"""The fused CPU kernels (engine/models/fused.py): each equals the plain-torch reference it
replaces, the model gives the same logits and tokens with and without them, they are taken
only where they should be, and a decode step runs fewer operators with them."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import profile

from labsupport.engine.generation import generate
from labsupport.engine.models import fused
from labsupport.engine.models.transformer import RMSNorm, rotate_queries_and_keys

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module", autouse=True)
def kernels():
    reason = fused.load()
    if reason is not None:
        pytest.skip(f"the fused kernels are not available here: {reason}")


def norm_and_inputs(dtype, size=203, rows=(5, 7)):                  # 203: no vector width divides it
    torch.manual_seed(0)
    norm = RMSNorm(size, 1e-5).to(dtype)
    norm.weight.data = torch.randn(size).to(dtype)
    return norm, (3 * torch.randn(*rows, size)).to(dtype), torch.randn(*rows, size).to(dtype)


def ulps(a, b):
    """The largest difference of a and b in units of the last place of their dtype at 1.0."""
    return ((a.float() - b.float()).abs() / (a.float().abs().clamp(min=1) * torch.finfo(a.dtype).eps)).max().item()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_norm_and_the_add_then_norm_equal_the_reference(dtype):
    norm, x, delta = norm_and_inputs(dtype)                           # 35 rows: two threads' worth
    with torch.no_grad():
        fast, (total, fast_after) = norm(x), norm.add_and_norm(x, delta)
        with fused.switched(False):
            slow, (slow_total, slow_after) = norm(x), norm.add_and_norm(x, delta)
    assert torch.equal(total, slow_total)                             # the residual add: one rounding
    assert ulps(fast, slow) <= 8 and ulps(fast_after, slow_after) <= 8   # sum of squares in another order
    assert fast.dtype == dtype and fast.shape == x.shape


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads", [0, 9, 12, 15])
def test_the_rotation_equals_the_reference_exactly(dtype, heads):
    torch.manual_seed(1)
    qkv = torch.randn(2, 17, 15, 64).to(dtype)                        # (B, T, heads + 2 kv, D)
    cos, sin = torch.randn(2, 17, 64).to(dtype), torch.randn(2, 17, 64).to(dtype)
    with torch.no_grad():
        fast = rotate_queries_and_keys(qkv, cos, sin, heads)
        with fused.switched(False):
            slow = rotate_queries_and_keys(qkv, cos, sin, heads)
    assert torch.equal(fast, slow)                                    # the same two roundings, then the add


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_swiglu_product_equals_the_reference(dtype, tiny_llama):
    torch.manual_seed(2)
    gate_up = (4 * torch.randn(3, 19, 2 * 75)).to(dtype)              # 57 rows, an odd width
    fast = torch.ops.labsupport.silu_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    assert ulps(fast, torch.nn.functional.silu(gate) * up) <= 4       # exp: libm's, not Sleef's
    mlp = tiny_llama.blocks[0].mlp
    x = torch.randn(2, 3, tiny_llama.config.hidden_size)
    with torch.no_grad():
        fused_out = mlp(x)
        with fused.switched(False):
            assert torch.allclose(fused_out, mlp(x), rtol=1e-5, atol=1e-6)


def test_taken_only_on_a_cpu_without_gradients_and_when_switched_on():
    x = torch.ones(2, 8)
    with torch.no_grad():
        assert fused.active(x)
        assert not fused.active(x.to(torch.float64))                  # a dtype the kernels do not take
        assert not fused.active(torch.ones(2, 8, device="meta"))     # any device but the CPU
        with fused.switched(False):
            assert not fused.active(x)
            assert "switched off" in fused.unavailable()
        assert fused.active(x) and fused.unavailable() is None        # the setting before comes back
    assert not fused.active(x)                                        # gradients on: no backward here


def test_gradients_still_flow_through_the_reference_path():
    norm, x, delta = norm_and_inputs(torch.float32)
    x.requires_grad_(True)
    total, normed = norm.add_and_norm(x, delta)
    (normed.sum() + total.sum()).backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_the_model_gives_the_same_logits_and_tokens_with_and_without_them(tiny_llama):
    ids = list(range(3, 40))
    tokens = torch.tensor([ids])
    with torch.no_grad():
        fast = tiny_llama.logits(tiny_llama(tokens))
        with fused.switched(False):
            slow = tiny_llama.logits(tiny_llama(tokens))
    assert (fast - slow).abs().max() <= 1e-4 * slow.abs().max()
    with fused.switched(False):
        reference = generate(tiny_llama, ids, 24, eos_token_ids=()).row(0)
    assert generate(tiny_llama, ids, 24, eos_token_ids=()).row(0) == reference


def test_a_decode_step_runs_fewer_operators(tiny_llama):
    ids = list(range(3, 20))

    def operators_per_run():
        generate(tiny_llama, ids, 4, eos_token_ids=())                # warm
        with profile() as run:
            generate(tiny_llama, ids, 4, eos_token_ids=())
        return sum(1 for event in run.events() if event.name.startswith("aten::"))

    fewer = operators_per_run()
    with fused.switched(False):
        more = operators_per_run()
    layers, passes = tiny_llama.config.num_layers, 4
    assert more - fewer >= 10 * layers * passes, (more, fewer)       # at least ten fewer per layer and pass


def bad_calls():
    """(name, call) of every op given what its checks refuse: one RuntimeError each, no crash."""
    ops = torch.ops.labsupport
    x, w = torch.randn(3, 8), torch.randn(8)
    qkv, cs = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 4)
    return [
        ("norm: non-contiguous x", lambda: ops.rms_norm(torch.randn(8, 3).t(), torch.randn(3), 1e-5)),
        ("norm: weight of the wrong width", lambda: ops.rms_norm(x, torch.randn(7), 1e-5)),
        ("norm: weight of another dtype", lambda: ops.rms_norm(x, w.double(), 1e-5)),
        ("norm: an empty last dimension", lambda: ops.rms_norm(torch.randn(3, 0), torch.randn(0), 1e-5)),
        ("norm: integers", lambda: ops.rms_norm(x.int(), w.int(), 1e-5)),
        ("add+norm: delta of another shape", lambda: ops.add_rms_norm(x, torch.randn(2, 8), w, 1e-5)),
        ("add+norm: delta of another dtype", lambda: ops.add_rms_norm(x, x.bfloat16(), w, 1e-5)),
        ("rope: qkv not 4-D", lambda: ops.rope(qkv[0], cs, cs, 3)),
        ("rope: an odd head_dim", lambda: ops.rope(torch.randn(1, 2, 5, 3), torch.randn(1, 2, 3),
                                                   torch.randn(1, 2, 3), 3)),
        ("rope: more rotated heads than heads", lambda: ops.rope(qkv, cs, cs, 6)),
        ("rope: negative heads", lambda: ops.rope(qkv, cs, cs, -1)),
        ("rope: cos of the wrong shape", lambda: ops.rope(qkv, cs[:, :1], cs[:, :1], 3)),
        ("rope: cos of another dtype", lambda: ops.rope(qkv, cs.bfloat16(), cs.bfloat16(), 3)),
        ("swiglu: an odd last dimension", lambda: ops.silu_mul(torch.randn(2, 7))),
        ("swiglu: an empty last dimension", lambda: ops.silu_mul(torch.randn(2, 0))),
        ("swiglu: non-contiguous", lambda: ops.silu_mul(torch.randn(8, 2).t())),
    ]


@pytest.mark.parametrize("name, call", bad_calls(), ids=[name for name, _ in bad_calls()])
def test_each_op_refuses_bad_arguments_with_one_sentence(name, call):
    with pytest.raises(RuntimeError) as error:
        call()
    first_line = str(error.value).strip().splitlines()[0]
    assert any(first_line.startswith(op + ":") for op in ("rms_norm", "add_rms_norm", "rope", "silu_mul")) \
        or "expected scalar type" in first_line or "not implemented for" in first_line, first_line
    assert "must" in first_line or "only" in first_line or "not implemented for" in first_line, first_line


def test_loading_a_model_prepares_the_kernels_and_a_forward_pass_never_builds_them():
    """Issue 39: weight loading (apply_layout), not the model's forward, prepares the fused CPU
    kernels. In a fresh process: a model made without the loader's layout step runs the plain
    path, and loading one loads the kernels (where they build here)."""
    import subprocess
    import sys
    code = ("import torch\n"
            "from labsupport.engine.models import fused\n"
            "from labsupport.weights.fixtures import random_model\n"
            "bare = random_model('tiny-llama', layout=False)\n"
            "with torch.inference_mode():\n"
            "    bare(torch.tensor([[1, 2, 3]]))\n"
            "print(fused.LOADED)\n"
            "random_model('tiny-llama')\n"
            "print(fused.LOADED, fused.unavailable() is None)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    first, second = out.stdout.split("\n")[:2]
    assert first == "False"
    loaded, builds = second.split()
    assert loaded == builds                           # loaded exactly where the kernels build
