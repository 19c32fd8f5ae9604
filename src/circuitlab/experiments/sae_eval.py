"""`circuitlab sae eval`: a dictionary (or a cross-layer transcoder) on a model's held-out text: L0, explained
variance, density, and the CE loss recovered when it is spliced in; printed, and written as JSON when asked.

    opts = DictionaryEvalOptions(dictionary="runs/sae-demo/dictionaries/blocks.1.hook_resid_pre-topk",
                                 checkpoint="runs/demo/2l", batches=8)
    metrics = evaluate_dictionary(opts)      # printed; opts.json: also written there
    metrics.spliced.ce_recovered
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from circuitlab.checks import COUNT, Number
from circuitlab.experiments.dashboards import DICTIONARY_HELP
from circuitlab.spec import Options, option

EVAL_BUDGET = 2 ** 28        # floats sae eval holds at once (1 GiB): bounds --batches x --seq-len
SEQ_LEN = Number(int, low=2)  # a next-token loss needs two tokens


@dataclass(frozen=True)
class DictionaryEvalOptions(Options):
    """What `circuitlab sae eval` evaluates, on what (its flags are these fields, in this order)."""

    dictionary: str = option(None, required=True,
                             help=DICTIONARY_HELP + "; or a CLT (ours, circuit-tracer's or sparsify's layout)")
    checkpoint: str = option(None, required=True, aliases=("--model",), help="the model it was trained on")
    data: str = option("stories", help='text source: "stories", "file:PATH", "hf:NAME" ... (default {default})')
    batches: int = option(64, COUNT, help="sequences of held-out text to evaluate on (default {default}: with "
                                          "--seq-len 64, 4096 tokens, so a latent counted dead fired on none of them; "
                                          "the resolution is printed)")
    seq_len: int = option(64, SEQ_LEN, help="tokens per sequence (default {default})")
    json: str | None = option(None, help="also write the metrics to this JSON file")


def evaluate_dictionary(opts: DictionaryEvalOptions) -> Any:
    """The dictionary's metrics (dictionaries.metrics.evaluate, with .spliced) on opts.batches held-out sequences,
    printed; a CLT's per layer (dictionaries.clt_train.evaluate_clt) and with every MLP replaced."""
    from circuitlab.dictionaries import SparseDictionary
    from circuitlab.dictionaries.clt import is_clt_folder
    from circuitlab.dictionaries.metrics import evaluate, spliced_loss
    from circuitlab.dictionaries.store import ActivationStore, ModelActivations
    from circuitlab.dictionaries.train import check_fits
    from circuitlab.errors import CircuitlabError
    from circuitlab.training import load_checkpoint

    opts = opts.check()
    if is_clt_folder(opts.dictionary):
        return _evaluate_clt(opts)
    model, tokenizer, _ = load_checkpoint(opts.checkpoint)
    sae = SparseDictionary.load(opts.dictionary, model=model)  # checked against the model, hooks bound
    seq_len = opts.seq_len
    if seq_len > model.cfg.n_ctx:
        print(f"--seq-len {seq_len} is longer than the model's context: using {model.cfg.n_ctx}")
        seq_len = model.cfg.n_ctx
    rows = opts.batches * seq_len
    per_row = 4 * (sae.cfg.d_sae + sae.cfg.d_in + (sae.cfg.d_out or sae.cfg.d_in)) + 2 * model.cfg.d_vocab
    if rows * per_row > EVAL_BUDGET:
        raise CircuitlabError(f"--batches {opts.batches} x --seq-len {seq_len} = {rows} tokens need "
                              f"{rows * per_row * 4 / 2**30:.1f} GiB at once for this dictionary and model (limit "
                              f"{EVAL_BUDGET * 4 / 2**30:.0f} GiB); give at most "
                              f"{max(1, EVAL_BUDGET // (per_row * seq_len))} batches")
    data = _text(opts, tokenizer)
    hooks = [h for h in (sae.cfg.hook_name, sae.cfg.out_hook_name) if h]
    source = ModelActivations(model, hooks, data, seq_len=seq_len, seqs_per_chunk=opts.batches)
    check_fits(sae.cfg, source.widths)
    store = ActivationStore(source, batch_size=opts.batches * seq_len, split="val")
    metrics = evaluate(sae, [store.next_batch()])
    metrics.spliced = spliced_loss(model, sae, data.get_batch("val", 0, opts.batches, seq_len))
    s = metrics.spliced
    print(f"{opts.dictionary} ({sae.cfg.architecture}, {sae.cfg.hook_name}, d_sae {sae.cfg.d_sae}) on {metrics.n_rows} tokens:")
    print(f"  L0 {metrics.l0:.2f}  explained variance {metrics.explained_variance:.4f}  MSE {metrics.mse:.4g} "
          "(model units, summed over dims; sae train logs the same)  "
          f"cosine {metrics.cosine:.4f}  L2 ratio {metrics.l2_ratio:.3f}")
    print(f"  dead {metrics.dead_frac:.1%} (fired on none of the {metrics.n_rows:,} tokens: a rate below "
          f"1/{metrics.n_rows:,} reads as dead)  dense (>10%) {metrics.dense_frac:.1%}")
    print(f"  CE clean {s.ce_clean:.4f}  spliced {s.ce_spliced:.4f}  zero-ablated {s.ce_zero:.4f}  "
          f"CE recovered {s.ce_recovered:.4f}{s.recovered_note()}  KL {s.kl:.4g}")
    _write(opts, metrics)
    return metrics


def _evaluate_clt(opts: DictionaryEvalOptions) -> Any:
    """sae eval for a cross-layer transcoder: per-layer reconstruction, and the model with every MLP replaced."""
    from circuitlab.dictionaries.clt import CrossLayerTranscoder, check_clt_fits
    from circuitlab.dictionaries.clt_train import evaluate_clt
    from circuitlab.dictionaries.metrics import spliced_loss
    from circuitlab.dictionaries.store import ActivationStore, ModelActivations
    from circuitlab.training import load_checkpoint

    clt = CrossLayerTranscoder.load(opts.dictionary)
    model, tokenizer, _ = load_checkpoint(opts.checkpoint)
    check_clt_fits(clt, model, f"the CLT in {opts.dictionary}")
    data = _text(opts, tokenizer)
    source = ModelActivations(model, clt.cfg.hooks(), data, seq_len=opts.seq_len, seqs_per_chunk=opts.batches)
    metrics = evaluate_clt(clt, [ActivationStore(source, batch_size=opts.batches * opts.seq_len, split="val").next_batch()])
    metrics.spliced = s = spliced_loss(model, clt, data.get_batch("val", 0, opts.batches, opts.seq_len))
    c = clt.cfg
    print(f"{opts.dictionary} ({c.architecture} CLT, {c.n_layers} layers x d_sae {c.d_sae}) on {metrics.n_rows} tokens:")
    for layer in range(c.n_layers):
        print(f"  layer {layer}: explained variance {metrics.layer_explained_variance[layer]:.4f}  "
              f"L0 {metrics.layer_l0[layer]:.2f}  dead {metrics.layer_dead_frac[layer]:.1%}")
    print(f"  all layers: explained variance {metrics.explained_variance:.4f}  dead {metrics.dead_frac:.1%}  "
          f"dense (>10%) {metrics.dense_frac:.1%}")
    print(f"  every MLP replaced: CE clean {s.ce_clean:.4f}  spliced {s.ce_spliced:.4f}  zero-ablated {s.ce_zero:.4f}  "
          f"CE recovered {s.ce_recovered:.4f}{s.recovered_note()}  KL {s.kl:.4g}")
    _write(opts, metrics)
    return metrics


def _text(opts: DictionaryEvalOptions, tokenizer: Any) -> Any:
    """The held-out text, tokenised (a checkpoint without its tokenizer is refused in one line)."""
    from circuitlab.data import DataConfig, build_data
    from circuitlab.errors import CircuitlabError

    if tokenizer is None:
        raise CircuitlabError(f"{opts.checkpoint} has no tokenizer saved with it; cannot read text data")
    return build_data(DataConfig(source=opts.data, n_stories=2000), tokenizer=tokenizer)


def _write(opts: DictionaryEvalOptions, metrics: Any) -> None:
    from circuitlab.atomic import atomic_write_text, json_text

    if opts.json:
        atomic_write_text(Path(opts.json), json_text(metrics.to_dict(), indent=2))
