"""The ready-made experiments behind `circuitlab interpret`: figures written, findings JSON-able."""
import json

import pytest
import torch

from circuitlab import CircuitlabError, ModelConfig, Transformer
from circuitlab.experiments.interpret import available_experiments

READING = ("circuits", "heads", "logit_lens", "attribution")
# interpret's experiments that read the model, each called on a prompt: fn(model, tokenizer, out_dir, prompt)
EXPERIMENTS = {name: (lambda model, tok, out, prompt, fn=fn: fn(model, tok, out, {"prompt": prompt}))
               for name, fn in available_experiments().items() if name in READING}


class CharTokenizer:
    vocab_size, eos_id = 128, 0

    def encode(self, text: str) -> list[int]:
        return [min(ord(c), 127) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


@pytest.mark.parametrize("preset", ["gpt2-tiny", pytest.param("attn-only-2l", marks=pytest.mark.slow)])
def test_every_experiment_writes_figures_and_json(preset, tmp_path):
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset(preset, d_model=32, n_heads=2, d_vocab=128, n_ctx=48))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert set(EXPERIMENTS) == {"circuits", "heads", "logit_lens", "attribution"}  # all four exist
    for name, run in EXPERIMENTS.items():
        found = run(model, CharTokenizer(), tmp_path, "Tom saw a cat. Tom saw a")
        json.dumps(found.to_dict())
        assert found.summary and found.figures, name
        for fig in found.figures:
            assert (tmp_path / fig).read_bytes()[:4] == b"\x89PNG", (name, fig)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    lens = EXPERIMENTS["logit_lens"](model, CharTokenizer(), tmp_path, None)  # default prompt
    assert lens.to_dict()["labels"] == ["embed", "L0", "L1"] and len(lens.to_dict()["tokens"]) == 48  # cropped to n_ctx
    with pytest.raises(CircuitlabError, match="no tokens"):
        EXPERIMENTS["attribution"](model, type("Empty", (CharTokenizer,), {"encode": lambda s, t: []})(),
                                   tmp_path, "x")


class LetterTokenizer:
    """Letters a.. for the hand-built model's 20 tokens."""
    vocab_size, eos_id = 20, None

    def encode(self, text: str) -> list[int]:
        return [ord(c) - ord("a") for c in text if "a" <= c <= "t"]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + i) for i in ids)


def test_experiments_find_the_hand_built_induction_circuit(tmp_path):
    """On forge's induction model the experiments must name what it was built to do: L1H0 the induction
    head, L0H0 its previous-token head; the lens and the attribution must agree with the model's logits."""
    from circuitlab.forge import build_induction_model

    model = build_induction_model(d_vocab=20, n_ctx=32).model
    tok = LetterTokenizer()
    circuits = EXPERIMENTS["circuits"](model, tok, tmp_path, "abcdefgabcdef")
    assert circuits.to_dict()["induction"]["head"] == "L1H0" and circuits.to_dict()["induction"]["labelled"]
    assert circuits.to_dict()["induction"]["prev_token_head"] == "L0H0"
    heads = EXPERIMENTS["heads"](model, tok, tmp_path, None)
    assert "induction" in heads.to_dict()["labels_by_head"]["L1H0"]
    assert "previous-token" in heads.to_dict()["labels_by_head"]["L0H0"]
    assert heads.to_dict()["icl"]["score"] < 0  # later tokens of tiled sequences are easier to predict
    prompt = "abcdefgabcdef"
    ids = torch.tensor(tok.encode(prompt))
    with torch.no_grad():
        logits = model(ids[None])[0, -1]
    lens = EXPERIMENTS["logit_lens"](model, tok, tmp_path, prompt)
    assert lens.to_dict()["top_strs"][-1][-1][0] == tok.decode([int(logits.argmax())]) == "g"  # induction: after f, g
    attribution = EXPERIMENTS["attribution"](model, tok, tmp_path, prompt)
    top2 = logits.topk(2).indices.tolist()
    assert attribution.to_dict()["answer"] == tok.decode([top2[0]])
    assert attribution.to_dict()["attribution"]["logit"] == pytest.approx(float(logits[top2[0]] - logits[top2[1]]),
                                                                      abs=1e-3)


def test_interpret_inputs_are_declared_once_for_the_command_line_run_interpret_and_the_methods(tmp_path, capsys):
    """InterpretInputs: `interpret`'s flags parse to its defaults; what the methods share (SHARED) is every input a
    method reads; a bad input is refused in one line by run_interpret before the model is read, and by the CLI."""
    from circuitlab.cli import build_parser, main
    from circuitlab.errors import InputError
    from circuitlab.experiments.interpret import SHARED, InterpretInputs, run_interpret
    from circuitlab.methods import REGISTRY

    def parsed(*argv: str) -> InterpretInputs:
        return InterpretInputs.from_args(build_parser().parse_args(["interpret", *argv]))

    assert parsed("--checkpoint", "runs/x") == InterpretInputs("runs/x").check() == \
        InterpretInputs.from_dict({"checkpoint": "runs/x"})
    given = parsed("--model", "runs/x", "--experiments", "heads", "patching", "--prompt", "Tom saw",
                   "--clean", "a b", "--corrupt", "c d", "--lens", "lens", "--out", "o")
    assert given == InterpretInputs("runs/x", ("heads", "patching"), "Tom saw", "a b", "c d", "lens", "o")
    assert InterpretInputs.from_dict(given.to_dict()) == given
    assert given.shared() == {"prompt": "Tom saw", "clean": "a b", "corrupt": "c d", "lens": "lens"}
    assert all(set(m.inputs) <= {*SHARED, "progress"} for m in REGISTRY.values())
    missing = tmp_path / "no-model"
    with pytest.raises(InputError, match=r"^--clean and --corrupt go together: give both or neither$"):
        run_interpret(missing, tmp_path / "out", clean="Tom saw a cat")
    with pytest.raises(InputError, match=r"^prompt must be text, got 3$"):
        run_interpret(missing, tmp_path / "out", prompt=3)
    assert main(["interpret", "--checkpoint", str(missing), "--corrupt", "Tom saw a dog"]) == 2
    assert capsys.readouterr().err.strip().endswith("--clean and --corrupt go together: give both or neither")
    assert not (tmp_path / "out").exists()
