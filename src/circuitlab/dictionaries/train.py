"""Train one or more dictionaries on one activation store (one forward pass feeds them all).

    trainer = DictionaryTrainer([cfg_a, cfg_b], DictTrainConfig(steps=2000), store, val_store)
    result = trainer.fit("runs/sae")          # resumes from runs/sae/checkpoint when it exists
    result.dictionaries[0].encode(x)          # saved under runs/sae/dictionaries/<name>/

As the field does it: decoder rows start as unit random directions and the encoder as their
transpose; b_dec starts at the data mean; inputs are scaled to E‖x‖ = √d_in during training and
that scale is folded into the weights at save; the L1 / L0 coefficient warms up linearly; the
learning rate warms up, then decays linearly to 0 over the last lr_decay_frac of the steps;
TopK-family and JumpReLU decoders keep unit-norm rows; dead latents get AuxK (TopK family and
JumpReLU) and, every resample_every steps until the learning rate decays (for "split", until half
way through the decay), resampling (any architecture) on the current batch and the next
resample_batches - 1. A latent is dead when it has not fired for dead_after steps or, with
dead_density > 0, when it fires on fewer than that fraction of rows (running average over
~dead_after steps): such rarely-firing latents otherwise sit on a mixture of features, silent at
inference. resample_method "inputs" points a dead latent at the
worst-reconstructed rows (Anthropic, 2023); "split" makes it split a live latent that serves two
features (k-means' cluster splitting, see resample.split_targets): the usual reason a threshold
dictionary (BatchTopK, JumpReLU) leaves a latent dead is two features merged into another one, and a
latent sent to a worst-reconstructed row lands on a mixture that never beats the threshold.
"inputs" resampling stops once the learning rate decays, so that no latent is counted alive only
because it was just placed somewhere; a split child starts on a direction the data has, and splitting
goes on through the first half of the decay (a latent split just before the decay can lose its
feature back to its parent as the rate falls). With target_l0 (ReLU, JumpReLU) the sparsity
coefficient is steered to that L0 (per layer for a CLT) to the end, its gain following the learning
rate, so that it settles as the rate decays (target_l0.L0Controller).
Resuming continues exactly as if never stopped.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from circuitlab.atomic import atomic_write_text, json_text
import circuitlab.dictionaries.clt_train as clt_train
from circuitlab.dictionaries.clt import CLTConfig, CrossLayerTranscoder
from circuitlab.dictionaries.config import DictionaryConfig
from circuitlab.dictionaries.metrics import DictionaryMetrics, evaluate
from circuitlab.dictionaries.objectives import Coefficients, training_step
from circuitlab.dictionaries.parallel import DataParallel
from circuitlab.dictionaries.parallel import make as make_parallel
from circuitlab.dictionaries.resample import resample_dead
from circuitlab.dictionaries.sae import SparseDictionary
from circuitlab.dictionaries.store import ActivationStore, _seed
from circuitlab.dictionaries.target_l0 import ROWS_FOR_CUT, L0Controller, cut_for_l0
from circuitlab.dictionaries.train_config import (  # noqa: F401 - their public home was this module: re-exported
    NOT_RESULT, PER_DICTIONARY, RESAMPLE_METHODS, TRAIN_RULES, DictTrainConfig, check_fits, dictionary_names,
    dictionary_step_estimate, per_layer_targets, rows_budget, steered_names, steers_l0, target_l0s,
)
from circuitlab.dictionaries.train_state import CHECKPOINT, STATE, TrainerState, refuse_changed_settings  # noqa: F401
from circuitlab.errors import CircuitlabError, ConfigError
from circuitlab.perf import threads_for_work
from circuitlab.training.distributed import barrier
from circuitlab.training.interrupts import stop_after_step_on_ctrl_c
from circuitlab.training.run_log import MetricsLog

THRESHOLD_LR_SCALE = 10.0  # a JumpReLU SAE's thresholds and decoder under target_l0 learn this much faster (see _param_groups)


@dataclass
class DictionaryTrainResult:
    dictionaries: list[SparseDictionary]     # folded: they take raw activations
    metrics: list[DictionaryMetrics]         # held-out, at the end
    folders: list[Path]
    steps: int

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "dictionaries": [
            {"name": f.name if f else None, "config": d.cfg.to_dict(), "metrics": m.to_dict()}
            for d, m, f in zip(self.dictionaries, self.metrics, self._folders())]}

    def _folders(self) -> list[Path | None]:
        return list(self.folders) if self.folders else [None] * len(self.metrics)

    def _repr_html_(self) -> str:
        return "".join(f"<h4>{d.cfg.hook_name} ({d.cfg.architecture})</h4>{m._repr_html_()}"
                       for d, m in zip(self.dictionaries, self.metrics))


class DictionaryTrainer(TrainerState):
    def __init__(self, configs: list[DictionaryConfig | CLTConfig], train: DictTrainConfig, store: ActivationStore,
                 val_store: ActivationStore | None = None, overrides: list[dict[str, Any]] | None = None,
                 device: str | torch.device = "cpu", parallel: str | None = None) -> None:
        if not configs:
            raise CircuitlabError("nothing to train: give at least one dictionary config")
        for cfg in configs:
            check_fits(cfg, store.widths)
        self.train, self.store, self.val_store, self.device = train, store, val_store, torch.device(device)
        # Under torchrun: data parallel replicas (default) or one rank per dictionary ("modules"); see parallel.py.
        self.parallel = make_parallel(parallel, configs)
        self.parallel.device = self.device
        if getattr(store, "world", 1) != self.parallel.world:
            raise CircuitlabError(f"the activation store was made for {getattr(store, 'world', 1)} rank(s) but "
                                  f"{self.parallel.world} are training: make it after the process group starts")
        overrides = overrides or [{}] * len(configs)
        for o in overrides:
            bad = sorted(set(o) - set(PER_DICTIONARY))
            if bad:
                raise ConfigError(f"a dictionary's own train settings may only be {', '.join(PER_DICTIONARY)}; got {bad}")
        self.hyper = [dataclasses.replace(train, **o) for o in overrides]
        for cfg, h in zip(configs, self.hyper):
            if h.resample_method == "split" and cfg.is_transcoder:
                raise ConfigError(f"resample_method 'split' needs an SAE (it splits decoder directions in the input's "
                                  f"space); the transcoder for {cfg.hook_name} can use 'inputs'")
        for cfg, o in zip(configs, overrides):
            if o.get("target_l0") and not cfg.arch.steers_l0:
                raise ConfigError(f"target_l0 steers a sparsity coefficient ({steered_names()}); the "
                                  f"{cfg.architecture} dictionary for {cfg.hook_name} sets its L0 with k")
        # Target-L0 mode: the coefficient is steered to the end, the set point gliding to the target over
        # the first half of the full-rate phase. A CLT gets one target (and coefficient) per layer.
        self.controllers = [L0Controller(targets, self._base_coeff(c, h), round(train.steps * (1 - train.lr_decay_frac) / 2))
                            if (targets := target_l0s(c, h.target_l0)) else None for c, h in zip(configs, self.hyper)]
        per_row = sum(4 * c.n_latents + 4 * (c.n_layers * 2 * c.d_model if isinstance(c, CLTConfig) else c.d_in + (c.d_out or c.d_in))
                      for c in configs)  # pre-acts, acts, grads
        budget = rows_budget()
        if train.batch_size * per_row > budget:
            raise ConfigError(f"train.batch_size {train.batch_size} needs {train.batch_size * per_row * 4 / 2**30:.1f} GiB "
                              f"of activations per step for these dictionaries (limit {budget * 4 / 2**30:.1f} GiB, a quarter "
                              "of the memory budget; --memory sets it); "
                              f"give at most {max(1, budget // per_row)}")
        self.saes = [(CrossLayerTranscoder(c, seed=_seed(train.seed, j) % 2**31) if isinstance(c, CLTConfig)
                      else SparseDictionary(c, seed=_seed(train.seed, j) % 2**31)).to(self.device)
                     for j, c in enumerate(configs)]
        fused = self.device.type in ("cpu", "cuda")  # one kernel per step, ~5x faster than the foreach Adam on the CPU
        self.opts = [torch.optim.Adam(self._param_groups(s, ctl), lr=h.lr, betas=(train.beta1, train.beta2), fused=fused)
                     for s, h, ctl in zip(self.saes, self.hyper, self.controllers)]
        self.last_fired = [torch.zeros(c.n_latents, dtype=torch.long, device=self.device) for c in configs]
        self.fire_rate = [torch.zeros(c.n_latents, dtype=torch.float64, device=self.device) for c in configs]  # running density
        # (input, output) scale of each dictionary: two floats, or two per-layer lists for a CLT
        self.scales: list[tuple[Any, Any]] = [(1.0, 1.0)] * len(configs)
        self.step = 0
        self.run_settings: dict[str, Any] = {}  # the caller's result-changing settings (see settings())

    # ------------------------------------------------------------------ the pieces
    @staticmethod
    def _base_coeff(cfg: DictionaryConfig | CLTConfig, h: DictTrainConfig) -> float:
        return getattr(h, cfg.arch.coefficient)

    @staticmethod
    def _param_groups(sae: SparseDictionary | CrossLayerTranscoder, ctl: L0Controller | None) -> list[dict[str, Any]]:
        """Adam's parameter groups. A JumpReLU's thresholds steered to a target L0 learn THRESHOLD_LR_SCALE times
        faster: the coefficient moves the L0 only through them, and at the dictionary's rate they lag the
        controller by hundreds of steps, so it overshoots (measured: L0 3.1 for a target of 4, 4.0 at 10x).
        A JumpReLU SAE's decoder learns at their rate too: it is what lags behind them (planted features,
        192 in 48 dims at L0 6: mean max cosine 0.815 with the decoder at 1x, 0.911 at 10x; the encoder
        at 10x 0.882 with 59% of latents dead, the encoder bias at 10x 0.809): Adam moves each entry of a
        unit-norm decoder row by at most about lr per step. Not a CLT's (its penalty differs; untested)."""
        trained = [(n, p) for n, p in sae.named_parameters() if p.requires_grad]
        names = ("threshold",) if isinstance(sae, CrossLayerTranscoder) else ("threshold", "W_dec")
        fast = [p for n, p in trained if ctl is not None and sae.cfg.arch.learns_threshold and n.split(".")[0] in names]
        groups = [{"params": [p for n, p in trained if not any(p is q for q in fast)], "lr_scale": 1.0}]
        return groups + ([{"params": fast, "lr_scale": THRESHOLD_LR_SCALE}] if fast else [])

    def sparsity_coeff(self, j: int, step: int) -> float | list[float]:
        """Dictionary j's sparsity coefficient at a step: warmed up linearly, or steered to its target L0
        (a CLT's: one per layer)."""
        ctl = self.controllers[j]
        if ctl is not None:
            coeff = ctl.coefficient().tolist()
            return coeff if isinstance(self.saes[j], CrossLayerTranscoder) else coeff[0]
        h = self.hyper[j]
        return self._base_coeff(self.saes[j].cfg, h) * min(1.0, (step + 1) / max(h.sparsity_warmup_steps, 1))

    @torch.no_grad()
    def init_from_data(self) -> None:
        """Input/output scales and b_dec (the data mean) from the store's first chunk."""
        sample = self.store.source.chunk(0, self.store.split)
        for j, (sae, h) in enumerate(zip(self.saes, self.hyper)):
            cfg = sae.cfg
            ctl = self.controllers[j]
            if isinstance(sae, CrossLayerTranscoder):
                scales = clt_train.init_from_data(sae, sample, h.normalise, h.jumprelu_init_threshold)
                self.scales[j] = scales
                if ctl is not None:
                    clt_train.start_at_l0(sae, sample, scales[0], ctl.target.tolist())
                continue
            x = sample[cfg.hook_name].to(self.device)
            y = sample[cfg.out_hook_name].to(self.device) if cfg.is_transcoder else x
            s_in = math.sqrt(cfg.d_in) / float(x.norm(dim=-1).mean()) if h.normalise else 1.0
            s_out = (math.sqrt(cfg.d_out) / float(y.norm(dim=-1).mean()) if cfg.is_transcoder else s_in) if h.normalise else 1.0
            self.scales[j] = (s_in, s_out)
            sae.b_dec.copy_((y * s_out).mean(0))
            if cfg.arch.learns_threshold:
                sae.threshold.fill_(h.jumprelu_init_threshold)
            if ctl is not None:  # start at the target L0 (target_l0.cut_for_l0)
                sae.b_enc.sub_(cut_for_l0(sae.pre_acts(x[:ROWS_FOR_CUT] * s_in), float(ctl.target[0])))

    def _inputs(self, j: int, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, (s_in, s_out) = self.saes[j].cfg, self.scales[j]
        if isinstance(self.saes[j], CrossLayerTranscoder):
            return clt_train.scaled_inputs(self.saes[j], batch, self.scales[j])
        x = batch[cfg.hook_name].to(self.device) * s_in
        y = batch[cfg.out_hook_name].to(self.device) * s_out if cfg.is_transcoder else x
        return x, y

    LOG_FIELDS = ("loss", "mse", "mse_normalised", "sparsity", "aux", "l0", "dead", "resampled", "coeff")

    def train_step(self, batch: dict[str, torch.Tensor]) -> list[dict[str, float]]:
        """One optimizer step of every dictionary on the same batch (this rank's rows {hook: [rows, width]});
        returns each one's losses (over the global batch, every dictionary's, on every rank)."""
        P = self.parallel
        rows_batch = P.rows(batch)  # module parallel: the global rows of this rank's dictionaries' hooks
        logs: dict[int, list[float]] = {}
        for j in P.owned:
            sae, opt, h = self.saes[j], self.opts[j], self.hyper[j]
            x, y = self._inputs(j, rows_batch)
            dead = self.dead(j, self.step)
            coeff = self.sparsity_coeff(j, self.step)
            layers = tuple(coeff) if isinstance(coeff, list) else None  # a steered CLT: one per layer
            coef = Coefficients(sparsity=sum(layers) / len(layers) if layers else cast(float, coeff), aux=h.aux_coeff,
                                bandwidth=h.bandwidth, threshold_decay=0.0 if self.step == 0 else 0.99)
            for group in opt.param_groups:
                group["lr"] = self.train.lr_at(self.step, h.lr) * group.get("lr_scale", 1.0)
            is_clt = isinstance(sae, CrossLayerTranscoder)
            if isinstance(sae, CrossLayerTranscoder):  # (is_clt) the same coefficient scales its tanh penalty
                clt_coef = clt_train.CLTCoefficients(**vars(coef), tanh_scale=h.clt_tanh_scale,  # (l0_coeff; l1_coeff
                                                     preact=h.clt_preact_coeff, layers=layers)   # for a ReLU CLT)
                out = clt_train.clt_training_step(sae, x, y, clt_coef, dead, replicas=P.replicas)
            else:
                out = training_step(sae, x, y, coef, dead, replicas=P.replicas)
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            P.average_gradients([p for p in sae.parameters() if p.requires_grad])  # data parallel: the global mean's
            opt.step()
            with torch.no_grad():
                if is_clt:
                    clt_train.after_step(sae)
                elif sae.cfg.arch.unit_decoder(clt=False):  # unit-norm rows (a norm-weighted L1 handles relu's)
                    sae.W_dec.div_(sae.W_dec.norm(dim=-1, keepdim=True).clamp(min=1e-8))
                if sae.cfg.arch.learns_threshold and not is_clt:
                    sae.threshold.clamp_(min=1e-4)
            fires, rows = P.total(out.fires), len(x) * P.row_factor  # over the global batch
            l0 = float(fires.sum()) / rows / (sae.cfg.n_layers if is_clt else 1)
            self.last_fired[j][fires > 0] = self.step + 1
            ctl = self.controllers[j]
            if ctl is not None:  # the global batch's L0, per layer for a CLT (its fires are layer-major)
                ctl.update(self.step, fires.view(len(ctl.target), -1).sum(-1).double() / rows,
                           gain=self.train.lr_at(self.step, 1.0))  # the weights move with the lr: so does it
            decay = 1 - 1 / h.dead_after
            self.fire_rate[j].mul_(decay).add_(fires.double() / rows, alpha=1 - decay)
            # "mse" on sae eval's scale (the model's units: squared error summed over the output dims, mean over
            # rows); the objective sees inputs scaled to E|x| = sqrt(d_in): its MSE is "mse_normalised".
            s_out = self.scales[j][1]
            s_out2 = sum(v * v for v in s_out) / len(s_out) if is_clt else s_out ** 2  # a CLT: its layers' mean
            logs[j] = [float(out.loss.detach()), float(out.mse) / s_out2, float(out.mse), float(out.sparsity),
                       float(out.aux), l0, float(dead.float().mean()), 0.0, coef.sparsity]
        self._resample(batch, rows_batch, logs)
        self.step += 1
        every = P.logs(logs, len(self.LOG_FIELDS))  # data parallel: means over ranks; modules: from each owner
        return [{**dict(zip(self.LOG_FIELDS, every[j])), "resampled": int(every[j][7])} for j in range(len(self.saes))]

    def _resamples(self, j: int) -> bool:
        """Whether dictionary j resamples after this step. No resampling once the learning rate decays: a latent
        pointed at badly reconstructed rows needs steps at the full rate to find a feature, or it ends silent or
        firing on junk. A split child starts on a direction the data has, so splitting goes on through the
        first half of the decay."""
        h = self.hyper[j]
        until = self.train.steps * (1 - self.train.lr_decay_frac * (0.5 if h.resample_method == "split" else 1))
        return bool(h.resample_every) and (self.step + 1) % h.resample_every == 0 and self.step + 1 <= until

    def _resample(self, batch: dict[str, torch.Tensor], rows_batch: dict[str, torch.Tensor],
                  logs: dict[int, list[float]]) -> None:
        """Resample the dead latents of the dictionaries at a resample step, on this step's rows and, when one
        has dead latents, the next resample_batches - 1 batches (drawn once, by every rank)."""
        P = self.parallel
        due = [j for j in range(len(self.saes)) if self._resamples(j)]  # the same on every rank
        if not due:
            return
        dead = {j: self.dead(j, self.step + 1) for j in due if j in P.owned}
        for j, dead_j in dead.items():
            logs[j][6] = float(dead_j.float().mean())
        if not P.any(any(bool(d.any()) for d in dead.values())):
            return
        # One batch is too few rows to see a rare latent's two groups (a latent firing on 3% of
        # rows fires ~15 times in 512); Anthropic's resampling looked at ~800k inputs.
        extra = [self.store.next_batch() for _ in range(self.train.resample_batches - 1)]
        pieces = [P.resample_rows(batch, rows_batch)] + [P.resample_rows(b) for b in extra]  # global rows
        for j, dead_j in dead.items():
            sae, opt, h = self.saes[j], self.opts[j], self.hyper[j]
            xs, ys = zip(*(self._inputs(j, b) for b in pieces))
            x, y = torch.cat(xs), torch.cat(ys)
            gen = torch.Generator().manual_seed(_seed(self.train.seed, "resample", j, self.step))
            logs[j][7] = resample_dead(sae, opt, dead_j, x, y, gen, threshold=h.jumprelu_init_threshold,
                                       method=h.resample_method)
            self.last_fired[j][dead_j] = self.step + 1

    def dead(self, j: int, step: int) -> torch.Tensor:
        """[d_sae] bool: dictionary j's latents silent for dead_after steps, or (dead_density > 0, after
        dead_after steps) firing on fewer than dead_density of the rows (bias-corrected running average)."""
        h = self.hyper[j]
        dead = (step - self.last_fired[j]) >= h.dead_after
        if h.dead_density > 0 and step >= h.dead_after:
            seen = 1 - (1 - 1 / h.dead_after) ** step
            dead |= (self.fire_rate[j] / seen) < h.dead_density
        return dead

    def dictionaries(self) -> list[SparseDictionary]:
        """The dictionaries as saved: normalisation folded (raw activations in and out), BatchTopK as JumpReLU."""
        out = []
        for sae, (s_in, s_out), h, ctl in zip(self.saes, self.scales, self.hyper, self.controllers):
            method = "expected_norm" if h.normalise else "none"
            meta = {**sae.cfg.metadata, "trained_steps": self.step, "batch_size": self.train.batch_size}
            if ctl is not None:  # the coefficient it settled on (set it as l1_coeff / l0_coeff to train without a target)
                held, target = ctl.coefficient().tolist(), ctl.target.tolist()   # per layer
                is_clt = isinstance(sae, CrossLayerTranscoder)
                meta.update(target_l0=target if is_clt else target[0], sparsity_coeff=held if is_clt else held[0])
            trained = sae._copy_with(sae.cfg.replace(normalisation={"method": method}, metadata=meta))
            out.append(trained.folded(s_in, s_out).for_inference())
        return out

    def evaluate(self) -> list[DictionaryMetrics]:
        if self.val_store is None:
            return []
        self.val_store.load_state_dict({"chunk": 0, "offset": 0})
        batches = [self.val_store.next_batch() for _ in range(self.train.eval_batches)]
        return [clt_train.evaluate_clt(sae, batches) if isinstance(sae, CrossLayerTranscoder) else evaluate(sae, batches)
                for sae in self.dictionaries()]

    # ------------------------------------------------------------------ the loop
    def fit(self, out: str | Path | None = None, progress: bool = True,
            stop_at: int | None = None) -> DictionaryTrainResult:
        """Train to train.steps (or stop_at), resuming from out/checkpoint when it exists; save the
        dictionaries under out/dictionaries/<name>/ with out/results.json and out/metrics.jsonl.
        CPU threads by the step's size ($CIRCUITLAB_THREADS overrides; circuitlab.perf.threads_for).

        Under torchrun every rank calls it; rank 0 alone shows progress, writes the log, checkpoints and the
        dictionaries, and evaluates (its result holds the metrics; the other ranks' hold none)."""
        with threads_for_work(self.step_flops()):
            return self._fit(out, progress, stop_at)

    def step_flops(self) -> float:
        """About the flops of one training step: 6 per weight per row (2 forward, 4 backward), all dictionaries."""
        return 6.0 * self.train.batch_size * sum(p.numel() for s in self.saes for p in s.parameters() if p.dim() >= 2)

    def _fit(self, out: str | Path | None, progress: bool, stop_at: int | None) -> DictionaryTrainResult:
        from tqdm.auto import tqdm

        P = self.parallel
        lead = P.rank == 0
        out = Path(out) if out is not None else None
        ckpt = out / CHECKPOINT if out is not None else None
        if out is not None and lead:
            out.mkdir(parents=True, exist_ok=True)
        if ckpt is not None and (ckpt / STATE).is_file():
            self.load_checkpoint(ckpt)
        elif self.step == 0:
            self.init_from_data()
        if isinstance(P, DataParallel):  # the replicas start as rank 0's (they are seeded alike; this makes sure)
            P.broadcast([t for sae in self.saes for t in sae.state_dict().values()])
        barrier("starting to train dictionaries")  # every rank has read the checkpoint before any writes one
        end = min(stop_at or self.train.steps, self.train.steps)
        # metrics.jsonl line by line, flushed: a kill keeps every completed line; records after the checkpoint
        # this run starts from are dropped first, so each step is there once after a resume.
        log = MetricsLog(out, resume_step=self.step) if out is not None and lead else None
        bar = tqdm(total=end, initial=self.step, desc="training dictionaries", disable=not progress or not lead, unit="step")
        try:
            with stop_after_step_on_ctrl_c() as stop:
                while self.step < end:
                    logs = self.train_step(self.store.next_batch())
                    bar.update(1)
                    if self.step % self.train.log_every == 0 or self.step == end:
                        bar.set_postfix(mse=f"{logs[0]['mse']:.3g}", l0=f"{logs[0]['l0']:.1f}")
                        if log:
                            log.write({"step": self.step, "dictionaries": logs})
                    if self.train.eval_every and self.step % self.train.eval_every == 0 and out is not None and self.val_store:
                        P.gather_state(self)
                        if log:
                            log.write({"step": self.step, "eval": [m.to_dict() for m in self.evaluate()]})
                    if ckpt is not None and self.train.ckpt_every and self.step % self.train.ckpt_every == 0:
                        self.save_checkpoint(ckpt)
                    # across ranks a Ctrl-C reaches them at different steps: they stop at the same one
                    if (P.any(stop.is_set()) if P.world > 1 else stop.is_set()) and self.step < end:
                        if ckpt is not None:
                            self.save_checkpoint(ckpt)
                        raise KeyboardInterrupt(self._interrupted(ckpt, saved=ckpt is not None))
        except KeyboardInterrupt as e:
            if str(e):
                raise
            raise KeyboardInterrupt(self._interrupted(ckpt, saved=False)) from None
        finally:
            bar.close()
            if log:
                log.close()
        if ckpt is not None:
            self.save_checkpoint(ckpt)
        else:
            P.gather_state(self)
        if not lead:  # the replicas (data parallel) are rank 0's; module parallel: rank 0 gathered them
            return DictionaryTrainResult(self.dictionaries() if isinstance(P, DataParallel) else [], [], [], self.step)
        dictionaries, metrics = self.dictionaries(), self.evaluate()
        folders: list[Path] = []
        if out is not None:
            for name, sae in zip(dictionary_names([s.cfg for s in self.saes]), dictionaries):
                folders.append(sae.save(out / "dictionaries" / name))
            result = DictionaryTrainResult(dictionaries, metrics, folders, self.step)
            if metrics:
                atomic_write_text(out / "results.json", json_text(result.to_dict(), indent=2))
            return result
        return DictionaryTrainResult(dictionaries, metrics, folders, self.step)
