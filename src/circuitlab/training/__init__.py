"""Training: run configs, the trainer, checkpoints, and metrics tracked during training."""
from circuitlab.training.checkpoint import (find_checkpoint, load_checkpoint, read_checkpoint_meta, read_trainer_state,
                                            save_checkpoint)
from circuitlab.training.config import RunConfig, TrainConfig
from circuitlab.training.run_log import read_metrics
from circuitlab.training.trainer import TrainingDiverged, TrainingInterrupted, TrainOptions, TrainResult, train

__all__ = ["RunConfig", "TrainConfig", "TrainOptions", "TrainResult", "TrainingDiverged", "TrainingInterrupted",
           "find_checkpoint", "load_checkpoint", "read_checkpoint_meta", "read_metrics", "read_trainer_state", "save_checkpoint", "train"]
