"""Input attribution, the tuned lens and steering on a stories model trained here: the demo's recipe
(configs/demo.yaml, seed 0: a 2-layer attention-only model, BPE tokenizer, built-in stories and random
segments, 700 steps; about 45 s on an idle 2-core machine), trained once for the three tests."""
import pytest
import torch

from circuitlab.analysis.input_attribution import attribute_inputs
from circuitlab.analysis.steering import contrast_direction, steering_sweep
from circuitlab.analysis.lens.tuned import mean_kl_to_final, story_batches, train_tuned_lens
from circuitlab.data import generate_stories
from circuitlab.data.stories import ADJECTIVES, PLACES

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
N_SEQUENCES, HALF = 40, 16


@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    from circuitlab.training import RunConfig, train
    from circuitlab.training.config_files import resolve_config

    cfg = RunConfig.load(resolve_config("demo"), ["train.seed=0"])
    result = train(cfg, tmp_path_factory.mktemp("stories") / "2l", progress=False)
    return result.model.eval(), result.tokenizer


def test_attribution_falls_on_the_earlier_occurrence_and_its_next_token(stories):
    """r + r[:k] for a random r of distinct ordinary tokens: the model predicts r[k] (induction). The
    positions that matter for that logit are k - 1 (the earlier occurrence of the last token: the key the
    induction head finds through the previous-token head) and k (the token after it: the value it copies).
    Occlusion ranks k first in most sequences. Integrated gradients (zeros baseline) ranks k - 1 or k first
    every time, k - 1 more often than k on this model (measured 28 vs 12 of 40), and k always among its top
    three (the third is the last token, the query) (docs/attribution.md)."""
    model, tok = stories
    gen = torch.Generator().manual_seed(5)
    ordinary = torch.tensor([t for t in range(tok.vocab_size) if t != tok.eos_id])
    counts = {"model": 0, "occlusion top-1 k": 0, "ig top-1 k-1 or k": 0, "ig k in top-3": 0}
    for _ in range(N_SEQUENCES):
        r = ordinary[torch.randperm(len(ordinary), generator=gen)[:HALF]]
        k = int(torch.randint(2, HALF - 1, (1,), generator=gen))
        seq, answer = torch.cat([r, r[:k]]), int(r[k])
        with torch.no_grad():
            counts["model"] += int(model(seq[None])[0, -1].argmax()) == answer
        occlusion = attribute_inputs(model, seq, "occlusion", target=answer, replacement=tok.eos_id).scores
        counts["occlusion top-1 k"] += int(occlusion.argmax()) == k
        ig = attribute_inputs(model, seq, "ig", target=answer).scores
        top = ig.topk(3).indices.tolist()
        counts["ig top-1 k-1 or k"] += top[0] in (k - 1, k)
        counts["ig k in top-3"] += k in top
    assert counts["model"] >= 0.9 * N_SEQUENCES, counts  # the model does induction on these
    assert counts["occlusion top-1 k"] > N_SEQUENCES / 2, counts
    assert counts["ig top-1 k-1 or k"] >= 0.9 * N_SEQUENCES and counts["ig k in top-3"] >= 0.9 * N_SEQUENCES, counts


def test_tuned_lens_is_closer_to_the_final_distribution_than_the_logit_lens(stories):
    model, tok = stories
    lens = train_tuned_lens(model, story_batches(tok, n_batches=8, batch_size=16, seq_len=64), steps=150)
    held_out = story_batches(tok, n_batches=2, batch_size=16, seq_len=64, seed=2)
    tuned, logit = mean_kl_to_final(model, held_out, lens), mean_kl_to_final(model, held_out)
    assert (tuned[:-1] < 0.7 * logit[:-1]).all(), (tuned, logit)
    assert tuned[-1] == logit[-1] == 0


def _sentences(tok, template: str, animal: str, adjectives, places) -> list[torch.Tensor]:
    return [torch.tensor(tok.encode(template.format(adj=a, animal=animal, place=p)))
            for a in adjectives for p in places]


def test_a_contrast_direction_raises_the_preference_with_the_coefficient(stories):
    """Direction: 'The {adj} dragon went to {place}.' minus the same about a cat, before layer 1. Measured on
    other sentences (another template, other adjectives and places): the preference for the dragon ones
    rises at every step of the coefficient (measured -0.27, -0.19, -0.13, -0.05 nats per token: cat sentences
    are likelier to start with), at a cost on neutral stories (+0.40 nats at 4)."""
    model, tok = stories
    train_set = "The {adj} {animal} went to {place}."
    held_out = "Once upon a time, a {adj} {animal} lived near {place}."
    vec = contrast_direction(model, _sentences(tok, train_set, "dragon", ADJECTIVES[:5], PLACES[:4]),
                             _sentences(tok, train_set, "cat", ADJECTIVES[:5], PLACES[:4]), layer=1)
    neutral = [torch.tensor(tok.encode(s)[:model.cfg.n_ctx + 1]) for s in generate_stories(16, seed=2)]
    sweep = steering_sweep(model, vec, [0, 1, 2, 4],
                           _sentences(tok, held_out, "dragon", ADJECTIVES[5:], PLACES[4:8]),
                           _sentences(tok, held_out, "cat", ADJECTIVES[5:], PLACES[4:8]), neutral)
    pref = sweep.preference
    assert (pref[1:] > pref[:-1]).all() and pref[-1] - pref[0] > 0.1, sweep.table()
    assert sweep.neutral_cost()[0] == 0 and torch.isfinite(sweep.neutral_cost()).all()
