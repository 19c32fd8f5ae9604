"""`circuitlab interpret` on a tiny random model of every family: it runs each experiment whose assumptions hold
and skips the others with one warning each; one asked for by name that cannot run is one line. The table in
docs/pretrained.md ("`circuitlab interpret` on each family") is compared with what the code accepts (fast), and
every cell is run (slow): a ✓ runs, a skipped one is refused by the analysis itself when called directly."""
import math
import re
import warnings
from pathlib import Path

import pytest
import torch

import helpers
from circuitlab import ModelConfig

ROOT = Path(__file__).resolve().parents[2]
COMMON = dict(n_ctx=32, norm="rmsnorm", norm_eps=1e-6, positional="rotary", bias=False)
# Each family's switches on tiny odd sizes (the columns of the doc's table; same switches as
# tests/pretrained/test_families_analyses.py, and GPT-2, GPT-NeoX and LLaMA beside them).
FAMILIES = {
    "GPT-2": dict(n_layers=2, d_model=32, n_heads=4, d_mlp=64, n_ctx=32, norm="layernorm", positional="learned",
                  mlp="gelu_new", bias=True, tied_embeddings=True),
    "GPT-NeoX": dict(COMMON, n_layers=2, d_model=32, n_heads=4, d_mlp=48, norm="layernorm", norm_eps=1e-5, bias=True,
                     rotary_dim=4, mlp="gelu", parallel_attn_mlp=True),
    "LLaMA": dict(COMMON, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_mlp=40, mlp="swiglu"),
    "Qwen3": dict(COMMON, n_layers=2, d_model=40, n_heads=5, n_kv_heads=1, d_head=6, d_mlp=26, mlp="swiglu",
                  qk_norm="head", tied_embeddings=True),
    "Gemma-2": dict(COMMON, n_layers=3, d_model=36, n_heads=3, n_kv_heads=1, d_head=10, d_mlp=50, mlp="geglu",
                    tied_embeddings=True, block_norms="sandwich", embed_scale=6.0, attn_scale=math.sqrt(20),
                    attn_softcap=1.5, logit_softcap=2.5, sliding_window=4, sliding_layers=[0, 2]),
    "Gemma-3": dict(COMMON, n_layers=4, d_model=28, n_heads=4, n_kv_heads=2, d_head=8, d_mlp=34, mlp="geglu",
                    tied_embeddings=True, block_norms="sandwich", qk_norm="head", embed_scale=math.sqrt(28),
                    attn_scale=math.sqrt(12), local_rotary_base=50.0, sliding_window=3, sliding_layers=[0, 2]),
    "OLMo-2": dict(COMMON, n_layers=2, d_model=36, n_heads=6, n_kv_heads=2, d_mlp=46, mlp="swiglu",
                   block_norms="post", qk_norm="full"),
    "Phi-3": dict(COMMON, n_layers=2, d_model=48, n_heads=4, n_kv_heads=2, d_mlp=38, mlp="swiglu", sliding_window=5),
    "GPT-J": dict(COMMON, n_layers=2, d_model=48, n_heads=4, d_mlp=50, norm="layernorm", norm_eps=1e-5, bias=True,
                  rotary_dim=6, rotary_interleaved=True, mlp="gelu_new", parallel_attn_mlp=True),
}
OPTS = dict(prompt="Lily saw a cat. Lily", clean="Lily saw a cat.", corrupt="Lily saw a dog.", subject="Lily")


def doc_table() -> dict[str, dict[str, bool]]:
    """experiment -> family -> whether the doc says it runs (✓) or is skipped."""
    text = (ROOT / "docs" / "pretrained.md").read_text()
    section = text[text.index("### `circuitlab interpret` on each family"):]
    lines = section.splitlines()
    start = next(i for i, r in enumerate(lines) if r.startswith("|"))
    rows = [r for r in lines[start:][:next(i for i, r in enumerate(lines[start:]) if not r.startswith("|"))]]
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    assert head[0] == "experiment" and head[1:] == list(FAMILIES), head
    table = {}
    for row in rows[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert set(cells[1:]) <= {"✓", "skipped"}, row
        table[cells[0]] = {fam: cell == "✓" for fam, cell in zip(FAMILIES, cells[1:])}
    return table


def accepted() -> dict[str, dict[str, bool]]:
    from circuitlab.experiments.interpret import experiment_needs, experiments_for

    runs = {fam: experiments_for(ModelConfig(d_vocab=48, **cfg))[0] for fam, cfg in FAMILIES.items()}
    return {name: {fam: name in runs[fam] for fam in FAMILIES} for name in experiment_needs()}


def test_the_docs_table_is_what_the_code_accepts():
    assert doc_table() == accepted()


def test_experiments_for_skips_with_a_reason_and_refuses_a_named_one():
    from circuitlab.errors import ConfigError
    from circuitlab.experiments.interpret import experiments_for

    olmo = ModelConfig(d_vocab=48, **FAMILIES["OLMo-2"])
    run, skipped = experiments_for(olmo)
    assert "circuits" not in run and "heads" in run and list(skipped) == ["circuits"]
    assert "post norms" in skipped["circuits"]
    with pytest.raises(ConfigError, match=r"^the circuits experiment assumes .*post norms.*: leave circuits out of --experiments$"):
        experiments_for(olmo, ["logit_lens", "circuits"], by_name=True)
    assert experiments_for(olmo, ["logit_lens", "heads"], by_name=True) == (["logit_lens", "heads"], {})


def save_family(folder: Path, family: str) -> Path:
    from circuitlab.data.stories import stories_text
    from circuitlab.data.tokenizers import CharTokenizer
    from circuitlab.training import save_checkpoint

    tok = CharTokenizer.from_texts([stories_text(50)])
    model = helpers.random_model(ModelConfig(d_vocab=tok.vocab_size, **FAMILIES[family]), seed=0, scale=3.0)
    return save_checkpoint(folder / family, model, tok)


def test_interpret_runs_named_experiments_on_post_norms_and_refuses_circuits(tmp_path, capsys, one_thread):
    """The issue's case: on an OLMo-2 (post-norms) every experiment failed on copying scores (the report labels
    the heads, and draws circuits, whatever was asked)."""
    from circuitlab.cli import main

    ckpt = save_family(tmp_path, "OLMo-2")
    out = tmp_path / "interpret"
    assert main(["interpret", "--checkpoint", str(ckpt), "--experiments", "logit_lens", "attribution",
                 "--prompt", OPTS["prompt"], "--out", str(out)]) == 0
    assert (out / "report.html").is_file()
    assert "neurons' output tokens are left out" in (out / "report.md").read_text()
    assert main(["interpret", "--checkpoint", str(ckpt), "--experiments", "circuits", "--out",
                 str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert "leave circuits out of --experiments" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "refused").exists()


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_cell_of_the_table_runs_as_it_says(family, tmp_path, one_thread):
    """The default set runs every ✓ experiment and skips each other one with a warning naming it; each skipped
    experiment, called directly (past interpret's check), is refused by its analysis in one line."""
    from circuitlab.errors import ConfigError
    from circuitlab.experiments.interpret import available_experiments, run_interpret
    from circuitlab.training import load_checkpoint

    ckpt = save_family(tmp_path, family)
    table = doc_table()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_interpret(ckpt, tmp_path / "out", **OPTS)
    assert result.experiments == [n for n in table if table[n][family]]
    skipped = [n for n in table if not table[n][family]]
    assert list(result.skipped) == skipped
    said = [str(w.message) for w in caught if re.match(r"\w+ skipped: ", str(w.message))]
    assert [m.split()[0] for m in said] == skipped
    model, tok, _ = load_checkpoint(ckpt)
    for name in skipped:
        with pytest.raises(ConfigError):
            available_experiments()[name](model, tok, tmp_path, dict(OPTS))
