"""What a dictionary training run is set up with: DictTrainConfig (the settings and their number rules), which
dictionaries fit a store (check_fits), what a step will hold (dictionary_step_estimate), target-L0 lists, and
the folder names of the trained dictionaries. DictionaryTrainer (train.py) reads them."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from circuitlab.checks import COUNT, FRACTION, INT, NONNEG, NONNEG_INT, POSITIVE, Number, PerItem, check_fields, DEFAULT_SEED
from circuitlab.dictionaries.arch import architecture_names, find_architecture
from circuitlab.dictionaries.clt_config import CLTConfig
from circuitlab.dictionaries.config import DictionaryConfig
from circuitlab.errors import CircuitlabError, ConfigError, did_you_mean, refuse_unknown

# Fields a dictionary may override for itself (`train:` under it in a YAML config).
PER_DICTIONARY = ("lr", "l1_coeff", "l0_coeff", "sparsity_warmup_steps", "bandwidth", "jumprelu_init_threshold",
                  "aux_coeff", "dead_after", "dead_density", "resample_every", "resample_method", "target_l0",
                  "clt_tanh_scale", "clt_preact_coeff")
RESAMPLE_METHODS = ("inputs", "split")


# Train settings that do not change the trained dictionaries (a resume may change them).
NOT_RESULT = ("eval_every", "eval_batches", "ckpt_every", "log_every")
_BETA = Number(float, low=0.0, high=1.0, high_open=True)
DICT_STEPS = 2000   # dictionary training steps unless a config says otherwise


# floats one step's rows may need across a dictionary's widths: a share of the memory budget (circuitlab.memory)
# that bounds train.batch_size


def rows_budget() -> int:
    import circuitlab.memory as memory

    return memory.floats(memory.STEP_SHARE)


def dictionary_step_estimate(configs: list, batch_size: int, dtype: torch.dtype = torch.float32) -> Any:
    """What one training step of these dictionaries holds beyond their weights (circuitlab.memory.Estimate): the
    gradients and Adam's two moments (3 copies of the weights) and batch_size rows of pre-activations,
    activations and their gradients (dense for ReLU and JumpReLU, as rows_budget() bounds them; the pre-activations
    for the TopK family); its flops (encoder and decoder,
    forward and backward: 6 per weight per row)."""
    import circuitlab.memory as memory

    size = torch.empty(0, dtype=dtype).element_size()
    weights = sum(c.n_latents * (2 * c.n_layers * c.d_model if isinstance(c, CLTConfig) else c.d_in + (c.d_out or c.d_in))
                  for c in configs)
    # a TopK-family step holds one [rows, latents] of pre-activations and works on the k that fire (measured: ~1
    # float per latent a row at GPT-2 small's width); ReLU and JumpReLU keep pre-activations, activations and
    # their gradients dense (4, the bound the batch size is refused by)
    per_row = sum((1 if c.arch.uses_k else 4) * c.n_latents
                  + 4 * (c.n_layers * 2 * c.d_model if isinstance(c, CLTConfig) else c.d_in + (c.d_out or c.d_in))
                  for c in configs)
    return memory.Estimate(f"a training step of {len(configs)} dictionar{'y' if len(configs) == 1 else 'ies'} on "
                           f"{batch_size:,} rows", {"gradients and Adam's moments": 3 * weights * size,
                                                    "activations": batch_size * per_row * 4},
                           held=weights * size, flops=6.0 * weights * batch_size, efficiency=0.5)


# One rule per number field of DictTrainConfig (circuitlab.checks): finite, in range, whole where counted.
TRAIN_RULES: dict[str, Number | PerItem] = {"steps": COUNT, "batch_size": COUNT, "lr": POSITIVE, "lr_warmup_steps": NONNEG_INT,
               "lr_decay_frac": FRACTION, "beta1": _BETA, "beta2": _BETA, "l1_coeff": NONNEG, "l0_coeff": NONNEG,
               "sparsity_warmup_steps": NONNEG_INT, "bandwidth": POSITIVE, "jumprelu_init_threshold": NONNEG,
               "aux_coeff": NONNEG, "dead_after": COUNT, "dead_density": FRACTION, "resample_every": NONNEG_INT,
               "resample_batches": COUNT, "eval_every": NONNEG_INT, "eval_batches": COUNT, "ckpt_every": NONNEG_INT,
               "log_every": COUNT, "seed": INT, "target_l0": PerItem(NONNEG, POSITIVE)}


@dataclass
class DictTrainConfig:
    steps: int = DICT_STEPS
    batch_size: int = 1024           # activation rows per step
    lr: float = 1e-3
    lr_warmup_steps: int = 50
    lr_decay_frac: float = 0.2       # linear decay to 0 over this last fraction of the steps
    beta1: float = 0.9
    beta2: float = 0.999
    l1_coeff: float = 1.0            # relu: coefficient of the decoder-norm-weighted L1
    l0_coeff: float = 0.1            # jumprelu: coefficient of the L0 (straight-through)
    sparsity_warmup_steps: int = 200
    target_l0: float | list[float] = 0.0  # relu / jumprelu: steer the coefficient to this L0 (0: off); a CLT
                                          # may take one per layer: [8, 8, 4]
    bandwidth: float = 0.05          # jumprelu: straight-through kernel width (normalised units)
    jumprelu_init_threshold: float = 0.1
    aux_coeff: float = 1 / 32        # TopK family: AuxK
    dead_after: int = 200            # steps without firing before a latent counts as dead
    dead_density: float = 0.0        # also dead: firing on fewer than this fraction of rows (0: off)
    resample_every: int = 0          # resample dead latents every N steps (0: never)
    resample_method: str = "inputs"  # "inputs": toward the worst-reconstructed rows; "split": split merged latents
    resample_batches: int = 4        # batches of rows a resampling looks at (the current one and the next ones)
    clt_tanh_scale: float = 4.0      # CLT (jumprelu, relu): c in its penalty l0_coeff · tanh(c · a · ‖W_dec‖)
    clt_preact_coeff: float = 0.003  # CLT (jumprelu): the pre-activation penalty on latents below threshold
    normalise: bool = True           # scale inputs to E‖x‖ = √d_in in training (folded at save)
    eval_every: int = 0              # held-out evaluation every N steps (0: only at the end)
    eval_batches: int = 4
    ckpt_every: int = 0              # resumable checkpoint every N steps (0: only at the end)
    log_every: int = 50
    seed: int = DEFAULT_SEED

    def __post_init__(self) -> None:
        check_fields(self, TRAIN_RULES, "train")  # the rules the CLI's --set, the YAML and Python share
        for f in dataclasses.fields(self):
            value, want = getattr(self, f.name), type(f.default)
            if isinstance(TRAIN_RULES.get(f.name), PerItem) and isinstance(value, list):  # checked above
                continue
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise ConfigError(f"train.{f.name} must be {want.__name__}, got {value!r}")
        if self.resample_method not in RESAMPLE_METHODS:
            raise ConfigError(f"train.resample_method must be one of {', '.join(RESAMPLE_METHODS)}, got {self.resample_method!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DictTrainConfig":
        refuse_unknown(data, [f.name for f in dataclasses.fields(cls)], "train field(s)")
        return cls(**data)

    def lr_at(self, step: int, lr: float) -> float:
        warm = min(1.0, (step + 1) / max(self.lr_warmup_steps, 1))
        decay_steps = self.lr_decay_frac * self.steps
        left = self.steps - step
        return lr * warm * (min(1.0, left / decay_steps) if decay_steps > 0 else 1.0)


def check_fits(cfg: DictionaryConfig | CLTConfig, widths: dict[str, int]) -> None:
    """The hooks a dictionary (SAE, transcoder or CLT) reads and writes are in the store {hook: width}, with its
    widths; else one CircuitlabError naming the hook."""
    wanted: list[tuple[str | None, int | None, str]]
    is_clt = isinstance(cfg, CLTConfig)
    if isinstance(cfg, CLTConfig):
        wanted = [(name, cfg.d_model, "d_model") for name in cfg.hooks()]
        why = f" (a CLT of {cfg.n_layers} layers reads and writes every layer)"
    else:
        wanted, why = [(cfg.hook_name, cfg.d_in, "d_in"), (cfg.out_hook_name, cfg.d_out, "d_out")], ""
    for name, width, what in wanted:
        if name is None:
            continue
        if name not in widths:
            raise CircuitlabError(f"the activation store has no hook {name!r}{did_you_mean(name, widths, n=3, cutoff=0.3)}"
                                  f"{why}")
        if widths[name] != width:
            whose = (f"the CLT has d_model={width} but {name} has width {widths[name]}" if is_clt else
                     f"the dictionary for {name} has {what}={width} but the hook's activations have width {widths[name]}")
            raise CircuitlabError(f"{what} mismatch: {whose}")


def steers_l0(architecture: str) -> bool:
    """Whether target_l0 can steer an architecture's L0 (its penalty's coefficient sets it; the TopK family's k
    does instead). An unknown name: False (its config refuses it)."""
    arch = find_architecture(architecture)
    return arch is not None and arch.steers_l0


def steered_names() -> str:
    """The architectures target_l0 steers, for messages: "relu, jumprelu"."""
    return ", ".join(n for n in architecture_names() if steers_l0(n))


def target_l0s(cfg: DictionaryConfig | CLTConfig, target: float | list[float]) -> list[float] | None:
    """The L0 each layer of a dictionary is steered to (one for an SAE or transcoder, n_layers for a CLT), or
    None when it is not steered (target 0, or a TopK-family dictionary, which sets its L0 with k). One number
    applies to every layer; a list must name one per layer (only a CLT has several)."""
    if not cfg.arch.steers_l0 or target == 0:
        return None
    layers = cfg.n_layers if isinstance(cfg, CLTConfig) else 1
    return per_layer_targets(target, layers, f"the CLT has {layers} layers" if isinstance(cfg, CLTConfig) else
                             f"the {cfg.architecture} dictionary for {cfg.hook_name} has one layer")


def per_layer_targets(target: float | list[float], layers: int, what: str) -> list[float]:
    """target_l0 as one L0 per layer: one number applies to every layer, a list must name exactly one per layer
    (else a one-line ConfigError saying `what` has)."""
    if not isinstance(target, list):
        return [float(target)] * layers
    if len(target) != layers:
        raise ConfigError(f"train.target_l0 names {len(target)} L0s but {what}: give one number, or one per layer")
    return [float(t) for t in target]


def dictionary_names(configs: list[DictionaryConfig]) -> list[str]:
    """Folder names: metadata.name, else <hook>-<architecture>[-<d_sae>], made unique."""
    names: list[str] = []
    for c in configs:
        base = c.metadata.get("name") or (f"clt-{c.architecture}" if isinstance(c, CLTConfig) else f"{c.hook_name}-{c.architecture}")
        name, i = base, 2
        while name in names:
            name, i = f"{base}-{i}", i + 1
        names.append(name)
    return names
