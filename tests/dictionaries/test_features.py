"""Feature dashboards and feature logits on planted cases: a feature wired to fire on one token gets
that token's contexts on top and its exact density; logit effects agree with the neuron view; feature
DLA adds up to the MLP's direct effect."""
import pytest
import torch

from circuitlab import ModelConfig
from circuitlab.analysis.logit_attribution import direct_logit_attribution, neuron_output_tokens
from circuitlab.dictionaries import DictionaryConfig, SparseDictionary
from circuitlab.dictionaries.feature_logits import feature_logit_attribution, feature_logit_effects
from circuitlab.dictionaries.features import FeatureDashboards, feature_activations, feature_dashboards
from circuitlab.errors import CircuitlabError
from helpers import random_model

pytestmark = pytest.mark.usefixtures("one_thread")
TOKEN = 7


@pytest.fixture(scope="module")
def model():
    cfg = ModelConfig.from_preset("gpt2-tiny", n_layers=2, d_model=32, n_heads=4, d_mlp=64, n_ctx=24, d_vocab=40)
    return random_model(cfg, scale=1.0).eval()


class Chars:
    """A tokenizer stand-in: token i is the letter chr(97 + i)."""

    def decode(self, ids):
        return "".join(chr(97 + int(i)) for i in ids)


def planted(model) -> SparseDictionary:
    """An SAE on hook_embed: feature 0 fires (0.2 + noise-free) on TOKEN only, feature 1 on tokens 3 and 4
    (more on 4), feature 2 never."""
    d = SparseDictionary(DictionaryConfig("relu", d_in=32, d_sae=3, hook_name="hook_embed"), seed=0)
    E = model.W_E.detach()
    with torch.no_grad():
        d.W_enc.zero_()
        d.W_enc[:, 0] = E[TOKEN] / E[TOKEN].pow(2).sum()
        d.b_enc[0] = -0.8
        for t, gain in ((3, 1.0), (4, 2.0)):
            d.W_enc[:, 1] += gain * E[t] / E[t].pow(2).sum()
        d.b_enc[1] = -0.5
        d.b_enc[2] = -100.0
    return d


def test_planted_feature_gets_its_token_contexts_and_exact_density(model, tmp_path):
    sae = planted(model)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 40, (4, 20), generator=gen) for _ in range(3)]
    for b in batches:
        b[torch.rand(b.shape, generator=gen) < 0.1] = TOKEN
    all_tokens = torch.cat(batches)
    acts = feature_activations(model, sae, all_tokens)
    assert torch.equal(acts[..., 0] > 0, all_tokens == TOKEN)  # the planting works as designed
    dash = feature_dashboards(model, sae, batches, k=5, before=3, after=2, tokenizer=Chars())
    contexts = dash.contexts(0)
    assert len(contexts) == 5
    for c in contexts:
        assert c["tokens"][c["at"]] == "h" and c["acts"][c["at"]] == pytest.approx(c["value"], abs=1e-5)
        assert int(all_tokens[c["seq"], c["pos"]]) == TOKEN  # sequence numbers run across batches
        assert c["ids"] == all_tokens[c["seq"], max(0, c["pos"] - 3):c["pos"] + 3].tolist()
    assert float(dash.density[0]) == pytest.approx(float((all_tokens == TOKEN).float().mean()))
    assert int(dash.hist_counts[0].sum()) == int((all_tokens == TOKEN).sum())
    # Feature 1: its strongest contexts are token 4 (gain 2), before any token 3.
    values = [c["tokens"][c["at"]] for c in dash.contexts(1)]
    n4 = int((all_tokens == 4).sum())
    assert values[:min(n4, 5)] == ["e"] * min(n4, 5)
    assert dash.contexts(2) == [] and float(dash.density[2]) == 0
    assert dash.summary()["dead_fraction"] == pytest.approx(1 / 3)
    logits = dash.logit_tokens(0)
    assert len(logits["promoted"]) == 10 and logits["promoted"][0]["value"] >= logits["promoted"][-1]["value"]
    back = FeatureDashboards.load(dash.save(tmp_path / "dash"))
    assert back.feature(1) == dash.feature(1) and back.summary() == dash.summary()
    with pytest.raises(CircuitlabError, match="not in these dashboards"):
        feature_dashboards(model, sae, batches, features=[0, 1]).feature(2)
    with pytest.raises(CircuitlabError, match="no dashboards"):
        FeatureDashboards.load(tmp_path)
    meta = next((tmp_path / "dash").glob("*.json"))
    meta.write_bytes(meta.read_bytes() + b"\xe9")
    with pytest.raises(CircuitlabError, match=rf"{meta.name} is not UTF-8 text: byte \d+"):
        FeatureDashboards.load(tmp_path / "dash")


def test_logit_effects_of_an_identity_dictionary_are_the_neuron_view(model):
    d = SparseDictionary(DictionaryConfig("relu", d_in=64, d_sae=64, hook_name="blocks.1.mlp.hook_post"), seed=0)
    with torch.no_grad():
        d.W_dec.copy_(torch.eye(64))
    effects = feature_logit_effects(model, d, [3, 17])
    neurons = neuron_output_tokens(model, 1, [3, 17], k=5)
    torch.testing.assert_close(effects.topk(5).values, neurons.top_values)


def test_feature_dla_adds_up_to_the_mlp_direct_effect(model):
    tokens = torch.randint(0, 40, (2, 10), generator=torch.Generator().manual_seed(1))
    d = SparseDictionary(DictionaryConfig("relu", d_in=64, d_sae=96, hook_name="blocks.1.mlp.hook_post"), seed=2)
    with torch.no_grad():
        d.b_dec.normal_(0, 0.1)
    dla = feature_logit_attribution(model, d, tokens, answer=5, wrong=[6, 9], pos=-2)
    _, cache = model.run_with_cache(tokens)
    reference = direct_logit_attribution(model, cache, answer=5, wrong=[6, 9], pos=-2)
    mlp = reference.attributions[reference.labels.index("L1 MLP")]
    torch.testing.assert_close(dla.attributions.sum(0) + dla.error + dla.bias + dla.skip, mlp, atol=1e-4, rtol=1e-4)
    assert (dla.attributions != 0).any() and dla.pos == 8
    with pytest.raises(CircuitlabError, match="residual stream"):
        feature_logit_effects(model, SparseDictionary(DictionaryConfig("relu", d_in=32, d_sae=8,
                                                                       hook_name="blocks.0.ln2.hook_normalized")))


def test_dashboards_report_is_self_contained_and_highlights_the_planted_token(model, tmp_path):
    from circuitlab.report.features import default_features, write_dashboards_report

    sae = planted(model)
    tokens = torch.randint(0, 40, (4, 20), generator=torch.Generator().manual_seed(3))
    tokens[:, 5] = TOKEN
    dash = feature_dashboards(model, sae, tokens, tokenizer=Chars())
    assert default_features(dash) == [0, 1] or default_features(dash) == [1, 0]  # the dead feature is left out
    path = write_dashboards_report(tmp_path, dash, metrics={"explained variance": 0.91},
                                   summary=["Feature 0 fires on **h** only."], notes={0: "the planted feature"})
    page = path.read_text()
    assert path.name == "report.html" and "<script src" not in page and "Feature 0" in page
    assert 'class="tok at"' in page and "explained variance" in page and "the planted feature" in page
    assert "never fired" in page  # the density figure's title counts the dead feature
    import circuitlab.viz.features  # noqa: F401  registers the Jupyter display

    assert "feature-card" in dash._repr_html_()


def test_sae_dashboards_command_writes_dashboards_and_report(tmp_path, capsys):
    from circuitlab import Transformer
    from circuitlab.cli import main
    from circuitlab.data.stories import stories_text
    from circuitlab.data.tokenizers import CharTokenizer
    from circuitlab.dictionaries import base_model_id
    from circuitlab.training import save_checkpoint

    tokenizer = CharTokenizer.from_texts([stories_text(300, seed=1)])
    torch.manual_seed(0)
    net = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=tokenizer.vocab_size, n_ctx=64))
    save_checkpoint(tmp_path / "run" / "checkpoint", net, tokenizer)
    cfg = DictionaryConfig("relu", d_in=16, d_sae=12, hook_name="blocks.0.hook_resid_post", base_model=base_model_id(net))
    SparseDictionary(cfg, seed=0).save(tmp_path / "sae")
    args = ["sae", "dashboards", "--dictionary", str(tmp_path / "sae"), "--checkpoint", str(tmp_path / "run"),
            "--tokens", "1024", "--no-progress"]
    assert main(args + ["--features", "0", "3"]) == 0
    dash = FeatureDashboards.load(tmp_path / "sae" / "dashboards")
    assert dash.n_tokens == 1024 and dash.d_sae == 12
    page = (tmp_path / "sae" / "dashboards" / "report.html").read_text()
    assert page.count('class="feature-card"') == 2
    assert "never fired" in capsys.readouterr().out
    assert main(args + ["--features", "12"]) == 2
    assert "outside the dictionary's 12 features" in capsys.readouterr().err
    # a second run keeps the first (renamed), --overwrite replaces it; never silently
    assert main(args) == 0 and "kept the earlier dashboards as" in capsys.readouterr().out
    assert len(list(tmp_path.joinpath("sae").glob("dashboards.*"))) == 1
    assert main(args + ["--overwrite"]) == 0 and len(list(tmp_path.joinpath("sae").glob("dashboards.*"))) == 1
    with pytest.raises(SystemExit):
        main(args[:-3] + ["--tokens", "100000000000", "--no-progress"])
    assert "argument --tokens: must be a whole number from 1 to 4194304" in capsys.readouterr().err
    other = SparseDictionary(cfg.replace(base_model={**cfg.base_model, "weights_sha": "0" * 16}))
    other.save(tmp_path / "other")
    assert main(["sae", "dashboards", "--dictionary", str(tmp_path / "other"), "--checkpoint", str(tmp_path / "run")]) == 2
    assert main(["sae"]) == 2  # no subcommand: a one-line error
