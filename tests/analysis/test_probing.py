"""Linear probes: easy tasks are learnt where the information is, the random-label control is not."""
import json

import pytest
import torch

from circuitlab import CircuitlabError
from circuitlab.analysis.probing import (ProbeTask, builtin_task, probe_points, random_sequences, train_probe,
                                         train_probes)
from circuitlab.viz.probing import probe_figure
from analysis.patching.test_path import V, induction_model


pytestmark = pytest.mark.usefixtures("one_thread")


def test_tasks_label_what_they_say():
    model = induction_model()
    tokens = torch.tensor([[3, 5, 3, 7, 5]])
    labels, valid = builtin_task(model, "prev_token").labels(tokens)
    assert labels[0, 1:].tolist() == [3, 5, 3, 7] and valid[0].tolist() == [False, True, True, True, True]
    labels, valid = builtin_task(model, "prev_token_2").labels(tokens)
    assert labels[0, 2:].tolist() == [3, 5, 3] and valid[0, :2].tolist() == [False, False]
    assert builtin_task(model, "repeat").labels(tokens)[0][0].tolist() == [0, 0, 1, 0, 1]
    assert builtin_task(model, "position").labels(tokens)[0][0].tolist() == [0, 1, 2, 3, 4]
    assert builtin_task(model, "position_value").n_classes == 0


def test_probes_find_the_previous_token_after_the_previous_token_head():
    """In the hand-built model the previous token is written into the residual stream by L0H0: a
    probe cannot read it from the embeddings (before layer 0) but reads it exactly after layer 0.
    Position is one-hot in the embeddings, so it is readable everywhere."""
    model = induction_model()
    seen = []
    model.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[0]))
    data = random_sequences(V, n_batches=6, batch=16, pos=12, tiled=False)
    res = train_probes(model, data, ["prev_token", "position", "position_value"], epochs=3, progress=False)
    assert max(seen) == 16  # activations are computed one batch at a time
    assert len(seen) == 6 * (3 + 1)  # one forward per batch per epoch, plus the evaluation pass
    prev = res["prev_token"]
    assert prev.points == ["L0 in", "L1 in", "L1 out"]
    assert prev.val_score[1] > 0.95 and prev.val_score[2] > 0.95
    assert prev.val_score[0] < 0.3  # the current token says nothing about the previous one
    assert (prev.control_score < prev.chance + 0.1).all()  # random labels: no better than the majority class
    assert (prev.selectivity()[1:] > 0.6).all()
    assert (res["position"].val_score > 0.95).all()
    assert res["position_value"].score == "r2" and (res["position_value"].val_score > 0.95).all()
    assert (res["position_value"].control_score < 0.1).all()
    assert prev.n_val == 6 * 4 * 11 and prev.n_train == 6 * 12 * 11  # 4 of 16 sequences held out; 11 labelled positions
    json.dumps({k: v.to_dict() for k, v in res.items()})


def test_custom_task_tensor_data_and_figure(tmp_path):
    model = induction_model()
    tokens = torch.randint(0, V, (48, 10), generator=torch.Generator().manual_seed(0))
    # "is the previous token < 5": readable after layer 0 only
    def labels(t):
        out = torch.zeros_like(t)
        out[:, 1:] = (t[:, :-1] < 5).long()
        valid = torch.ones_like(t, dtype=torch.bool)
        valid[:, 0] = False
        return out, valid
    res = train_probe(model, tokens, ProbeTask("prev_small", labels, 2), batch_size=16, progress=False)
    assert res.val_score[1] > 0.95 and res.val_score[0] < 0.75
    path = probe_figure(res).save_png(tmp_path / "probe.png")
    assert path.is_file() and path.stat().st_size > 1000


def test_probe_bad_input():
    model = induction_model()
    data = random_sequences(V, n_batches=2, batch=8, pos=8)
    with pytest.raises(CircuitlabError, match="unknown probing task 'colour'"):
        train_probes(model, data, ["colour"])
    with pytest.raises(CircuitlabError, match="no such hook point"):
        train_probes(model, data, ["position"], points=["blocks.7.hook_resid_pre"])
    with pytest.raises(CircuitlabError, match="one-shot iterator"):
        train_probes(model, iter([torch.zeros(4, 8, dtype=torch.long)]), ["position"])
    with pytest.raises(CircuitlabError, match="at least 2 sequences"):
        train_probes(model, [torch.zeros(1, 8, dtype=torch.long)], ["position"], epochs=1)
    with pytest.raises(CircuitlabError, match="outside the vocabulary"):
        train_probes(model, [torch.full((4, 8), 99)], ["position"], epochs=1)
    assert probe_points(model) == ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre", "blocks.1.hook_resid_post"]
