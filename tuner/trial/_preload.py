"""Imported once by the trial forkserver so each trial's child process starts without re-importing."""

import torch  # noqa: F401
import transformers  # noqa: F401
import trl  # noqa: F401
from trl import DPOTrainer, GRPOTrainer, KTOTrainer, RewardTrainer, SFTTrainer  # noqa: F401

import tuner.trial  # noqa: F401
