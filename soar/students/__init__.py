"""The students (paper §1.3-1.4): the RLOO trainer (``soar.students.trainer``, also ``soar-rl``) and its
pure pieces (``soar.students.rloo``); where an outer step's g*r students train (``soar.students.pool``:
in-process or a Ray pool; ``soar.students.lockstep``: shared-engine LoRA students); promotion
(``soar.students.promotion``)."""

from soar.students.rloo import k3_kl, rloo_advantages, rloo_loss
from soar.students.trainer import RLOOTrainer, StudentResult, batch_indices, run_rl, train_student

__all__ = ["RLOOTrainer", "StudentResult", "batch_indices", "k3_kl", "rloo_advantages", "rloo_loss", "run_rl",
           "train_student"]
