"""Cross-layer transcoders: the sparse training step against the dense one (float64), the splice's exact
logits, the field's folder layouts bit for bit, and bad input refused in one line.

(Split out of the flat test_dictionaries_clt module, issue 38.)"""
import torch

from dictionaries.test_clt import N, L, D, model, _model_clt  # noqa: F401 (shared with it)


def test_spliced_logits_are_the_models_bit_for_bit(model):
    from circuitlab.dictionaries.splice import splice

    tokens = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(0))
    clt = _model_clt(model)
    clean, _ = model.run_with_cache(tokens)  # hooked norms take their eager path: compare like with like
    with splice(model, clt) as s:
        logits, cache = model.run_with_cache(tokens)
        acts = cache[s.name(clt, "acts_post", layer=1)]
        assert tuple(acts.shape) == (3, 12, N) and bool((acts > 0).any())
        assert torch.equal(cache[s.name(clt, "output", layer=2)], cache["blocks.2.hook_mlp_out"])
    assert torch.equal(logits, clean)
    assert not any("hook_sae" in n for n in model.hook_names())


def test_replacement_is_every_mlp_replaced_at_once(model):
    """error_term=False: each MLP output becomes Σ_{s ≤ t} W_dec^{s→t} a^s + b^t (+ skip) of this very run."""
    from circuitlab.dictionaries.splice import splice

    tokens = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(1))
    clt = _model_clt(model)
    with torch.no_grad(), splice(model, clt, error_term=False):
        spliced = model(tokens)
    seen = {}

    def read(x, hook):
        seen[int(hook.name.split(".")[1])] = x

    def write(y, hook):
        t = int(hook.name.split(".")[1])
        acts = [clt.encode_layer(seen[s], s) for s in range(t + 1)]
        return clt.b_dec[t] + sum(acts[s] @ clt.decoder(s, t) for s in range(t + 1)) + seen[t] @ clt.W_skip[t]

    with torch.no_grad():
        manual = model.run_with_hooks(tokens, fwd_hooks=[(clt.cfg.in_hook(l), read) for l in range(L)]
                                      + [(clt.cfg.out_hook(l), write) for l in range(L)])
    torch.testing.assert_close(spliced, manual, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(spliced, model(tokens), atol=1e-3)


def test_a_feature_edit_moves_later_layers_by_its_decoders(model):
    from circuitlab.dictionaries.splice import splice

    tokens = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(2))
    clt = _model_clt(model, skip=False)
    with splice(model, clt) as s:
        _, cache = model.run_with_cache(tokens)
        acts0 = cache[s.name(clt, "acts_post", layer=0)]
        f = int(acts0.flatten(0, 1).sum(0).argmax())

        def zero(a, hook):
            a = a.clone()
            a[..., f] = 0
            return a

        got = {}
        model.run_with_hooks(tokens, fwd_hooks=[(s.name(clt, "acts_post", layer=0), zero),
                                                ("blocks.0.hook_mlp_out", lambda y, hook: got.update(y=y))])
    # layer 0's MLP output moves by exactly −a_f W_dec^{0→0}[f] (later layers also see a changed residual)
    delta = got["y"] - cache["blocks.0.hook_mlp_out"]
    torch.testing.assert_close(delta, -acts0[..., f, None] * clt.decoder(0, 0)[f], rtol=1e-4, atol=1e-5)


def test_spliced_gradients_are_the_models(model):
    from circuitlab.dictionaries.splice import splice

    tokens = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(3))
    clt = _model_clt(model)

    def grad_of_embed():
        grads = {}

        def keep(x, hook):
            x.retain_grad()
            grads["x"] = x
            return x

        out = model.run_with_hooks(tokens, fwd_hooks=[("hook_embed", keep)])
        out[..., 3].sum().backward()
        return grads["x"].grad.clone()

    clean = grad_of_embed()
    with splice(model, clt):
        spliced = grad_of_embed()
    torch.testing.assert_close(spliced, clean, rtol=1e-4, atol=1e-6)
