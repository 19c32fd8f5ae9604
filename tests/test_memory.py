"""The memory budget (circuitlab.memory): from the machine or --memory, one line when larger than the machine;
every bound a share of it; the estimate said before the work within 30 % of the measured peak."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from circuitlab import ModelConfig, memory
from circuitlab.cli import main
from circuitlab.dictionaries import DictionaryConfig, SparseDictionary
from circuitlab.errors import ConfigError, InputError
from circuitlab.graphs import Transcoders, attribute
from circuitlab.graphs.attribution import check_graph_size, estimate_graph, rows_per_pass
import helpers
from helpers import fresh_process_json

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


def test_sizes_parse_and_more_than_the_machine_is_one_line():
    assert memory.parse_size("8G") == 8 * 2**30
    assert memory.parse_size("800M") == 800 * 2**20
    assert memory.parse_size("1.5GiB") == int(1.5 * 2**30)
    assert memory.parse_size(2e9) == 2_000_000_000
    for bad in ("lots", "0", "-3G", True, "12X"):
        with pytest.raises(ConfigError, match="--memory"):
            memory.parse_size(bad)
    total = memory.machine_bytes()
    with pytest.raises(ConfigError, match="more than this machine's memory"):
        memory.parse_size(total + 2**30)


def test_the_budget_follows_the_limit_and_is_restored():
    before = memory.budget_bytes()
    with memory.memory_limit("64M") as b:
        assert b == memory.budget_bytes() == 64 * 2**20
        assert memory.floats(memory.GRAPH_SHARE) == 8 * 2**20     # half of it, in float32 values
        assert "set by --memory" in memory.describe(memory.GRAPH_SHARE)
    after = memory.budget_bytes()
    assert abs(after - before) < 0.2 * before   # the machine's again (what is available moves a little)


def test_the_budget_sees_an_address_space_limit():
    """Under `ulimit -v` the budget is what the process may still map, not the machine's free memory."""
    code = ("import resource; from circuitlab import memory; "
            "print(memory.available_bytes(), memory.meminfo()['MemAvailable'])")
    out = subprocess.run(["bash", "-c", f"ulimit -v 3000000; {sys.executable} -c \"{code}\""], capture_output=True,
                         text=True, env={"PYTHONPATH": str(ROOT / "src")}, check=True).stdout.split()
    avail, machine = map(int, out)
    assert avail < 3_000_000 * 1024 and (avail < machine or machine < 3_000_000 * 1024)


def _small_setup(d_model=96, n_layers=3, d_sae=1024, k=24, T=48):
    from helpers import random_model

    cfg = ModelConfig.from_preset("gpt2-tiny", n_layers=n_layers, d_model=d_model, n_heads=4, d_mlp=4 * d_model,
                                  n_ctx=64, d_vocab=200)
    model = random_model(cfg, scale=1.0).eval()
    dicts = [SparseDictionary(DictionaryConfig("topk", d_in=d_model, d_sae=d_sae, k=k,
                                               hook_name=f"blocks.{layer}.ln2.hook_normalized",
                                               out_hook_name=f"blocks.{layer}.hook_mlp_out"), seed=layer)
             for layer in range(n_layers)]
    tokens = torch.randint(0, 200, (T,), generator=torch.Generator().manual_seed(0))
    return model, Transcoders.per_layer(model, dicts), tokens


def test_graph_bounds_follow_the_budget():
    model, tc, tokens = _small_setup()
    layers = torch.zeros(3000, dtype=torch.long)
    check_graph_size(layers, tc, 3000, 48, 5, 96)            # fits the machine
    with memory.memory_limit("8M"):                          # 2 MiB of floats for the dense matrices: refused
        with pytest.raises(InputError, match=r"half of the memory budget .*set by --memory.*at most \d+"):
            check_graph_size(layers, tc, 3000, 48, 5, 96)
        small = rows_per_pass(model, 4000, 48)
    with memory.memory_limit("1G"):
        assert rows_per_pass(model, 4000, 48) > small
    # the vocabulary does not cut the rows of a pass: a 256,000-token vocabulary changes nothing
    wide = ModelConfig.from_preset("gpt2-tiny", n_layers=3, d_model=96, n_heads=4, d_mlp=384, n_ctx=64,
                                   d_vocab=256_000)
    assert rows_per_pass(type("M", (), {"cfg": wide})(), 4000, 48) == rows_per_pass(model, 4000, 48)


def test_the_graph_estimate_is_within_30_percent_of_the_measured_peak():
    """The estimate printed before the backward passes against the attribution's own peak (resident memory
    growth), on a shape where the dense parts dominate (capped rows, influence, adjacency). In a fresh process:
    memory freed by earlier tests stays in the allocator's arenas and would hide part of the peak."""
    if not sys.platform.startswith("linux"):
        pytest.skip("resident memory is read from /proc")
    code = ("import json, sys, torch; torch.set_num_threads(1); sys.path.insert(0, 'tests')\n"
            "from test_memory import _small_setup\n"
            "from circuitlab.graphs import attribute\n"
            "from circuitlab.graphs.attribution import estimate_graph\n"
            "model, tc, tokens = _small_setup()\n"
            "est = estimate_graph(model, tc, tokens, max_feature_nodes=1500, batch_size=64, timed=False)\n"
            "graph = attribute(model, tc, tokens, max_feature_nodes=1500, batch_size=64)\n"
            "print(json.dumps([est.peak_bytes, graph.info['peak_mb'], graph.n_features, est.line(),\n"
            "                  graph.info['estimate']['peak_bytes']]))\n")
    estimate, peak_mb, n_features, line, recorded = fresh_process_json(code)
    assert n_features == 1500 and recorded == estimate
    measured = peak_mb * 2**20
    assert 0.7 * measured <= estimate <= 1.3 * measured, (line, peak_mb)


def test_graph_estimate_from_the_command_line_writes_nothing(tmp_path, capsys):
    out = tmp_path / "g"
    assert main(["graph", "--planted", "--prompt", "xAxBxyx", "--estimate", "--out", str(out)]) == 0
    line = capsys.readouterr().out
    assert line.startswith("estimate: the attribution graph (") and "at its peak" in line and "GFLOP/s" in line
    assert not out.exists()


def test_memory_option_larger_than_the_machine_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["graph", "--planted", "--prompt", "xAxBxyx", "--memory", "100T"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "more than this machine's memory" in err and len(err.strip().splitlines()) == 1


def test_capped_rows_offloaded_to_disk_give_the_same_graph(monkeypatch, tmp_path):
    """Long prompts: capped rows over OFFLOAD_SHARE of the budget stream to a file (deleted at once); the graph is
    the one built in memory, and the file is gone afterwards."""
    import circuitlab.graphs.plan as plan

    model, tc, tokens = _small_setup(d_model=32, n_layers=2, d_sae=128, k=8, T=16)
    here = attribute(model, tc, tokens, max_feature_nodes=60, batch_size=8)
    monkeypatch.setattr(plan, "OFFLOAD_SHARE", 0.0)
    monkeypatch.setenv("CIRCUITLAB_OFFLOAD", str(tmp_path))
    est = estimate_graph(model, tc, tokens, max_feature_nodes=60, batch_size=8, timed=False)
    assert est.offload and est.disk[1] == str(tmp_path) and "offloaded to" in est.line()
    assert "capped rows" not in est.parts
    disk = attribute(model, tc, tokens, max_feature_nodes=60, batch_size=8)
    assert not list(tmp_path.iterdir())
    assert torch.equal(disk.selected, here.selected) if len(here.selected) == 60 else True
    torch.testing.assert_close(disk.adjacency, here.adjacency, atol=0, rtol=0)


def test_sae_train_and_interpret_estimates_read_and_write_nothing(tmp_path, capsys):
    """`sae train --estimate` and `interpret --estimate` print one estimate line each and stop: no output folder,
    no activation cache; the causal-tracing estimate refuses what the run would refuse (too many noise runs)."""
    import yaml

    cfg = helpers.save_char_checkpoint(tmp_path / "model", n_layers=2)
    config = {"model": str(tmp_path / "model"), "data": {"source": "stories", "n_stories": 200, "tokenizer": "char"},
              "store": {"seq_len": 16, "seqs_per_chunk": 16, "cache": str(tmp_path / "cache")},
              "dictionaries": [{"architecture": "topk", "hook_name": "blocks.0.hook_resid_post", "d_sae": 64, "k": 4}],
              "train": {"steps": 30, "batch_size": 64}}
    (tmp_path / "sae.yaml").write_text(yaml.safe_dump(config))
    assert main(["sae", "train", "--config", str(tmp_path / "sae.yaml"), "--out", str(tmp_path / "run"),
                 "--estimate"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("estimate: training (30 steps; a training step of 1 dictionary on 64 rows; cost: "), line
    assert "Adam" in line and not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()
    assert main(["interpret", "--checkpoint", str(tmp_path / "model"), "--prompt", "Lily saw a cat", "--subject", "Lily",
                 "--estimate", "--out", str(tmp_path / "interp")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()   # one per experiment it would run
    from circuitlab.experiments.interpret import experiments_for

    assert len(lines) == len(experiments_for(cfg)[0]) and all(x.startswith("estimate: ") for x in lines), lines
    assert any(x.startswith("estimate: causal tracing (10 noise runs of 14 tokens") for x in lines)
    assert any(x.startswith("estimate: patching (activation patching of 8 x ") for x in lines)
    assert not (tmp_path / "interp").exists()
    assert main(["interpret", "--checkpoint", str(tmp_path / "model"), "--estimate", "--noise-samples", "100000000",
                 "--memory", "64M"]) == 2
    assert "noise runs" in capsys.readouterr().err


def _synthetic_features(n_layers, n_pos, k, d_sae):
    """[n, 3] (layer, pos, feature), sorted: k distinct features per (layer, position), as TopK fires."""
    layer, pos, j = torch.meshgrid(torch.arange(n_layers), torch.arange(n_pos), torch.arange(k), indexing="ij")
    feat = (pos * 7 + layer * 13 + j * (d_sae // k)) % d_sae
    out = torch.stack([layer, pos, feat], -1).reshape(-1, 3)
    return out[torch.argsort(out[:, 0] * n_pos * d_sae + out[:, 1] * d_sae + out[:, 2])]


def test_a_long_prompts_plan_stays_flat_past_the_feature_cap():
    """Past the feature cap nothing in the plan grows with the active features: the capped rows go to disk (their
    size is what grows), a backward pass stays in its budget (a longer prompt's rows are longer: fewer a pass),
    a decoder block and influence's walk are bounded, and the adjacency is its written rows [cap + logits,
    n_nodes], never n_nodes². Four times the prompt (and the active features) here."""
    from circuitlab.graphs.columns import BLOCK_FLOATS
    from circuitlab.graphs.plan import attribution_phases, estimate_attribution, offloads

    model, tc, _ = _small_setup(d_model=64, n_layers=4, d_sae=1024, k=16, T=8)
    plans, phases, budget = {}, {}, 2**30
    with memory.memory_limit(budget):
        for T in (512, 2048):
            feats = _synthetic_features(4, T, 16, 1024)
            n_cols = len(feats) + 5 * T
            assert offloads(600, len(feats), n_cols, torch.float32) == (T == 2048)   # past a quarter of it
            plans[T] = estimate_attribution(model, tc, feats, T, 600, 5, 128, offload=True)
            held, ph = attribution_phases(model, tc, feats, T, 600, 5, plans[T].batch_size, offload=True)
            assert "capped rows" not in held
            phases[T] = {k: v for p in ph for k, v in p.items() if not k.startswith("reference run")}
    short, long = plans[512], plans[2048]
    for T in (512, 2048):
        assert phases[T]["backward pass"] <= memory.PASS_SHARE * budget, (short.line(), long.line())
        assert phases[T]["decoder block"] <= 3 * BLOCK_FLOATS * 4
    for part in ("influence", "a chunk of rows"):
        assert phases[2048][part] == phases[512][part]
    n_nodes = 600 + 5 * 2048 + 5
    assert phases[2048]["adjacency"] == 605 * n_nodes * 4 < n_nodes ** 2 * 4 / 15   # its rows, not n x n
    assert long.disk[0] > 3.9 * short.disk[0] and long.batch_size < short.batch_size


def test_a_long_prompt_never_holds_an_n_by_n_matrix():
    """Measured (resident memory's high-water mark, reset before each step, in a fresh process): a capped graph
    on a 1,000-token prompt with 7,200 nodes, most of them error and token nodes whose rows are zero. Attributing
    holds less than the dense n x n float32 adjacency alone (100 MB of its 208 when measured) (its error and token rows are never touched), and
    pruning (node threshold 1: most nodes kept) less than a third of an n x n float64 block (the old pruning
    made one [kept, kept], and sorted copies of it; ~110 MB of 415 when measured)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("resident memory is read from /proc")
    code = ("import json, sys, torch; torch.set_num_threads(1); sys.path.insert(0, 'tests')\n"
            "from helpers import random_model\n"
            "from circuitlab import ModelConfig\n"
            "from circuitlab.dictionaries import DictionaryConfig, SparseDictionary\n"
            "from circuitlab.graphs import Transcoders, attribute\n"
            "def hwm():\n"
            "    return int([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]) * 1024\n"
            "def rss():\n"
            "    return int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1]) * 1024\n"
            "def reset():\n"
            "    open('/proc/self/clear_refs', 'w').write('5')\n"
            "cfg = ModelConfig.from_preset('gpt2-tiny', n_layers=6, d_model=16, n_heads=1, d_mlp=64, n_ctx=1024, d_vocab=50)\n"
            "model = random_model(cfg, scale=1.0).eval()\n"
            "dicts = [SparseDictionary(DictionaryConfig('topk', d_in=16, d_sae=64, k=4, hook_name=f'blocks.{l}.ln2.hook_normalized',\n"
            "                                           out_hook_name=f'blocks.{l}.hook_mlp_out'), seed=l) for l in range(6)]\n"
            "tc = Transcoders.per_layer(model, dicts)\n"
            "tokens = torch.randint(0, 50, (1000,), generator=torch.Generator().manual_seed(0))\n"
            "attribute(model, tc, tokens[:20], max_feature_nodes=10, batch_size=4)   # warm: allocator, thread pools\n"
            "reset(); before = rss()\n"
            "graph = attribute(model, tc, tokens, max_feature_nodes=200, batch_size=4)\n"
            "attributing = hwm() - before\n"
            "reset(); before = rss()\n"
            "pruned = graph.prune(1.0, 0.98)\n"
            "pruning = hwm() - before\n"
            "print(json.dumps([graph.n_nodes, attributing, pruning, int((graph.node_influence() > 0).sum())]))\n")
    n, attributing, pruning, kept = fresh_process_json(code)
    assert n > 7000 and kept > n // 2, (n, kept)      # the node threshold keeps most of them: a large block
    assert attributing < 0.75 * n * n * 4, (n, attributing / 2**20)
    assert pruning < n * n * 8 / 3, (n, pruning / 2**20)


def test_pruning_in_place_leaves_a_float64_graph_as_it_was():
    """Pruning's chunks are made absolute in place: on copies, never on the adjacency (a float64 graph's rows
    converted to float64 are the adjacency itself, not a copy)."""
    model, tc, tokens = _small_setup(d_model=32, n_layers=2, d_sae=128, k=8, T=16)
    graph = attribute(model.double(), tc.to(torch.float64), tokens, max_feature_nodes=60, batch_size=8)
    before = graph.adjacency.clone()
    assert bool((before < 0).any())
    graph.prune(1.0, 0.98)
    graph.scores()
    assert torch.equal(graph.adjacency, before)
