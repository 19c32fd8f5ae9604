"""A DictionaryTrainer's resumable state: its checkpoint (weights, Adam moments, firing history, target-L0
state and the store's position in one safetensors file, state.json beside it), the settings a resume must
share, and what an interrupt leaves. DictionaryTrainer (train.py) inherits TrainerState."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from circuitlab.atomic import atomic_write_file, atomic_write_text, json_text
from circuitlab.dictionaries.train_config import NOT_RESULT
from circuitlab.errors import CircuitlabError
from circuitlab.training.interrupts import interrupted_message

CHECKPOINT, STATE = "checkpoint", "state.json"


class TrainerState:
    """The checkpoint half of DictionaryTrainer: reads and writes its saes, opts, last_fired, fire_rate,
    controllers, scales, step, store, parallel, hyper and run_settings."""

    saes: list
    opts: list
    last_fired: list[torch.Tensor]
    fire_rate: list[torch.Tensor]
    controllers: list
    scales: list[tuple[Any, Any]]
    step: int
    store: Any
    parallel: Any
    hyper: list
    run_settings: dict[str, Any]
    device: torch.device

    def _state_tensors(self, j: int) -> dict[str, torch.Tensor]:
        """Dictionary j's weights, Adam moments, firing history and target-L0 state, keyed without j."""
        sae, opt = self.saes[j], self.opts[j]
        names = {id(p): n for n, p in sae.named_parameters()}
        tensors = {f"param.{n}": t for n, t in sae.state_dict().items()}
        for p, st in opt.state.items():
            for key, value in st.items():
                tensors[f"adam.{names[id(p)]}.{key}"] = torch.as_tensor(value)
        tensors["last_fired"] = self.last_fired[j]
        if self.controllers[j] is not None:
            tensors.update({f"target_l0.{k}": v for k, v in self.controllers[j].state_dict().items()})
        tensors["fire_rate"] = self.fire_rate[j]
        return tensors

    def _load_state_tensors(self, j: int, tensors: dict[str, torch.Tensor]) -> None:
        sae, opt = self.saes[j], self.opts[j]
        sae.load_state_dict({n: tensors[f"param.{n}"] for n in sae.state_dict()})
        for n, p in sae.named_parameters():
            keys = [k for k in tensors if k.startswith(f"adam.{n}.")]
            if keys:
                opt.state[p] = {k.rsplit(".", 1)[1]: tensors[k].to(self.device) for k in keys}
        self.last_fired[j] = tensors["last_fired"].to(self.device)
        self.fire_rate[j] = tensors.get("fire_rate", self.fire_rate[j]).to(self.device)
        if self.controllers[j] is not None:
            self.controllers[j].load_state_dict({k[len("target_l0."):]: v for k, v in tensors.items()
                                                 if k.startswith("target_l0.")})

    def _store_state(self) -> dict[str, Any]:
        """The store's position; across ranks every rank's shards' positions, gathered (a collective)."""
        state = self.store.state_dict()
        if self.parallel.world == 1:
            return state
        mine = torch.tensor([self.store.positions[s] for s in self.store.owned], dtype=torch.long,
                            device=self.parallel.device)
        every = self.parallel.gather(mine).tolist()  # [shards, 2]: each rank holds a contiguous block, in order
        return {"shards": self.store.shards, "positions": {str(s): p for s, p in enumerate(every)}}

    def save_checkpoint(self, folder: str | Path) -> None:
        """Weights, Adam moments and firing history in one safetensors file named by the step, then
        state.json pointing at it (both atomic): a crash leaves the previous checkpoint readable.
        Across ranks every rank calls it (the state is gathered) and rank 0 writes."""
        self.parallel.gather_state(self)
        store_state = self._store_state()
        if self.parallel.rank != 0:
            return
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {f"{j}.{k}": v for j in range(len(self.saes)) for k, v in self._state_tensors(j).items()}
        name = f"trainer-{self.step:08d}.safetensors"
        tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
        atomic_write_file(folder / name, lambda tmp: save_file(tensors, tmp))
        state = {"step": self.step, "weights": name, "store": store_state, "scales": self.scales,
                 "configs": [s.cfg.to_dict() for s in self.saes], "settings": self.settings(),
                 "world_size": self.parallel.world, "parallel": self.parallel.mode}
        atomic_write_text(folder / STATE, json_text(state, indent=2))
        for old in folder.glob("trainer-*.safetensors"):
            if old.name != name:
                old.unlink()

    def load_checkpoint(self, folder: str | Path) -> None:
        """Every rank reads the whole checkpoint. Another world size resumes exactly when it divides the
        token stream's shards (the store refuses in one line otherwise)."""
        folder = Path(folder)
        try:
            state = json.loads((folder / STATE).read_text())
            tensors = load_file(str(folder / state["weights"]))
        except FileNotFoundError as e:
            raise CircuitlabError(f"cannot resume from {folder}: {Path(e.filename).name} is missing") from None
        except Exception as e:  # noqa: BLE001
            raise CircuitlabError(f"cannot resume from {folder}: the checkpoint is corrupt ({type(e).__name__}: {e})") from None
        if [s.cfg.to_dict() for s in self.saes] != state["configs"]:
            raise CircuitlabError(f"{folder} holds a checkpoint of other dictionaries; use a new output folder")
        refuse_changed_settings(state.get("settings", {}), self.settings(), folder)
        self.store.load_state_dict(state["store"])
        for j in range(len(self.saes)):
            self._load_state_tensors(j, {k[len(f"{j}."):]: v for k, v in tensors.items() if k.startswith(f"{j}.")})
        self.step, self.scales = int(state["step"]), [tuple(s) for s in state["scales"]]

    def settings(self) -> dict[str, Any]:
        """What decides the result besides the dictionaries' configs: the train settings (each dictionary's own
        included) and run_settings (set by the caller: data, store, model). Saved with a checkpoint; a resume
        with other values is refused."""
        keep = lambda h: {k: v for k, v in dataclasses.asdict(h).items() if k not in NOT_RESULT}  # noqa: E731
        return {"train": [keep(h) for h in self.hyper], **self.run_settings}

    def _interrupted(self, ckpt: Path | None, saved: bool) -> str:
        """What an interrupt leaves and how to go on: the step of the last checkpoint and the command."""
        if ckpt is None:
            return f"stopped at step {self.step}; nothing was saved (no output folder)"
        if saved:
            return interrupted_message(self.step, self.step, ckpt)
        try:
            last = int(json.loads((ckpt / STATE).read_text())["step"])
        except (OSError, ValueError, KeyError):
            last = None
        return interrupted_message(self.step, last, ckpt)


def refuse_changed_settings(saved: dict[str, Any], now: dict[str, Any], folder: Path) -> None:
    """A resume with a setting that changes the result is refused in one line naming it (saved -> now)."""
    changed = []
    for key in sorted(set(saved) | set(now)):
        a, b = saved.get(key), now.get(key)
        if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(isinstance(x, dict) for x in a + b):
            for x, y in zip(a, b):
                changed += [f"{key}.{k} ({x.get(k)!r} -> {y.get(k)!r})" for k in sorted(set(x) | set(y))
                            if x.get(k) != y.get(k)]
        elif isinstance(a, dict) and isinstance(b, dict):
            changed += [f"{key}.{k} ({a.get(k)!r} -> {b.get(k)!r})" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        elif a != b and key in saved:
            changed.append(f"{key} ({a!r} -> {b!r})")
    changed = list(dict.fromkeys(changed))
    if changed:
        raise CircuitlabError(f"cannot resume {folder} with other settings: {', '.join(changed[:4])}"
                              f"{' ...' if len(changed) > 4 else ''}; resume with the settings it started with, "
                              "or start a new run in another folder")
