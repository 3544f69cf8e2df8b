"""The RLOO policy that teachers and students share, below both (``soar/__init__.py``'s layer 2): its pure
pieces (``soar.policy.rloo``: advantages, the k3 KL, token log-probs, the loss), the trainer
(``soar.policy.trainer.RLOOTrainer``, with its context distillation in ``soar.policy.distill``) and how a
policy is scored on problems (``soar.policy.scores``, with the ``inner.reward_metric`` registry)."""
