"""The one training recipe of the teacher, the students, prune's recovery and the exits, on Hugging Face Accelerate.

    engine = Engine.create(cfg.engine, output=folder, log=print)   # config.EngineConfig
    with engine.seeded(seed):
        recipe = Recipe(engine, checkpoint=Checkpoints(folder, fingerprint), resume=False)
        for i, phase in enumerate(phases):
            recipe.run(i, phase, module, loss_step, batches, evaluate, make_optimizer)

Accelerate gives the device, the process group (`torchrun` / `accelerate launch`: DDP, gloo on CPU),
backward, gradient clipping, the fp16 gradient scaler and the trackers (TensorBoard, MLflow, W&B); the
loop itself stays here (recipe.py), short and readable, because what it must do is ours: phases that
freeze parameter groups (DDP is re-wrapped per phase, since it records which parameters learn when it is
built), early stopping on the selection split where the model a phase starts from competes too, data
that each rank streams from its own rows (never through a sampler that would load the set), gradient
accumulation, a learning-rate schedule per phase (schedules.py), and checkpoints that a killed run
resumes from at the exact step, with every rank's random state (checkpoints.py).

What a caller provides per phase: the module to train (its forward takes a batch), a loss step
`(module, batch) → (loss, {name: value})`, the epoch's batches, an evaluation `() → {"accuracy": ...}`
on the selection split (or None), and the optimizer over the parameters that learn.

With several processes the caller gives each rank disjoint rows; an epoch ends for every rank when the
first one has run out of batches (at most a batch per rank is left out, as DistributedSampler's
drop_last), so that no rank waits forever in an all-reduce. A loss that is not finite on any rank stops
every rank with a UserError that names the phase, epoch and step.
"""
from transferset.training.checkpoints import CHECKPOINT_FILE, CHECKPOINT_FINGERPRINT, Checkpoints
from transferset.training.engine import TRACK_DIR, TRACK_FILE, Engine, check_engine, launch_help, launched_processes
from transferset.training.recipe import PhaseSpec, PhaseState, Recipe, RecipeState
from transferset.training.schedules import lr_factor

__all__ = ["CHECKPOINT_FILE", "CHECKPOINT_FINGERPRINT", "Checkpoints", "Engine", "PhaseSpec",
           "PhaseState", "Recipe", "RecipeState", "TRACK_DIR", "TRACK_FILE", "check_engine", "launch_help",
           "launched_processes", "lr_factor"]
