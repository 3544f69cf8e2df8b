"""fail@k filtering (paper §4): ``run_filter`` finds the problems a model solves 0/k times."""

from soar.filters.failk import band, prob_group_mixed, run_filter, run_filter_stage, split_hard

__all__ = ["band", "prob_group_mixed", "run_filter", "run_filter_stage", "split_hard"]
