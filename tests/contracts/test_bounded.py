"""Bounded work: every count or size option, at the largest values a user could type, under a memory cap
(`ulimit -v` in a subprocess) ends in a clean finish or a clean one-line refusal naming the limit, never an
out-of-memory kill or a traceback. One tiny model (char tokenizer, 1 layer) for all commands."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from circuitlab import ModelConfig, Transformer
from circuitlab.data.tokenizers import CharTokenizer
from circuitlab.training import save_checkpoint

ROOT = Path(__file__).resolve().parents[2]
TEXT = "Once upon a time, Lily saw a cat. The cat was happy. Lily said hello to the cat. The dog ran. "
CAP_KB = 3_000_000  # 3 GB of address space: torch itself takes ~0.6 GB; an unbounded count asks for far more
HUGE = "1000000000000"


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    root = tmp_path_factory.mktemp("bounded")
    torch.manual_seed(0)
    from circuitlab.data.stories import stories_text

    tok = CharTokenizer.from_texts([TEXT, stories_text(2000)])  # built-in stories too (sae eval's default text)
    cfg = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=tok.vocab_size, n_ctx=64)
    save_checkpoint(root / "run" / "checkpoint", Transformer(cfg), tok)
    (root / "pos.txt").write_text("Lily saw a cat.\nThe cat was happy.\n")
    (root / "neg.txt").write_text("The dog ran.\nLily said hello.\n")
    (root / "clean.txt").write_text("Lily saw a cat\n")
    (root / "corrupt.txt").write_text("Lily saw a dog\n")
    return root


_RUNNER = """
import contextlib, io, json, sys, traceback
from circuitlab.cli import main
answers = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
        except BaseException:
            rc = "raised"
            traceback.print_exc(file=err)
    answers.append([rc, err.getvalue()])
print(json.dumps(answers))
"""


# The explorer's /api/graphs/compute, as a browser posts it: [[[model, graphs, transcoders], [body, ...]], ...]
# (one server per item) -> [[status, detail], ...] per body.
_EXPLORER = """
import json, sys
from fastapi.testclient import TestClient
from circuitlab.methods.graph import graph_experiment
from circuitlab.serve import create_app
answers = []
for (model, graphs, transcoders), bodies in json.loads(sys.argv[1]):
    client = TestClient(create_app(model, graphs=graphs, transcoders=transcoders, graph_runner=graph_experiment))
    for body in bodies:
        r = client.post("/api/graphs/compute", json=body)
        answers.append([r.status_code, r.json().get("detail", "")])
print(json.dumps(answers))
"""


def capped(calls: list, cwd: Path, cap_kb: int = CAP_KB, timeout: float = 400, runner: str = _RUNNER) -> list[tuple]:
    """Run each `circuitlab ARGV` of calls, in one subprocess whose address space is capped at cap_kb
    (ulimit -v), on one thread; [(exit code, stderr)] per call. One process for all (torch's import is the
    slow part); an out-of-memory kill shows as a non-zero exit of the whole. runner: the script given the
    calls as JSON (_EXPLORER: the explorer's graph endpoint instead of the command line)."""
    import json
    import shlex

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = f"ulimit -v {cap_kb}; exec {shlex.quote(sys.executable)} -c {shlex.quote(runner)} " \
          f"{shlex.quote(json.dumps(calls))}"
    r = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    return [tuple(a) for a in json.loads(r.stdout.strip().splitlines()[-1])]


def explorer_refusal(answer: tuple, *fragments: str) -> None:
    status, detail = answer
    assert status == 422 and isinstance(detail, str) and detail and "\n" not in detail, answer
    for f in fragments:
        assert f in detail, detail


def named_limit(answer: tuple) -> int:
    """The count a refusal says fits ("... at most N ...")."""
    import re

    return int(re.search(r"at most (\d+)", answer[1]).group(1))


def clean_refusal(answer: tuple, *fragments: str) -> None:
    rc, err = answer
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (rc, err[-2000:])
    for f in fragments:
        assert f in lines[0], lines[0]


def clean_finish(answer: tuple) -> None:
    rc, err = answer
    assert rc == 0 and "Traceback" not in err, (rc, err[-3000:])


@pytest.mark.slow  # the largest accepted values run to the end; refusals: test_huge_counts_...
def test_attribute_ig_steps_and_occlusion_are_bounded(where):
    ckpt = str(where / "run")
    long_prompt = (TEXT * 2)[:60]
    # the largest accepted step count, on the longest prompt, runs in chunks within the cap
    base = ["attribute", "--checkpoint", ckpt, "--prompt"]
    ig, over, huge, occ, span, pos = capped([
        base + [long_prompt, "--method", "ig", "--steps", "1024"],  # the largest count, longest prompt: in chunks
        base + ["Lily", "--steps", "50000"],  # one line naming the limit and why (it used to take 18.6 GiB)
        base + ["Lily", "--steps", HUGE],
        base + [long_prompt, "--method", "occlusion", "--span", "1"],
        base + ["Lily", "--method", "occlusion", "--span", HUGE],
        base + ["Lily", "--pos", HUGE]], where)
    clean_finish(ig)
    clean_refusal(over, "--steps", "from 1 to 1024", "eigenproblem")
    clean_refusal(huge, "--steps")
    clean_finish(occ)
    clean_refusal(span, "span")
    clean_refusal(pos, "pos")


LONG = (TEXT * 2)[:64]  # the longest prompt the test models take (n_ctx 64)


@pytest.fixture(scope="module")
def graph_files(where):
    """where/g: a 2-layer model with its random transcoders and a graph (helpers.saved_graph_run), and
    where/g/dense: transcoders of the same model whose every feature fires at every position (2 x 2048 active
    features a token: the largest graph a 64-token prompt gives these models)."""
    import helpers
    from circuitlab.dictionaries import DictionaryConfig, SparseDictionary

    g = where / "g"
    helpers.saved_graph_run(g)
    for layer in range(2):
        cfg = DictionaryConfig("relu", d_in=32, d_sae=2048, hook_name=f"blocks.{layer}.ln2.hook_normalized",
                               out_hook_name=f"blocks.{layer}.hook_mlp_out", skip=True)
        d = SparseDictionary(cfg, seed=layer)
        with torch.no_grad():
            d.b_enc.fill_(10.0)
        d.save(g / "dense" / f"layer{layer}")
    return g


# `circuitlab train` on the demo's model with quick data (a char tokenizer on 200 stories)
TRAIN = ["train", "--config", "demo", "--no-progress", "--set", "train.steps=1", "--set", "data.tokenizer=char",
         "--set", "data.n_stories=200"]


def _graph_and_trace(where: Path, g: Path) -> tuple[list[str], list[str]]:
    graph = ["graph", "--checkpoint", str(g / "model"), "--prompt", LONG]
    trace = ["interpret", "--checkpoint", str(where / "run"), "--experiments", "causal_tracing", "--prompt", LONG,
             "--subject", "Lily"]
    return graph, trace


def _sae_files(where: Path) -> None:
    import yaml

    from circuitlab.dictionaries import DictionaryConfig, SparseDictionary, base_model_id
    from circuitlab.training import load_checkpoint

    model, _, _ = load_checkpoint(str(where / "run"))
    cfg = DictionaryConfig("relu", d_in=16, d_sae=24, hook_name="blocks.0.hook_resid_post",
                           base_model=base_model_id(model))
    SparseDictionary(cfg, seed=0).save(where / "sae")
    (where / "sae.yaml").write_text(yaml.safe_dump({
        "model": str(where / "run"), "data": {"source": "stories", "n_stories": 50, "tokenizer": "char"},
        "dictionaries": [{"architecture": "relu", "hook_name": "blocks.0.hook_resid_post", "d_sae": 24}],
        "train": {"steps": 2, "batch_size": 10**9}}))


def test_huge_counts_are_refused_in_one_line_under_the_cap(where, graph_files):
    """The fast half of the slow tests below: every count past its limit, under the memory cap, is refused in
    one line naming the limit before any work (the slow ones also run the largest accepted values to the end)."""
    ckpt = str(where / "run")
    _sae_files(where)
    graph, trace = _graph_and_trace(where, graph_files)
    many = where / "many.txt"
    many.write_text(("Lily saw a cat. The cat was happy. Lily said hello to the dog.\n") * 20_000)
    attribute = ["attribute", "--checkpoint", ckpt, "--prompt", "Lily"]
    steer = ["steer", "--checkpoint", ckpt, "--positive", str(where / "pos.txt"), "--negative", str(where / "neg.txt"),
             "--neutral", str(where / "pos.txt"), "--layer", "0", "--no-progress"]
    lens = ["lens", "train", "--checkpoint", ckpt, "--out", str(where / "lens-fast"), "--no-progress", "--steps", "1"]
    sae = ["--dictionary", str(where / "sae"), "--checkpoint", ckpt]
    answers = capped([
        attribute + ["--steps", "50000"], attribute + ["--steps", HUGE],
        attribute + ["--method", "occlusion", "--span", HUGE], attribute + ["--pos", HUGE],
        ["circuit", "--checkpoint", ckpt, "--clean", str(many), "--corrupt", str(many), "--method", "eap",
         "--metric", "kl", "--out", str(where / "c1-fast")],
        ["circuit", "--checkpoint", ckpt, "--task", "induction", "--steps", "10001", "--out", str(where / "c2-fast")],
        steer + ["--samples", HUGE], steer + ["--max-tokens", HUGE], steer + ["--coef", *["1"] * 65],
        lens + ["--batch-size", HUGE], lens + ["--batches", HUGE], lens + ["--seq-len", HUGE, "--batch-size", "100000"],
        ["sae", "eval", *sae, "--batches", HUGE], ["sae", "dashboards", *sae, "--tokens", HUGE, "--no-progress"],
        ["sae", "train", "--config", str(where / "sae.yaml"), "--out", str(where / "sae_run-fast"), "--no-progress"],
        graph + ["--transcoders", str(graph_files / "dense"), "--max-feature-nodes", HUGE, "--out", str(where / "g1")],
        graph + ["--transcoders", str(graph_files / "dense"), "--out", str(where / "g1")],
        graph + ["--transcoders", str(graph_files / "transcoders"), "--dashboard-tokens", "4194305"],
        trace + ["--noise-samples", HUGE, "--out", str(where / "t1")],
        trace + ["--noise", "replace", "--replace-with", *["Abcd"] * 10_000, "--out", str(where / "t1")],
        trace + ["--noise-scale", "1e300"], trace + ["--window", HUGE, "--out", str(where / "t1")],
        *[TRAIN + ["--out", str(where / f"train{i}"), "--set", f"{setting}={HUGE}"] for i, setting in enumerate(
            ("data.n_stories", "train.batch_size", "model.d_model", "model.n_layers", "train.seq_len"))],
        ["forge", "compare", "--out", str(where / "fc-fast"), "--samples", HUGE, "--no-progress"],
    ], where)
    expected = [("--steps", "from 1 to 1024", "eigenproblem"), ("--steps",), ("span",), ("pos",),
                ("20000 rows", "give at most"), ("--steps", "from 1 to 10000"),
                ("--samples", "from 1 to 1024", "one batch"), ("--max-tokens", "from 1 to 4096"),
                ("at most 64 coefficients",),
                ("batch_size", "give a batch_size of at most"), ("give at most", "batches"), ("batch_size",),
                ("--batches", "give at most"), ("--tokens", "from 1 to 4194304"), ("train.batch_size", "give at most"),
                ("262,144 active features", "of the memory budget", "--max-feature-nodes) at most"),
                ("262,144 active features", "--max-feature-nodes) at most"), ("--dashboard-tokens", "from 0 to 4194304"),
                ("noise runs", "of the memory budget", "give at most"), ("10,000 noise runs", "give at most"),
                ("--noise-scale", "to 1000"), ("wider than the model", "give --window 1..1"),
                ("n_stories", "at most 1,000,000"), ("train.batch_size", "of the memory budget", "give train.batch_size at most"),
                ("parameters", "over the memory budget"), ("parameters", "n_layers"), ("parameters", "train.seq_len"),
                ("samples", "from 1 to 50000", "held at once")]
    assert len(answers) == len(expected)
    for answer, fragments in zip(answers, expected):
        clean_refusal(answer, *fragments)


def test_ig_chunks_agree_with_one_pass():
    """Chunked path points give the same scores as one pass (float64)."""
    from circuitlab.analysis.input_attribution import integrated_gradients

    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=20, n_ctx=8)).double()
    tokens = torch.tensor([1, 5, 3, 7])
    one = integrated_gradients(model, tokens, target=2, steps=16, batch_size=16).scores
    chunked = integrated_gradients(model, tokens, target=2, steps=16, batch_size=3).scores
    auto = integrated_gradients(model, tokens, target=2, steps=16).scores
    torch.testing.assert_close(chunked, one)
    torch.testing.assert_close(auto, one)
    riemann = integrated_gradients(model, tokens, target=2, steps=5000, rule="riemann")
    assert riemann.completeness_error < 1e-3


@pytest.mark.slow  # the largest accepted values run to the end; refusals: test_huge_counts_...
def test_circuit_rows_steps_and_edges_are_bounded(where):
    ckpt = str(where / "run")
    many = where / "many.txt"
    many.write_text(("Lily saw a cat. The cat was happy. Lily said hello to the dog.\n") * 20_000)
    rows, steps, edges = capped([
        ["circuit", "--checkpoint", ckpt, "--clean", str(many), "--corrupt", str(many), "--method", "eap",
         "--metric", "kl", "--out", str(where / "c1")],
        ["circuit", "--checkpoint", ckpt, "--task", "induction", "--steps", "10001", "--out", str(where / "c2")],
        ["circuit", "--checkpoint", ckpt, "--task", "induction", "--method", "eap", "--edges", HUGE,
         "--no-progress", "--out", str(where / "c3")]], where)
    clean_refusal(rows, "20000 rows", "give at most")
    clean_refusal(steps, "--steps", "from 1 to 10000")
    clean_finish(edges)
    assert (where / "c3" / "results.json").is_file()


@pytest.mark.slow  # the largest accepted values run to the end; refusals: test_huge_counts_...
def test_steer_lens_and_sae_sizes_are_bounded(where):
    """The largest values of every other count option: a clean finish where the work is chunked or small, a
    one-line refusal naming the limit otherwise (one capped process for all: the import is the slow part)."""
    ckpt = str(where / "run")
    _sae_files(where)
    steer = ["steer", "--checkpoint", ckpt, "--positive", str(where / "pos.txt"), "--negative", str(where / "neg.txt"),
             "--neutral", str(where / "pos.txt"), "--layer", "0", "--no-progress"]
    lens = ["lens", "train", "--checkpoint", ckpt, "--out", str(where / "lens"), "--no-progress", "--steps", "1"]
    sae = ["--dictionary", str(where / "sae"), "--checkpoint", ckpt]
    answers = capped([
        steer + ["--samples", HUGE], steer + ["--max-tokens", HUGE], steer + ["--coef", *["1"] * 65],
        steer + ["--samples", "1024", "--max-tokens", "64", "--coef", "1"],  # the largest accepted: finishes
        lens + ["--batch-size", HUGE], lens + ["--batches", HUGE], lens + ["--seq-len", HUGE, "--batch-size", "100000"],
        ["sae", "eval", *sae, "--batches", HUGE], ["sae", "eval", *sae],
        ["sae", "dashboards", *sae, "--tokens", HUGE, "--no-progress"],
        ["sae", "train", "--config", str(where / "sae.yaml"), "--out", str(where / "sae_run"), "--no-progress"],
        ["generate", "--checkpoint", ckpt, "--num", HUGE],
        ["generate", "--checkpoint", ckpt, "--num", "1024", "--max-tokens", "60"],  # the largest accepted: finishes
    ], where)
    (samples, tokens, coefs, steer_ok, lens_bs, lens_batches, lens_seq, eval_big, eval_ok, dash, train, gen_big,
     gen_ok) = answers
    clean_refusal(samples, "--samples", "from 1 to 1024", "one batch")
    clean_refusal(tokens, "--max-tokens", "from 1 to 4096")
    clean_refusal(coefs, "at most 64 coefficients")
    clean_finish(steer_ok)
    clean_refusal(lens_bs, "batch_size", "give a batch_size of at most")
    clean_refusal(lens_batches, "give at most", "batches")
    clean_refusal(lens_seq, "batch_size")
    clean_refusal(eval_big, "--batches", "give at most")
    clean_finish(eval_ok)
    clean_refusal(dash, "--tokens", "from 1 to 4194304")
    clean_refusal(train, "train.batch_size", "give at most")
    clean_refusal(gen_big, "--num", "from 1 to 1024", "one batch")
    clean_finish(gen_ok)


@pytest.mark.slow
def test_circuit_exact_at_the_most_rows_accepted_finishes_within_a_cap(where):
    """Exact edge patching holds the clean run, the reference and a chunk of patched copies: at the largest row
    count the budget accepts (one copy of every source output within a pass's share of `--memory 4G`, 1 GiB) it
    finishes within 6 GB of address space; one row more is refused in one line saying how many fit and why. (Minutes: ~70,000 rows
    through every edge's patched run; over 15 min on the loaded 2-core machine.)"""
    from circuitlab import memory
    from circuitlab.analysis.edges.edge_graph import EdgeGraph
    from circuitlab.analysis.edges.scoring import _per_copy_floats, edge_rows_budget
    from circuitlab.training import load_checkpoint

    model, tok, _ = load_checkpoint(str(where / "run"))
    line = "Lily saw a cat"
    per_row = _per_copy_floats(model, EdgeGraph.of(model), torch.zeros(1, len(tok.encode(line)), dtype=torch.long))
    with memory.memory_limit("4G"):
        most = edge_rows_budget() // per_row
    (where / "most_clean.txt").write_text((line + "\n") * most)
    (where / "most_corrupt.txt").write_text(("Lily saw a dog\n") * most)
    (where / "over_clean.txt").write_text((line + "\n") * (most + 1))
    (where / "over_corrupt.txt").write_text(("Lily saw a dog\n") * (most + 1))
    base = ["circuit", "--checkpoint", str(where / "run"), "--method", "exact", "--metric", "kl", "--no-progress",
            "--memory", "4G"]
    over, ok = capped([
        base + ["--clean", str(where / "over_clean.txt"), "--corrupt", str(where / "over_corrupt.txt"),
                "--out", str(where / "exact_over")],
        base + ["--clean", str(where / "most_clean.txt"), "--corrupt", str(where / "most_corrupt.txt"),
                "--out", str(where / "exact_most")]], where, cap_kb=6_000_000, timeout=3000)
    clean_refusal(over, f"{most + 1} rows", f"give at most {most} rows", "GiB per copy")
    clean_finish(ok)
    assert (where / "exact_most" / "results.json").is_file()


def test_the_explorers_graphs_are_refused_in_one_line_under_the_cap(graph_files):
    """The explorer's /api/graphs/compute: a graph past the explorer's size limit, a longer prompt or a larger
    feature-node cap than it takes is answered 422 in one line, before any backward pass, under the cap."""
    g = graph_files
    dense, long_prompt, cap = capped([
        [[str(g / "model"), str(g / "graphs"), str(g / "dense")], [{"prompt": LONG}]],
        [[str(g / "model"), str(g / "graphs"), str(g / "transcoders")],
         [{"prompt": LONG + "x"}, {"prompt": LONG, "max_feature_nodes": 4001}]]], g, runner=_EXPLORER)
    explorer_refusal(dense, "262,144 active features", "the explorer's", "max_feature_nodes at most")
    explorer_refusal(long_prompt, "64")
    explorer_refusal(cap, "max_feature_nodes", "4000")


@pytest.mark.slow  # the largest accepted values run to the end; refusals: test_huge_counts_... and the above
def test_graph_trace_and_the_explorers_graphs_are_bounded(where, graph_files):
    """The largest graph a user could ask for finishes within the cap: the most feature nodes the refusal
    says fit (on transcoders whose every feature fires), any batch size (cut to what fits), the most
    dashboard tokens; causal tracing with the most noise samples its refusal names; the explorer's largest
    graph. (Minutes on the loaded 2-core machine.)"""
    g = graph_files
    graph, trace = _graph_and_trace(where, g)
    dense = graph + ["--transcoders", str(g / "dense"), "--dashboard-tokens", "0", "--overwrite"]
    too_many, too_many_runs = capped([dense + ["--out", str(where / "g2")], trace + ["--noise-samples", HUGE]], where)
    most, runs = named_limit(too_many), named_limit(too_many_runs)
    over, ok, cards, one_more, traced = capped([
        dense + ["--max-feature-nodes", str(most + 1), "--out", str(where / "g2")],
        dense + ["--max-feature-nodes", str(most), "--batch-size", HUGE, "--out", str(where / "g2")],
        graph + ["--transcoders", str(g / "transcoders"), "--batch-size", HUGE, "--max-feature-nodes", HUGE,
                 "--dashboard-tokens", "4194304", "--out", str(where / "g3")],
        trace + ["--noise-samples", str(runs + 1), "--out", str(where / "t2")],
        trace + ["--noise-samples", str(runs), "--out", str(where / "t2")]], where, cap_kb=6_000_000, timeout=3000)
    clean_refusal(over, "--max-feature-nodes) at most")
    clean_finish(ok)
    assert json.loads((where / "g2" / "results.json").read_text())["graph"]["n_feature_nodes"] == most
    clean_finish(cards)
    clean_refusal(one_more, "noise runs", f"give at most {runs}")
    clean_finish(traced)
    assert (where / "t2" / "results.json").is_file()
    server, dense_server = [str(g / "model"), str(g / "graphs"), str(g / "transcoders")], \
        [str(g / "model"), str(g / "graphs"), str(g / "dense")]
    (too_big,) = capped([[dense_server, [{"prompt": LONG, "max_feature_nodes": 4000}]]], g, runner=_EXPLORER)
    explorer_refusal(too_big, "max_feature_nodes at most")
    answers = capped([[dense_server, [{"prompt": LONG, "max_feature_nodes": named_limit(too_big)}]],
                      [server, [{"prompt": LONG, "max_feature_nodes": 4000}, {"prompt": LONG}]]], g,
                     cap_kb=6_000_000, timeout=3000, runner=_EXPLORER)
    assert [status for status, _ in answers] == [200, 200, 200], answers


@pytest.mark.slow  # the largest accepted batch runs a step; refusals: test_huge_counts_...
def test_model_training_at_the_largest_batch_accepted_finishes_within_a_cap(where):
    """`circuitlab train`'s step: the largest train.batch_size the refusal names (activations within a quarter of the memory budget by
    the estimate) trains a step within a 6 GB address space; one row more is refused. (~30 s.)"""
    (too_big,) = capped([TRAIN + ["--out", str(where / "tr0"), "--set", f"train.batch_size={HUGE}"]], where)
    most = named_limit(too_big)
    over, ok = capped([TRAIN + ["--out", str(where / "tr1"), "--set", f"train.batch_size={most + 1}"],
                       TRAIN + ["--out", str(where / "tr2"), "--set", f"train.batch_size={most}"]], where,
                      cap_kb=6_000_000, timeout=1200)
    clean_refusal(over, f"give train.batch_size at most {most}")
    clean_finish(ok)
    assert (where / "tr2" / "checkpoint").is_dir()


@pytest.mark.slow  # the largest accepted count runs to the end; its refusal: test_huge_counts_...
def test_forge_compare_at_the_most_samples_finishes_within_the_cap(where):
    """`forge compare --samples 50000` (the most it takes: both models' attention on every problem is held at
    once) finishes within the 3 GB cap. (~30 s: a 5-step model.)"""
    (ok,) = capped([["forge", "compare", "--out", str(where / "fc"), "--steps", "5", "--samples", "50000",
                     "--no-progress"]], where)
    clean_finish(ok)
    assert json.loads((where / "fc" / "results.json").read_text())["samples"] == 50000
