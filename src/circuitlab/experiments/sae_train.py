"""`circuitlab sae train`: sparse dictionaries (SAEs, transcoders, per-layer transcoder sets, CLTs) trained from a
YAML config on one stream of a model's activations, then spliced into the model on held-out text.

    data = load_sae_config("sae-demo", ["train.steps=500"])        # a file or a bundled config, --set overrides
    out = Path("runs/sae-demo")
    resume = start_or_resume(out, resume=False, overwrite=False)   # the output-folder policy of a resumable run
    summary = train_dictionaries(data, out, resume=resume)         # = out/results.json
    summary["dictionaries"][0]["metrics"]["spliced"]["ce_recovered"]

The command's options are SaeTrainOptions (the run's: which config, where, resume or not, on what device); what
is trained is the config's (dictionaries/train_config.py).
"""
from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuitlab.atomic import json_text
from circuitlab.dictionaries.parallel import MODES
from circuitlab.spec import Options, option

if TYPE_CHECKING:
    from circuitlab.model import Transformer


@dataclass(frozen=True)
class SaeTrainOptions(Options):
    """How `circuitlab sae train` runs a config (its flags are these fields, in this order). device is the Python
    API's alone, its flag written in commands/sae.py from this default (the package writes device="cpu" as the
    default of ~20 loaders)."""

    config: str = option(None, required=True,
                         help="a YAML file, or the name of a bundled one (sae-demo, transcoder-demo, clt-demo)")
    overrides: tuple[str, ...] = option((), repeat=True, flag="--set", metavar="KEY=VALUE",
                                        help="override a config field, e.g. train.steps=500 or model=runs/x (repeatable)")
    target_l0: str | None = option(None, metavar="L0",
                                   help="steer the ReLU / JumpReLU dictionaries' sparsity coefficient to this L0 "
                                        "(train.target_l0; TopK-family dictionaries keep their k); a CLT may take one "
                                        "per layer: 8,8,4")
    out: str | None = option(None, help="output folder (default runs/<config name>)")
    resume: bool = option(False, help="continue the run in --out from its checkpoint (a run stopped before its first "
                                      "checkpoint starts over)")
    overwrite: bool = option(False, help="replace a finished or unfinished run in --out")
    progress: bool = option(True, flag="--no-progress", help="no progress bars")
    device: str = "cpu"
    parallel: str = option("data", choices=MODES,
                           help="under torchrun: data = every rank trains replicas on its own rows (gradients "
                                "averaged); modules = each dictionary on one rank, activations sent to it (default "
                                "{default})")

    def load_config(self) -> dict[str, Any]:
        """The config with --set's overrides, then --target-l0's (train.target_l0), applied (load_sae_config)."""
        target = [f"train.target_l0={self.target_l0}"] if self.target_l0 is not None else []
        return load_sae_config(self.config, [*self.overrides, *target])

    def out_folder(self, data: dict[str, Any]) -> Path:
        """--out, or runs/<the config's name>."""
        return Path(self.out or f"runs/{data['name']}")


def is_sae_run(folder: Path) -> bool:
    """Our own earlier output (also one written before output folders were marked)."""
    from circuitlab.dictionaries.train import CHECKPOINT

    return any((folder / n).exists() for n in ("results.json", "dictionaries", CHECKPOINT, "metrics.jsonl"))


def start_or_resume(out: Path, resume: bool, overwrite: bool, quiet: bool = False, tidy: bool = True) -> bool:
    """Whether this run resumes a checkpoint in out. A fresh start is refused over a checkpoint (pointing at
    --resume) and over a finished run (pointing at --overwrite); a folder an interrupt left before the first
    checkpoint is reused, with or without --resume, and said (not `quiet`; emptied only with `tidy`: under
    torchrun rank 0 tidies, the others only decide)."""
    from circuitlab.dictionaries.train import CHECKPOINT, STATE
    from circuitlab.errors import CircuitlabError
    from circuitlab.training.outputs import MARKER

    saved = (out / CHECKPOINT / STATE).is_file()
    if resume and overwrite:
        raise CircuitlabError("--resume continues the run in --out and --overwrite replaces it: give one of them")
    held = {p.name for p in out.iterdir()} if out.is_dir() else set()
    unsaved = not saved and held and not held - {MARKER, "metrics.jsonl", CHECKPOINT}
    if unsaved:  # what an interrupt before the first checkpoint leaves: nothing to keep
        if not quiet:
            print(f"{out} holds no checkpoint yet (the earlier run stopped before its first): starting from step 0")
        for name in held - {MARKER} if tidy else ():
            shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink()
        return False
    if resume:
        if saved:
            return True
        raise CircuitlabError(f"nothing to resume in {out} (no {CHECKPOINT}/)"
                              + ("; run without --resume to start" if not held else "; give another --out"))
    if saved and not overwrite:
        if _finished(out):
            raise CircuitlabError(f"{out} holds a finished run: pass --overwrite to replace it, or give another "
                                  "--out (--resume with a higher train.steps trains it on)")
        raise CircuitlabError(f"{out} holds an unfinished run (its {CHECKPOINT}/): pass --resume to continue it, "
                              "or --overwrite to start over")
    return False


def _finished(out: Path) -> bool:
    """Whether the run in out finished: its results.json (written once the last step is saved) is of the step
    its checkpoint holds (a finished run trained on and stopped again is unfinished)."""
    import json

    from circuitlab.dictionaries.train import CHECKPOINT, STATE

    try:
        done = json.loads((out / "results.json").read_text())["steps"]
        return done == json.loads((out / CHECKPOINT / STATE).read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def stream_shards(out: Path, resume: bool, asked: int | None, world: int) -> int:
    """How many shards the token stream is cut into: a resume keeps its checkpoint's (any world size dividing
    it continues exactly; the store refuses another in one line); else store.shards, default the world size."""
    from circuitlab.checks import COUNT
    from circuitlab.dictionaries.train import CHECKPOINT, STATE
    from circuitlab.errors import ConfigError

    if resume:
        saved = int(json.loads((out / CHECKPOINT / STATE).read_text()).get("store", {}).get("shards", 1))
        if asked is not None and asked != saved:
            raise ConfigError(f"store.shards={asked} but the run in {out} cuts its token stream into {saved}: "
                              "drop store.shards to resume it")
        return saved
    return world if asked is None else COUNT.check(asked, "store.shards", ConfigError)


def load_sae_config(name: str, overrides: list[str]) -> dict[str, Any]:
    """The YAML config (a file or a bundled name) with `--set` overrides applied, its sections checked."""
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
STORE_SEQ_LEN = 64   # the config's store.seq_len when it gives none: tokens per sequence of the activation stream


def _layer_transcoder(d: dict[str, Any], layer: int, mlp_input: str | None = None) -> dict[str, Any]:
    """One layer's transcoder of a `kind: transcoders` entry (a transcoder per MLP, reading its input: the
    entry's input_hook, else mlp_input, the model's ModelConfig.mlp_input_hook template)."""
    from circuitlab.dictionaries.clt import CLTConfig

    d = {k: v for k, v in d.items() if k != "kind"}
    in_hook = d.pop("input_hook", mlp_input or CLTConfig.input_hook)
    out_hook = d.pop("output_hook", CLTConfig.output_hook)
    meta = {**d.pop("metadata", {})}
    meta["name"] = f"{meta.get('name', 'transcoders')}-{layer}"
    return {**d, "hook_name": in_hook.format(layer=layer), "out_hook_name": out_hook.format(layer=layer), "metadata": meta}


def _expand_layers(entries: list, model: Transformer, target_l0: float | list[float] = 0.0) -> tuple[list, dict[str, list[int]]]:
    """CLT entries get the model's layer count and width; a `transcoders` entry becomes one transcoder per layer
    (grouped, so that they are also evaluated replacing every MLP at once), each steered to its own layer's
    L0 when target_l0 (its own, else train's) names one per layer."""
    from circuitlab.dictionaries.train import TRAIN_RULES, per_layer_targets, steers_l0
    from circuitlab.errors import CircuitlabError, ConfigError

    out, groups = [], {}
    L, d_model = model.cfg.n_layers, model.cfg.d_model
    mlp_input = model.cfg.mlp_input_hook("{layer}")  # the family's MLP input, when an entry names none
    for d, own in entries:
        kind = d.get("kind", "dictionary")
        if kind == "clt":
            if d.get("n_layers", L) != L:
                raise CircuitlabError(f"the CLT config says n_layers={d['n_layers']} but the model has {L} layers")
            if d.get("d_model", d_model) != d_model:
                raise CircuitlabError(f"the CLT config says d_model={d['d_model']} but the model's d_model is {d_model}")
            out.append(({"input_hook": mlp_input, **d, "n_layers": L, "d_model": d_model}, own))
        elif kind == "transcoders":
            name = (d.get("metadata") or {}).get("name", "transcoders")
            groups[name] = list(range(len(out), len(out) + L))
            target = TRAIN_RULES["target_l0"].check(own.get("target_l0", target_l0), "train.target_l0", ConfigError)
            if not isinstance(target, list) or not steers_l0(d.get("architecture", "relu")):
                out += [(_layer_transcoder(d, layer, mlp_input), own) for layer in range(L)]
                continue
            targets = per_layer_targets(target, L, f"the model has {L} layers")
            out += [(_layer_transcoder(d, layer, mlp_input), {**own, "target_l0": targets[layer]}) for layer in range(L)]
        else:
            out.append((d, own))
    return out, groups


def _store_settings(raw: dict[str, Any]) -> dict[str, Any]:
    from circuitlab.errors import refuse_unknown

    known = {"seq_len": STORE_SEQ_LEN, "seqs_per_chunk": 32, "skip_positions": 0, "cache": None, "cache_dtype": "float16",
             "cache_max_gb": None, "shards": None, "autocast": None}
    refuse_unknown(raw, known, "store field(s)", list_known=True)
    return {**known, **raw}


def training_estimate(configs: list, batch_size: int, steps: int, passes: int = 0, pass_flops: float = 0.0,
                      hooks: int = 0) -> Any:
    """A training step's memory beyond the weights (dictionaries.train.dictionary_step_estimate), with the flops
    of all `steps` steps and of the model's `passes` forward passes (pass_flops each; every pass serves all
    `hooks` at once), so its seconds are the whole run's."""
    from circuitlab.dictionaries.train import dictionary_step_estimate

    est = dictionary_step_estimate(configs, batch_size)
    dictionary_flops = (est.flops or 0.0) * steps
    cost = (f"; cost: {passes:,} model passes ({flops_text(pass_flops * passes)}, one pass serving {_all_hooks(hooks)}) "
            f"+ {flops_text(dictionary_flops)} in the dictionaries" if passes else "")
    est.what = f"training ({steps:,} steps; {est.what}{cost})"
    # the forward reaches about the same share of the machine's matmul speed as a training step (Estimate.efficiency)
    est.flops = dictionary_flops + passes * pass_flops
    return est


def model_passes(train: Any, rows_per_chunk: int, shards: int) -> int:
    """The model's forward passes a run from step 0 makes: the first chunk that sets the input scales and b_dec
    (DictionaryTrainer.init_from_data), the training stream's chunks (each shard reads its own; one pass serves
    every dictionary's hooks) and each held-out evaluation's (every eval_every steps and at the end, from the
    validation stream's start)."""
    train_chunks = shards * math.ceil(train.steps * train.batch_size / shards / rows_per_chunk)
    evaluations = (train.steps // train.eval_every if train.eval_every else 0) + 1
    return 1 + train_chunks + evaluations * math.ceil(train.eval_batches * train.batch_size / rows_per_chunk)


def cost_line(source: Any, steps: int, step_flops: float, seconds: float, est: Any) -> str:
    """What the run just did beside what was estimated: its model passes and dictionary flops, its seconds."""
    said = est.seconds()
    return (f"cost: {source.passes:,} model passes ({flops_text(source.passes * source.pass_flops())}, each "
            f"serving {_all_hooks(len(source.hooks))}) + {flops_text(steps * step_flops)} in the dictionaries "
            f"({steps:,} steps) in {seconds:.0f} s" + (f" (estimated {said:.0f} s)" if said else ""))


def _all_hooks(n: int) -> str:
    return "its one hook" if n == 1 else f"all {n} hooks"


def flops_text(flops: float) -> str:
    """12.3 TFLOP, 4.5 GFLOP, 678 MFLOP."""
    for unit, size in (("TFLOP", 1e12), ("GFLOP", 1e9)):
        if flops >= size:
            return f"{flops / size:.3g} {unit}"
    return f"{flops / 1e6:.3g} MFLOP"


def train_dictionaries(data: dict[str, Any], out: Path, *, resume: bool = False, overwrite: bool = False,
                       progress: bool = True, device: str = SaeTrainOptions.device, parallel: str | None = None,
                       estimate_only: bool = False) -> dict[str, Any]:
    """Train every dictionary of a config (load_sae_config) on one stream of the model's activations; save them,
    their checkpoint and metrics.jsonl in out, then splice each into the model on held-out text. Returns the
    summary written to out/results.json (metrics and spliced CE per dictionary, per-layer sets replaced at once).
    resume: continue out's checkpoint (start_or_resume decides); overwrite: replace an earlier run in out.
    Under torchrun (a process group set up by training.distributed.setup) every rank calls it: `parallel` "data"
    (default) or "modules" (dictionaries/parallel.py); rank 0 writes and evaluates, the others return {}.
    estimate_only: return {"estimate", "line"} (training_estimate) once the dictionaries' shapes are known, before
    any activation is read or anything is written (`sae train --estimate`)."""
    import circuitlab.training.distributed as D

    from circuitlab.atomic import atomic_write_text
    from circuitlab.data import DataConfig, build_data
    from circuitlab.dictionaries.clt import CLTConfig
    from circuitlab.dictionaries.store import ActivationStore, ModelActivations
    from circuitlab.dictionaries.train import DictionaryTrainer, DictTrainConfig
    from circuitlab.errors import CircuitlabError
    from circuitlab.training import load_checkpoint
    from circuitlab.training.outputs import check_output_folder, output_folder

    train = DictTrainConfig.from_dict(data.get("train") or {})
    store_cfg = _store_settings(data.get("store") or {})
    rank, world = D.rank_and_world()
    shards = stream_shards(out, resume, store_cfg["shards"], world)
    entries = _read_entries(data["dictionaries"])
    if not resume:   # refused now what output_folder would refuse later, before the model is read or data cached
        check_output_folder(out, "sae-train", overwrite=overwrite, keep_previous=False, is_previous=is_sae_run)
    model, tokenizer, _ = load_checkpoint(str(data["model"]))
    if tokenizer is None:
        raise CircuitlabError(f"{data['model']} has no tokenizer saved with it; cannot read text data")
    with D.rank_zero_first():  # rank 0 tokenizes (and caches) the text; the others then read its cache
        tokens = build_data(DataConfig.from_dict(data.get("data") or {}), tokenizer=tokenizer)
    entries, groups = _expand_layers(entries, model, train.target_l0)
    hooks = [h for d, _ in entries for h in
             (CLTConfig.from_dict(d).hooks() if d.get("kind") == "clt" else (d.get("hook_name"), d.get("out_hook_name"))) if h]
    source = ModelActivations(model.to(device), hooks, tokens, seq_len=store_cfg["seq_len"],
                              seqs_per_chunk=store_cfg["seqs_per_chunk"], skip_positions=store_cfg["skip_positions"],
                              autocast=store_cfg["autocast"])
    configs = _dictionary_configs(entries, source.widths, model, str(data["model"]))
    est = training_estimate(configs, train.batch_size, train.steps, model_passes(train, source.rows_per_chunk, shards),
                            source.pass_flops(), len(source.hooks))
    if estimate_only:
        est.timed()
        return {"estimate": est.to_dict(), "line": est.line()}
    est.timed()   # its seconds at this machine's speed, said now and beside the measured cost at the end
    if progress and rank == 0:   # what it will hold and take, before the work
        print(est.line(), flush=True)
    model_source = source   # the one that runs the model (and counts its passes), cached or not
    source, val_source = _cached_sources(source, store_cfg, train, shards, progress)
    trainer = DictionaryTrainer(configs, train, ActivationStore(source, train.batch_size, seed=train.seed, shards=shards),
                                ActivationStore(val_source, train.batch_size, seed=train.seed, split="val"),
                                overrides=[own for _, own in entries], device=device, parallel=parallel)
    # what else decides the result: a resume with other values is refused, naming them (the stream's shards
    # are the store's own check: another number is refused in one line)
    trainer.run_settings = {"model": str(data["model"]), "data": data.get("data") or {},
                            "store": {k: v for k, v in store_cfg.items() if k not in ("cache", "cache_max_gb", "shards")}}
    if not resume and rank == 0:
        output_folder(out, "sae-train", overwrite=overwrite, keep_previous=False, is_previous=is_sae_run)
    D.barrier("preparing the output folder")  # no rank looks for a checkpoint there before rank 0 has cleared it
    from circuitlab.dictionaries.train import CHECKPOINT, STATE

    started = int(json.loads((out / CHECKPOINT / STATE).read_text())["step"]) if resume else 0
    t0 = time.perf_counter()
    result = trainer.fit(out, progress=progress)
    if rank != 0:  # rank 0 evaluates, prints and writes
        return {}
    print(cost_line(model_source, result.steps - started, trainer.step_flops(), time.perf_counter() - t0, est))
    toks = tokens.get_batch("val", 0, 8, store_cfg["seq_len"]).to(device)  # where the model is (--device cuda)
    summary = _spliced_summary(model, result, groups, toks)
    atomic_write_text(out / "results.json", json_text(summary, indent=2))
    return summary


def _read_entries(dictionaries: list) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(settings, own train settings) per entry of a config's dictionaries, each checked as far as it can be
    before the model is loaded (a ConfigError naming the entry or the setting)."""
    from circuitlab.dictionaries import DictionaryConfig
    from circuitlab.dictionaries.clt import CLTConfig
    from circuitlab.dictionaries.train import PER_DICTIONARY
    from circuitlab.errors import ConfigError

    entries = []
    for i, d in enumerate(dictionaries):
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
    return entries


def _dictionary_configs(entries: list, widths: dict[str, int], model: Transformer, model_name: str) -> list:
    """The DictionaryConfig or CLTConfig of each entry, widths (hook -> d_model) filling d_in and d_out."""
    from circuitlab.dictionaries import DictionaryConfig, base_model_id
    from circuitlab.dictionaries.clt import CLTConfig

    base = base_model_id(model, name=model_name)
    configs: list[DictionaryConfig | CLTConfig] = []
    for d, _ in entries:
        if d.get("kind") == "clt":
            configs.append(CLTConfig.from_dict({**d, "base_model": base}))
            continue
        d = {"d_in": widths[d["hook_name"]], **d, "base_model": base}
        if d.get("out_hook_name"):
            d.setdefault("d_out", widths[d["out_hook_name"]])
        configs.append(DictionaryConfig.from_dict(d))
    return configs


def _cached_sources(source, store_cfg: dict[str, Any], train, shards: int, progress: bool) -> tuple[Any, Any]:
    """(training source, validation source): the model's activations as they come, or, with store.cache, written
    to the cache first (train and val splits) and read back from it."""
    from circuitlab.dictionaries.store import CachedActivations, cache_activations

    val_source = source
    if store_cfg["cache"]:
        n_train = shards * math.ceil(train.steps * train.batch_size / shards / source.rows_per_chunk)  # per shard
        n_val = math.ceil(train.eval_batches * train.batch_size / source.rows_per_chunk)
        cap = store_cfg["cache_max_gb"]
        cap = int(float(cap) * 2**30) if cap else None
        for split, n in (("train", n_train), ("val", n_val)):
            cache_activations(source, store_cfg["cache"], n, split=split, dtype=store_cfg["cache_dtype"], max_bytes=cap,
                              progress=progress)
        source = val_source = CachedActivations(store_cfg["cache"], seed=train.seed)
    return source, val_source


def _spliced_summary(model: Transformer, result, groups: dict[str, list[int]], toks) -> dict[str, Any]:
    """The training summary with each dictionary spliced into the model on toks [batch, pos] (and each per-layer
    set replacing every MLP at once), printed line by line as it goes."""
    from circuitlab.dictionaries.clt import CrossLayerTranscoder
    from circuitlab.dictionaries.metrics import spliced_loss

    summary = result.to_dict()
    for entry, sae, folder in zip(summary["dictionaries"], result.dictionaries, result.folders):
        s = spliced_loss(model, sae, toks)
        entry["metrics"]["spliced"] = s.to_dict()
        m = entry["metrics"]
        per_layer = " per layer" if isinstance(sae, CrossLayerTranscoder) else ""
        print(f"{folder}: L0 {m['l0']:.1f}{per_layer}, explained variance {m['explained_variance']:.3f}, dead {m['dead_frac']:.1%}, "
              f"CE recovered {s.ce_recovered:.3f}{s.recovered_note()} (CE {s.ce_clean:.3f} -> {s.ce_spliced:.3f}; "
              f"zero-ablated {s.ce_zero:.3f})")
    summary["replacements"] = []
    for name, members in groups.items():  # a transcoder per layer, every MLP replaced at once, beside the CLTs
        s = spliced_loss(model, [result.dictionaries[i] for i in members], toks)
        ms = [summary["dictionaries"][i]["metrics"] for i in members]
        fvu = sum(m["fvu"] for m in ms) / len(ms)
        summary["replacements"].append({"name": name, "dictionaries": [summary["dictionaries"][i]["name"] for i in members],
                                        "mean_layer_explained_variance": 1 - fvu,
                                        "mean_l0": sum(m["l0"] for m in ms) / len(ms), "spliced": s.to_dict()})
        print(f"{name} ({len(members)} per-layer transcoders, every MLP replaced at once): mean explained variance "
              f"{1 - fvu:.3f}, CE recovered {s.ce_recovered:.3f}{s.recovered_note()} (CE {s.ce_clean:.3f} -> "
              f"{s.ce_spliced:.3f}), KL {s.kl:.4f}")
    return summary
