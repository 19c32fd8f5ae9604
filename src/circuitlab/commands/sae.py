"""circuitlab sae: sparse dictionaries (SAEs and transcoders) on a model's activations.

Subcommands live in SUBCOMMANDS: name -> (help, example, add_arguments, run); adding one is a
function pair and one entry.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path
from typing import Any

from circuitlab.checks import Number
from circuitlab.commands._args import positive_int

EVAL_SEQUENCES = 64     # sae eval's default sample: 64 x 64 = 4096 tokens
EVAL_BUDGET = 2 ** 28   # floats sae eval holds at once (1 GiB): bounds --batches x --seq-len

HELP = "sparse dictionaries: train SAEs / transcoders on a model's activations, evaluate them, draw feature dashboards"
EXAMPLE = "circuitlab sae train --config sae-demo --out runs/sae-demo   (then: circuitlab sae eval --help)"


# ---------------------------------------------------------------------------- train

TRAIN_HELP = "train one or more dictionaries from a config (one forward pass feeds them all)"
TRAIN_EXAMPLE = "circuitlab sae train --config sae-demo --set train.steps=500 --out runs/sae-demo"


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True,
                   help="a YAML file, or the name of a bundled one (sae-demo, transcoder-demo, clt-demo)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. train.steps=500 or model=runs/x (repeatable)")
    p.add_argument("--target-l0", type=float, default=None, metavar="L0",
                   help="steer the ReLU / JumpReLU dictionaries' sparsity coefficient to this L0 (train.target_l0; "
                        "TopK-family dictionaries keep their k)")
    p.add_argument("--out", default=None, help="output folder (default runs/<config name>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint (a run "
                                                          "stopped before its first checkpoint starts over)")
    p.add_argument("--overwrite", action="store_true", help="replace a finished or unfinished run in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _is_sae_run(folder: Path) -> bool:
    """Our own earlier output (also one written before output folders were marked)."""
    from circuitlab.dictionaries.train import CHECKPOINT

    return any((folder / n).exists() for n in ("results.json", "dictionaries", CHECKPOINT, "metrics.jsonl"))


def _start_or_resume(out: Path, resume: bool, overwrite: bool) -> bool:
    """Whether this run resumes a checkpoint in out. A fresh start is refused over a checkpoint (pointing at
    --resume) and over a finished run (pointing at --overwrite); a folder an interrupt left before the first
    checkpoint is reused, with or without --resume, and said."""
    from circuitlab.dictionaries.train import CHECKPOINT, STATE
    from circuitlab.errors import CircuitlabError
    from circuitlab.training.outputs import MARKER

    saved = (out / CHECKPOINT / STATE).is_file()
    if resume and overwrite:
        raise CircuitlabError("--resume continues the run in --out and --overwrite replaces it: give one of them")
    held = {p.name for p in out.iterdir()} if out.is_dir() else set()
    unsaved = not saved and held and not held - {MARKER, "metrics.jsonl", CHECKPOINT}
    if unsaved:  # what an interrupt before the first checkpoint leaves: nothing to keep
        print(f"{out} holds no checkpoint yet (the earlier run stopped before its first): starting from step 0")
        for name in held - {MARKER}:
            shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink()
        return False
    if resume:
        if saved:
            return True
        raise CircuitlabError(f"nothing to resume in {out} (no {CHECKPOINT}/)"
                              + ("; run without --resume to start" if not held else "; give another --out"))
    if saved and not overwrite:
        raise CircuitlabError(f"{out} holds an unfinished run (its {CHECKPOINT}/): pass --resume to continue it, "
                              "or --overwrite to start over")
    return False


def _load_yaml(name: str, overrides: list[str]) -> dict[str, Any]:
    from circuitlab.errors import ConfigError
    from circuitlab.training.config import load_yaml_mapping

    path, data = load_yaml_mapping(name, overrides, "model, data, store, dictionaries and train")
    unknown = sorted(set(data) - {"name", "description", "model", "data", "store", "dictionaries", "train", "needs"})
    if unknown:
        raise ConfigError(f"unknown section(s) in {path}: {', '.join(unknown)}")
    if not data.get("model") or not isinstance(data.get("dictionaries"), list) or not data["dictionaries"]:
        raise ConfigError(f"{path} needs `model:` (a checkpoint folder) and a non-empty `dictionaries:` list")
    data.setdefault("name", path.stem)
    return data


KINDS = ("dictionary", "clt", "transcoders")


def _layer_transcoder(d: dict[str, Any], layer: int) -> dict[str, Any]:
    """One layer's transcoder of a `kind: transcoders` entry (a transcoder per MLP, reading its input)."""
    from circuitlab.dictionaries.clt import CLTConfig

    d = {k: v for k, v in d.items() if k != "kind"}
    in_hook, out_hook = d.pop("input_hook", CLTConfig.input_hook), d.pop("output_hook", CLTConfig.output_hook)
    meta = {**d.pop("metadata", {})}
    meta["name"] = f"{meta.get('name', 'transcoders')}-{layer}"
    return {**d, "hook_name": in_hook.format(layer=layer), "out_hook_name": out_hook.format(layer=layer), "metadata": meta}


def _expand_layers(entries: list, model) -> tuple[list, dict[str, list[int]]]:
    """CLT entries get the model's layer count and width; a `transcoders` entry becomes one transcoder per layer
    (grouped, so that they are also evaluated replacing every MLP at once)."""
    from circuitlab.errors import CircuitlabError

    out, groups = [], {}
    L, d_model = model.cfg.n_layers, model.cfg.d_model
    for d, own in entries:
        kind = d.get("kind", "dictionary")
        if kind == "clt":
            if d.get("n_layers", L) != L:
                raise CircuitlabError(f"the CLT config says n_layers={d['n_layers']} but the model has {L} layers")
            if d.get("d_model", d_model) != d_model:
                raise CircuitlabError(f"the CLT config says d_model={d['d_model']} but the model's d_model is {d_model}")
            out.append(({**d, "n_layers": L, "d_model": d_model}, own))
        elif kind == "transcoders":
            name = (d.get("metadata") or {}).get("name", "transcoders")
            groups[name] = list(range(len(out), len(out) + L))
            out += [(_layer_transcoder(d, layer), own) for layer in range(L)]
        else:
            out.append((d, own))
    return out, groups


def _store_settings(raw: dict[str, Any]) -> dict[str, Any]:
    from circuitlab.errors import refuse_unknown

    known = {"seq_len": 64, "seqs_per_chunk": 32, "skip_positions": 0, "cache": None, "cache_dtype": "float16",
             "cache_max_gb": None}
    refuse_unknown(raw, known, "store field(s)", list_known=True)
    return {**known, **raw}


def _run_train(args: argparse.Namespace) -> int:
    from circuitlab.data import DataConfig, build_data
    from circuitlab.dictionaries import DictionaryConfig, base_model_id
    from circuitlab.dictionaries.clt import CLTConfig, CrossLayerTranscoder
    from circuitlab.dictionaries.metrics import spliced_loss
    from circuitlab.dictionaries.store import ActivationStore, CachedActivations, ModelActivations, cache_activations
    from circuitlab.dictionaries.train import PER_DICTIONARY, CHECKPOINT, DictionaryTrainer, DictTrainConfig
    from circuitlab.errors import CircuitlabError, ConfigError
    from circuitlab.training import load_checkpoint
    from circuitlab.training.outputs import output_folder

    overrides = [*args.set, *([f"train.target_l0={args.target_l0}"] if args.target_l0 is not None else [])]
    data = _load_yaml(args.config, overrides)
    out = Path(args.out or f"runs/{data['name']}")
    resume = _start_or_resume(out, args.resume, args.overwrite)
    train = DictTrainConfig.from_dict(data.get("train") or {})
    store_cfg = _store_settings(data.get("store") or {})
    entries = []
    for i, d in enumerate(data["dictionaries"]):
        if not isinstance(d, dict):
            raise ConfigError(f"dictionaries[{i}] must be a mapping (architecture, hook_name, d_sae, ...)")
        d = dict(d)
        own = d.pop("train", None) or {}
        entries.append((d, own))
    for d, own in entries:  # validate what can be validated before the model is loaded
        kind = d.get("kind", "dictionary")
        if kind not in KINDS:
            raise ConfigError(f"unknown dictionary kind {kind!r}; use one of {', '.join(KINDS)}")
        if kind == "clt":
            CLTConfig.from_dict({"n_layers": 1, "d_model": 1, **d})
        elif kind == "transcoders":
            DictionaryConfig.from_dict({"d_in": 1, **_layer_transcoder(d, 0)})
        else:
            d.pop("kind", None)
            DictionaryConfig.from_dict({"d_in": 1, "d_out": 1 if d.get("out_hook_name") else None, **d} if "d_in" not in d else d)
        bad = sorted(set(own) - set(PER_DICTIONARY))
        if bad:
            raise ConfigError(f"a dictionary's own train settings may only be {', '.join(PER_DICTIONARY)}; got {bad}")

    model, tokenizer, _ = load_checkpoint(str(data["model"]))
    if tokenizer is None:
        raise CircuitlabError(f"{data['model']} has no tokenizer saved with it; cannot read text data")
    tokens = build_data(DataConfig.from_dict(data.get("data") or {}), tokenizer=tokenizer)
    entries, groups = _expand_layers(entries, model)
    hooks = [h for d, _ in entries for h in
             (CLTConfig.from_dict(d).hooks() if d.get("kind") == "clt" else (d.get("hook_name"), d.get("out_hook_name"))) if h]
    source = ModelActivations(model, hooks, tokens, seq_len=store_cfg["seq_len"], seqs_per_chunk=store_cfg["seqs_per_chunk"],
                              skip_positions=store_cfg["skip_positions"])
    base = base_model_id(model, name=str(data["model"]))
    configs = []
    for d, _ in entries:
        if d.get("kind") == "clt":
            configs.append(CLTConfig.from_dict({**d, "base_model": base}))
            continue
        d = {"d_in": source.widths[d["hook_name"]], **d, "base_model": base}
        if d.get("out_hook_name"):
            d.setdefault("d_out", source.widths[d["out_hook_name"]])
        configs.append(DictionaryConfig.from_dict(d))
    val_source = source
    if store_cfg["cache"]:
        n_train = math.ceil(train.steps * train.batch_size / source.rows_per_chunk)
        n_val = math.ceil(train.eval_batches * train.batch_size / source.rows_per_chunk)
        cap = store_cfg["cache_max_gb"]
        cap = int(float(cap) * 2**30) if cap else None
        for split, n in (("train", n_train), ("val", n_val)):
            cache_activations(source, store_cfg["cache"], n, split=split, dtype=store_cfg["cache_dtype"], max_bytes=cap,
                              progress=not args.no_progress)
        source = val_source = CachedActivations(store_cfg["cache"], seed=train.seed)
    trainer = DictionaryTrainer(configs, train, ActivationStore(source, train.batch_size, seed=train.seed),
                                ActivationStore(val_source, train.batch_size, seed=train.seed, split="val"),
                                overrides=[own for _, own in entries])
    # what else decides the result: a resume with other values is refused, naming them
    trainer.run_settings = {"model": str(data["model"]), "data": data.get("data") or {},
                            "store": {k: v for k, v in store_cfg.items() if k not in ("cache", "cache_max_gb")}}
    if not resume:
        output_folder(out, "sae-train", overwrite=args.overwrite, keep_previous=False, is_previous=_is_sae_run)
    result = trainer.fit(out, progress=not args.no_progress)
    toks = tokens.get_batch("val", 0, 8, store_cfg["seq_len"])
    summary = result.to_dict()
    for entry, sae, folder in zip(summary["dictionaries"], result.dictionaries, result.folders):
        s = spliced_loss(model, sae, toks)
        entry["metrics"]["spliced"] = s.to_dict()
        m = entry["metrics"]
        per_layer = " per layer" if isinstance(sae, CrossLayerTranscoder) else ""
        print(f"{folder}: L0 {m['l0']:.1f}{per_layer}, explained variance {m['explained_variance']:.3f}, dead {m['dead_frac']:.1%}, "
              f"CE recovered {s.ce_recovered:.3f} (CE {s.ce_clean:.3f} -> {s.ce_spliced:.3f}; zero-ablated {s.ce_zero:.3f})")
    summary["replacements"] = []
    for name, members in groups.items():  # a transcoder per layer, every MLP replaced at once, beside the CLTs
        s = spliced_loss(model, [result.dictionaries[i] for i in members], toks)
        ms = [summary["dictionaries"][i]["metrics"] for i in members]
        fvu = sum(m["fvu"] for m in ms) / len(ms)
        summary["replacements"].append({"name": name, "dictionaries": [summary["dictionaries"][i]["name"] for i in members],
                                        "mean_layer_explained_variance": 1 - fvu,
                                        "mean_l0": sum(m["l0"] for m in ms) / len(ms), "spliced": s.to_dict()})
        print(f"{name} ({len(members)} per-layer transcoders, every MLP replaced at once): mean explained variance "
              f"{1 - fvu:.3f}, CE recovered {s.ce_recovered:.3f} (CE {s.ce_clean:.3f} -> {s.ce_spliced:.3f}), KL {s.kl:.4f}")
    from circuitlab.atomic import atomic_write_text

    atomic_write_text(out / "results.json", json.dumps(summary, indent=2))
    print(f"wrote {out}/results.json")
    return 0


# ---------------------------------------------------------------------------- eval

EVAL_HELP = "evaluate a dictionary on a model: L0, explained variance, density, CE loss recovered when spliced in"
EVAL_EXAMPLE = "circuitlab sae eval --dictionary runs/sae-demo/dictionaries/blocks.1.hook_resid_pre-topk --checkpoint runs/demo/2l"


def _eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dictionary", required=True,
                   help="a dictionary folder or file: ours, SAELens, Gemma Scope (params.npz), Gemma Scope 2, Llama Scope, or one "
                        "layer_N.safetensors of a circuit-tracer set; or a CLT (ours, circuit-tracer's or sparsify's layout)")
    p.add_argument("--checkpoint", "--model", dest="checkpoint", required=True, help="the model it was trained on")
    p.add_argument("--data", default="stories", help='text source: "stories", "file:PATH", "hf:NAME" ... (default stories)')
    p.add_argument("--batches", type=positive_int, default=EVAL_SEQUENCES,
                   help=f"sequences of held-out text to evaluate on (default {EVAL_SEQUENCES}: with --seq-len 64, "
                        "4096 tokens, so a latent counted dead fired on none of them; the resolution is printed)")
    p.add_argument("--seq-len", type=Number(int, low=2).arg, default=64, help="tokens per sequence (default 64)")
    p.add_argument("--json", default=None, help="also write the metrics to this JSON file")


def _run_eval(args: argparse.Namespace) -> int:
    from circuitlab.atomic import atomic_write_text
    from circuitlab.data import DataConfig, build_data
    from circuitlab.dictionaries import SparseDictionary
    from circuitlab.dictionaries.metrics import evaluate, spliced_loss
    from circuitlab.dictionaries.store import ActivationStore, ModelActivations
    from circuitlab.dictionaries.train import check_fits
    from circuitlab.errors import CircuitlabError
    from circuitlab.training import load_checkpoint

    from circuitlab.dictionaries.clt import is_clt_folder

    if is_clt_folder(args.dictionary):
        return _eval_clt(args)
    model, tokenizer, _ = load_checkpoint(args.checkpoint)
    sae = SparseDictionary.load(args.dictionary, model=model)  # checked against the model, hooks bound
    if args.seq_len > model.cfg.n_ctx:
        print(f"--seq-len {args.seq_len} is longer than the model's context: using {model.cfg.n_ctx}")
        args.seq_len = model.cfg.n_ctx
    rows = args.batches * args.seq_len
    per_row = 4 * (sae.cfg.d_sae + sae.cfg.d_in + (sae.cfg.d_out or sae.cfg.d_in)) + 2 * model.cfg.d_vocab
    if rows * per_row > EVAL_BUDGET:
        raise CircuitlabError(f"--batches {args.batches} x --seq-len {args.seq_len} = {rows} tokens need "
                              f"{rows * per_row * 4 / 2**30:.1f} GiB at once for this dictionary and model (limit "
                              f"{EVAL_BUDGET * 4 / 2**30:.0f} GiB); give at most "
                              f"{max(1, EVAL_BUDGET // (per_row * args.seq_len))} batches")
    if tokenizer is None:
        raise CircuitlabError(f"{args.checkpoint} has no tokenizer saved with it; cannot read text data")
    data = build_data(DataConfig(source=args.data, n_stories=2000), tokenizer=tokenizer)
    hooks = [h for h in (sae.cfg.hook_name, sae.cfg.out_hook_name) if h]
    source = ModelActivations(model, hooks, data, seq_len=args.seq_len, seqs_per_chunk=args.batches)
    check_fits(sae.cfg, source.widths)
    store = ActivationStore(source, batch_size=args.batches * args.seq_len, split="val")
    metrics = evaluate(sae, [store.next_batch()])
    metrics.spliced = spliced_loss(model, sae, data.get_batch("val", 0, args.batches, args.seq_len))
    s = metrics.spliced
    print(f"{args.dictionary} ({sae.cfg.architecture}, {sae.cfg.hook_name}, d_sae {sae.cfg.d_sae}) on {metrics.n_rows} tokens:")
    print(f"  L0 {metrics.l0:.2f}  explained variance {metrics.explained_variance:.4f}  MSE {metrics.mse:.4g} "
          "(model units, summed over dims; sae train logs the same)  "
          f"cosine {metrics.cosine:.4f}  L2 ratio {metrics.l2_ratio:.3f}")
    print(f"  dead {metrics.dead_frac:.1%} (fired on none of the {metrics.n_rows:,} tokens: a rate below "
          f"1/{metrics.n_rows:,} reads as dead)  dense (>10%) {metrics.dense_frac:.1%}")
    print(f"  CE clean {s.ce_clean:.4f}  spliced {s.ce_spliced:.4f}  zero-ablated {s.ce_zero:.4f}  "
          f"CE recovered {s.ce_recovered:.4f}  KL {s.kl:.4g}")
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(metrics.to_dict(), indent=2))
    return 0


def _eval_clt(args: argparse.Namespace) -> int:
    """sae eval for a cross-layer transcoder: per-layer reconstruction, and the model with every MLP replaced."""
    from circuitlab.atomic import atomic_write_text
    from circuitlab.data import DataConfig, build_data
    from circuitlab.dictionaries.clt import CrossLayerTranscoder, check_clt_fits
    from circuitlab.dictionaries.clt_train import evaluate_clt
    from circuitlab.dictionaries.metrics import spliced_loss
    from circuitlab.dictionaries.store import ActivationStore, ModelActivations
    from circuitlab.errors import CircuitlabError
    from circuitlab.training import load_checkpoint

    clt = CrossLayerTranscoder.load(args.dictionary)
    model, tokenizer, _ = load_checkpoint(args.checkpoint)
    check_clt_fits(clt, model, f"the CLT in {args.dictionary}")
    if tokenizer is None:
        raise CircuitlabError(f"{args.checkpoint} has no tokenizer saved with it; cannot read text data")
    data = build_data(DataConfig(source=args.data, n_stories=2000), tokenizer=tokenizer)
    source = ModelActivations(model, clt.cfg.hooks(), data, seq_len=args.seq_len, seqs_per_chunk=args.batches)
    metrics = evaluate_clt(clt, [ActivationStore(source, batch_size=args.batches * args.seq_len, split="val").next_batch()])
    metrics.spliced = s = spliced_loss(model, clt, data.get_batch("val", 0, args.batches, args.seq_len))
    c = clt.cfg
    print(f"{args.dictionary} ({c.architecture} CLT, {c.n_layers} layers x d_sae {c.d_sae}) on {metrics.n_rows} tokens:")
    for layer in range(c.n_layers):
        print(f"  layer {layer}: explained variance {metrics.layer_explained_variance[layer]:.4f}  "
              f"L0 {metrics.layer_l0[layer]:.2f}  dead {metrics.layer_dead_frac[layer]:.1%}")
    print(f"  all layers: explained variance {metrics.explained_variance:.4f}  dead {metrics.dead_frac:.1%}  "
          f"dense (>10%) {metrics.dense_frac:.1%}")
    print(f"  every MLP replaced: CE clean {s.ce_clean:.4f}  spliced {s.ce_spliced:.4f}  zero-ablated {s.ce_zero:.4f}  "
          f"CE recovered {s.ce_recovered:.4f}  KL {s.kl:.4g}")
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(metrics.to_dict(), indent=2))
    return 0


# ---------------------------------------------------------------------------- dashboards


def add_dashboards_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.experiments.dashboards import TOKENS as DASHBOARD_TOKENS

    p.add_argument("--dictionary", required=True, metavar="DIR", help="a dictionary folder or file: ours, SAELens, Gemma Scope (params.npz), Gemma Scope 2, Llama Scope, or one layer_N.safetensors of a circuit-tracer set")
    p.add_argument("--checkpoint", required=True, metavar="DIR", help="the run or checkpoint it was trained on")
    p.add_argument("--out", default=None, metavar="DIR", help="where to write (default: DICTIONARY/dashboards)")
    p.add_argument("--data", default="stories",
                   help="text for the contexts: stories (held-out built-in stories), file:PATH, folder:PATH, hf:NAME")
    p.add_argument("--tokens", type=DASHBOARD_TOKENS.arg, default=32_768,
                   help=f"tokens to run (default 32768, at most {DASHBOARD_TOKENS.high})")
    p.add_argument("--overwrite", action="store_true", help="replace earlier dashboards in --out (default: keep "
                                                          "them, renamed)")
    p.add_argument("--features", type=int, nargs="+", default=None, metavar="N",
                   help="features to draw cards for in report.html (default: the 50 most frequent)")
    p.add_argument("--layer", type=int, default=None, metavar="L",
                   help="for a cross-layer transcoder: the layer whose features to draw (their cards list the layers they write to)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_dashboards(args: argparse.Namespace) -> int:
    from circuitlab.experiments.dashboards import DashboardOptions, build_dashboards

    found = build_dashboards(DashboardOptions(args.dictionary, args.checkpoint, args.out, args.data, args.tokens,
                                              features=args.features, layer=args.layer, device=args.device,
                                              progress=not args.no_progress, overwrite=args.overwrite))
    if found.kept:
        print(f"kept the earlier dashboards as {found.kept}")
    s = found.summary
    print(f"{s['d_sae']} features of {s['hook_name']} on {s['n_tokens']:,} tokens: {s['dead_fraction']:.1%} never "
          f"fired, {s['dense_fraction']:.1%} fire on more than 10% of tokens")
    print(f"wrote {found.folder}/ (dashboards.safetensors, dashboards.json, report.html); browse them with "
          f"circuitlab serve --checkpoint {args.checkpoint} --dictionary {args.dictionary}")
    return 0


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/features", help="output directory (an existing one is kept, renamed)")
    p.add_argument("--model-steps", type=positive_int, default=None, help="training steps of the 1-layer model (default 600)")
    p.add_argument("--dictionary-steps", type=positive_int, default=None, help="training steps of the dictionary (default 500)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def run_demo(args: argparse.Namespace) -> int:
    from circuitlab.experiments.features_demo import FeaturesDemoOptions, run_features_demo

    opts = FeaturesDemoOptions(out=Path(args.out), progress=not args.no_progress)
    if args.model_steps is not None:
        opts.model_steps = args.model_steps
    if args.dictionary_steps is not None:
        opts.dictionary_steps = args.dictionary_steps
    result = run_features_demo(opts)
    print()
    print((result.out / "report.md").read_text())
    print(f"wrote {result.out}/: report.html, report.md, results.json, model/, dictionary/ in "
          f"{result.wall_seconds['total']:.0f}s ({result.scaled_seconds:.0f}s on a 150 GFLOP/s machine)")
    return 0


# ---------------------------------------------------------------------------- wiring

SUBCOMMANDS = {
    "train": (TRAIN_HELP, TRAIN_EXAMPLE, _train_args, _run_train),
    "eval": (EVAL_HELP, EVAL_EXAMPLE, _eval_args, _run_eval),
    "dashboards": ("feature dashboards: top contexts, activation histogram, density, promoted/suppressed tokens",
                   "circuitlab sae dashboards --dictionary runs/sae/dictionaries/mlp --checkpoint runs/features/model",
                   add_dashboards_arguments, run_dashboards),
    "demo": ("features demo: a 1-layer MLP model on the stories, a TopK dictionary on its MLP, readable features",
             "circuitlab sae demo --out runs/features", add_demo_arguments, run_demo),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.commands import add_subcommands

    add_subcommands(p, SUBCOMMANDS, "sae")


def run(args: argparse.Namespace) -> int:
    from circuitlab.commands import run_subcommand

    return run_subcommand(args, SUBCOMMANDS, "sae")
