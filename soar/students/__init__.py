"""Student training: the RLOO trainer (``soar.students.trainer``) and its pure pieces (``soar.students.rloo``)."""

from soar.students.rloo import k3_kl, rloo_advantages, rloo_loss
from soar.students.trainer import RLOOTrainer, StudentResult, batch_indices, run_rl, train_student

__all__ = ["RLOOTrainer", "StudentResult", "batch_indices", "k3_kl", "rloo_advantages", "rloo_loss", "run_rl",
           "train_student"]
