"""Training: run configs, the trainer, checkpoints, and metrics tracked during training."""
from circuitlab.training.checkpoint import find_checkpoint, load_checkpoint, save_checkpoint
from circuitlab.training.config import RunConfig, TrainConfig
from circuitlab.training.trainer import TrainingDiverged, TrainResult, read_metrics, train

__all__ = ["RunConfig", "TrainConfig", "TrainResult", "TrainingDiverged", "find_checkpoint", "load_checkpoint",
           "read_metrics", "save_checkpoint", "train"]
