"""What a user notices (issue 32): progress bars that count what they say, a cost measured against the
unsteered model whatever the coefficients, and the units and resolution `sae eval` prints."""
import pytest
import torch
from tiny_trained import induction_model, repeated_batch

from circuitlab.analysis.steering import contrast_direction, steering_sweep

pytestmark = pytest.mark.usefixtures("one_thread")


class _Bar:
    """Records what a tqdm bar was told: its total, desc and every update."""
    made: list = []

    def __init__(self, iterable=None, total=None, desc=None, disable=False, **_):
        self.iterable, self.total, self.desc, self.disable, self.updates = iterable, total, desc, disable, []
        _Bar.made.append(self)

    def __iter__(self):
        for x in self.iterable:
            self.updates.append(1)
            yield x

    def update(self, n=1):
        self.updates.append(n)

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_the_eap_ig_bar_counts_path_points_not_chunks(monkeypatch):
    import circuitlab.analysis.edges.scoring as scoring
    from circuitlab.analysis.edges.discovery import induction_rows
    from circuitlab.analysis.patching import kl_to_clean

    model = induction_model()
    data = induction_rows(model.cfg.d_vocab, batch=2, half=4)
    monkeypatch.setattr(scoring, "tqdm", _Bar)
    _Bar.made = []
    with torch.no_grad():
        metric = kl_to_clean(model(data.clean))
    scoring.edge_scores(model, data.clean, data.corrupt, metric, method="eap-ig", steps=7, batch_size=3,
                        progress=True)
    bar = next(b for b in _Bar.made if b.desc == "EAP-IG")
    assert not bar.disable and bar.total == 7 and bar.updates == [3, 3, 1]   # 7 steps in chunks of 3


def test_the_steering_cost_is_against_the_unsteered_model_without_a_zero_coefficient():
    model = induction_model()
    gen = torch.Generator().manual_seed(0)
    positive, negative = [torch.full((12,), 3)] * 2, [torch.full((12,), 9)] * 2
    neutral = list(repeated_batch(4, gen))
    vec = contrast_direction(model, positive, negative, layer=1)
    with_zero = steering_sweep(model, vec, [0, 1, 2], positive, negative, neutral)
    without = steering_sweep(model, vec, [1, 2], positive, negative, neutral)
    torch.testing.assert_close(without.neutral_cost(), with_zero.neutral_cost()[1:])
    assert float(without.neutral_cost()[1]) != 0.0   # not measured against the sweep's first coefficient


def test_steer_shows_its_progress(tmp_path, capsys):
    from circuitlab.cli import main
    from circuitlab.data import CharTokenizer
    from circuitlab.training import save_checkpoint

    save_checkpoint(tmp_path / "ckpt", induction_model(), CharTokenizer("abcdefghijklmnopqrstuvw"))
    (tmp_path / "pos.txt").write_text("dddddddd\n")
    (tmp_path / "neg.txt").write_text("kkkkkkkk\n")
    assert main(["steer", "--checkpoint", str(tmp_path / "ckpt"), "--positive", str(tmp_path / "pos.txt"),
                 "--negative", str(tmp_path / "neg.txt"), "--neutral", str(tmp_path / "pos.txt"), "--layer", "1",
                 "--coef", "1", "2", "--samples", "1", "--max-tokens", "2", "--prompt", "abc",
                 "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "steering" in err and "2/2" in err, err   # the bar counts the coefficients
