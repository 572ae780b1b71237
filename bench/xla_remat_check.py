"""What JAX and XLA keep, recompute and communicate for one Llama-style layer (MaxText's llama2 block, fp32
weights cast to bf16 in the layer), the facts behind the planner's TPU rules (catalog.GPU.xla_step,
docs/planner.md "TPUs run the step as one XLA program"). Prints, never asserts. Needs JAX, which shoal
does not depend on; XLA's CPU backend stands in for the TPU's (the same JAX remat, the same SPMD partitioner
and dead-code elimination; CPU widens bf16 collectives to f32, so a bf16 value shows as an f32->bf16->f32
round trip feeding the collective):

    python -m venv /tmp/jax && /tmp/jax/bin/pip install jax && /tmp/jax/bin/python bench/xla_remat_check.py
"""

import os
import re

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

try:
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import print_saved_residuals
except ImportError:
    raise SystemExit("bench/xla_remat_check.py needs JAX, which shoal does not depend on: "
                     "python -m venv /tmp/jax && /tmp/jax/bin/pip install jax && /tmp/jax/bin/python bench/xla_remat_check.py")

B, S, H, N, D, F = 2, 256, 512, 8, 64, 1536
BF = jnp.bfloat16
SHAPES = dict(wq=(H, N, D), wk=(H, N, D), wv=(H, N, D), wo=(N, D, H), w0=(H, F), w1=(H, F), w2=(F, H))
MINIMAL = jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims  # MaxText's remat_policy=minimal


def rms(x):
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x.astype(jnp.float32)), -1, keepdims=True) + 1e-5).astype(x.dtype)


def layer(p, x):
    p = jax.tree.map(lambda w: w.astype(BF), p)
    h = rms(x)
    q, k, v = (jnp.einsum("bse,end->bsnd", h, p[n]) for n in ("wq", "wk", "wv"))
    s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), jnp.einsum("bqnd,bknd->bnqk", q, k) / D**0.5, -1e9)
    a = jnp.einsum("bnqk,bknd->bqnd", jax.nn.softmax(s.astype(jnp.float32)).astype(BF), v)
    x = x + jnp.einsum("bsnd,nde->bse", a, p["wo"])
    h = rms(x)
    g, u = jnp.einsum("bse,ef->bsf", h, p["w0"]), jnp.einsum("bse,ef->bsf", h, p["w1"])
    return x + jnp.einsum("bsf,fe->bse", jax.nn.silu(g) * u, p["w2"])


def grad_flops(fn, params, x, n_layers):
    def loss(ps, x):
        for i in range(n_layers):
            x = fn(jax.tree.map(lambda w: w[i], ps), x)
        return x.astype(jnp.float32).sum()
    stacked = {n: jnp.stack([w] * n_layers) for n, w in params.items()}
    cost = jax.jit(jax.grad(loss)).lower(stacked, x).compile().cost_analysis()
    return (cost[0] if isinstance(cost, list) else cost)["flops"]


@jax.custom_vjp
def cross_entropy(logits, onehot):
    """MaxText's loss (max_utils.cross_entropy_with_logits, after T5X): a custom_vjp whose forward names the
    logits, the one-hot targets, exp(logits - max) and the log-softmax as residuals."""
    return -jnp.sum(onehot * jax.nn.log_softmax(logits), axis=-1)


def _cross_entropy_fwd(logits, onehot):
    shifted = logits - logits.max(-1, keepdims=True)
    exp = jnp.exp(shifted)
    total = exp.sum(-1, keepdims=True)
    log_softmax = shifted - jnp.log(total)
    return -jnp.sum(onehot * log_softmax, axis=-1), (logits, onehot, exp, total, log_softmax)


def _cross_entropy_bwd(res, g):
    _, onehot, exp, total, _ = res
    return g[..., None] * (exp / total - onehot), None


cross_entropy.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)


def loss_bytes_per_logit(tokens, vocab):
    """XLA's temporary bytes for the output head and the loss, forward and backward, per logit: bf16 logits cast
    to fp32 (MaxText's cast_logits_to_fp32) into the loss above."""
    def step(w, h, targets):
        logits = jnp.einsum("th,hv->tv", h, w.astype(BF)).astype(jnp.float32)
        return cross_entropy(logits, jax.nn.one_hot(targets, vocab, dtype=jnp.float32)).mean()
    args = (jnp.zeros((H, vocab), jnp.float32), jnp.zeros((tokens, H), BF), jnp.zeros((tokens,), jnp.int32))
    compiled = jax.jit(jax.grad(step, argnums=(0, 1))).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes / (tokens * vocab)


def main():
    key = jax.random.PRNGKey(0)
    params = {n: jax.random.normal(key, s, jnp.float32) * 0.02 for n, s in SHAPES.items()}
    x = jax.random.normal(key, (B, S, H), BF)
    print("Residuals under checkpoint_dots_with_no_batch_dims (expect: x, q, k, v, the output projection's")
    print("output, w0's and w1's outputs; not w2's output, not the attention output):")
    print_saved_residuals(lambda p, x: jax.checkpoint(layer, policy=MINIMAL)(p, x).astype(jnp.float32).sum(),
                          params, x)

    T, core = B * S, 2 * 2 * B * N * S * S * D
    fwd = 2 * T * (H * 3 * N * D + N * D * H + H * 2 * F + F * H) + core
    per_layer = lambda fn: (grad_flops(fn, params, x, 6) - grad_flops(fn, params, x, 3)) / 3  # noqa: E731
    base = per_layer(layer)
    print(f"\nRecomputed FLOPs a layer (XLA's cost analysis; the whole forward {fwd:.4g}, less w2 "
          f"{fwd - 2 * T * F * H:.4g}, the attention core's forward {core:.4g}):")
    for name, fn in (("full", jax.checkpoint(layer)), ("minimal", jax.checkpoint(layer, policy=MINIMAL))):
        print(f"  {name:8s} {per_layer(fn) - base:.4g}")

    print("\nThe head and loss, temporary bytes per logit (expect about 4, the fp32 logits: the softmax, its")
    print("gradient and the one-hot targets are made inside the ops that read them, not kept):")
    for tokens, vocab in ((4096, 32000), (4096, 128256)):
        print(f"  {tokens} tokens x {vocab} vocabulary: {loss_bytes_per_logit(tokens, vocab):.2f}")

    mesh = jax.sharding.Mesh(jax.devices(), ("fsdp",))
    P = jax.sharding.PartitionSpec
    spec = dict(wq=P("fsdp"), wk=P("fsdp"), wv=P("fsdp"), wo=P(None, None, "fsdp"), w0=P("fsdp"),
                w1=P("fsdp"), w2=P(None, "fsdp"))
    shard = {n: jax.sharding.NamedSharding(mesh, spec[n]) for n in params}
    ps = {n: jax.device_put(w, shard[n]) for n, w in params.items()}
    xs = jax.device_put(jax.random.normal(key, (16, S, H), BF), jax.sharding.NamedSharding(mesh, P("fsdp")))
    hlo = jax.jit(jax.grad(lambda p, x: layer(p, x).astype(jnp.float32).sum()), out_shardings=shard) \
        .lower(ps, xs).compile().as_text()
    print("\nFSDP over 8 devices, what each collective's operand computes (expect: a bf16 round trip, i.e. the")
    print("weights gathered after their cast to bf16 and the gradients reduced before the cast back):")
    for m in re.finditer(r"[})] (all-gather|all-reduce|reduce-scatter)\(%([\w.\-]+)", hlo):
        fusion = re.search(r"%" + re.escape(m.group(2)) + r" = [^\n]*calls=%([\w.\-]+)", hlo)
        body = re.search(r"%" + re.escape(fusion.group(1)) + r" [^{]*\{(.*?)\n\}", hlo, re.S).group(1) if fusion else ""
        dtypes = " -> ".join(re.findall(r"= (\w+)\[", body))
        print(f"  {m.group(1)}: {dtypes or m.group(2)}")


if __name__ == "__main__":
    main()
