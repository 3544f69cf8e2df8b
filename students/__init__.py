"""Student training: the RLOO trainer (``students.trainer``) and its pure pieces (``students.rloo``)."""

from students.rloo import k3_kl, rloo_advantages, rloo_loss
from students.trainer import RLOOTrainer, batch_indices, render_prompt, run_rl

__all__ = ["RLOOTrainer", "batch_indices", "k3_kl", "render_prompt", "rloo_advantages", "rloo_loss", "run_rl"]
